"""One Docker daemon as the supervisor (and a worker's inventory thread) asks it: the client, the daemon's
identity, and what a failed ask says.

Asking the daemon what exists (jobpool/supervisor/probes.py, evidence) and stopping or removing containers on
it (jobpool/supervisor/stopper.py, action) share this one client, so a daemon is connected to once and its
outages are seen by both.
"""

from __future__ import annotations

import time
from typing import Any

from ..exits import Outages
from ..fleet import daemonid


def _no_answer(exc: BaseException) -> bool:
    """The daemon is not there to answer (refused, reset mid-answer, a 5xx): only such a failure starts an
    outage window (jobpool/exits.py). A timeout is not one: a slow daemon is still the same daemon."""
    import docker.errors
    import requests.exceptions
    import urllib3.exceptions

    if isinstance(exc, docker.errors.APIError):
        return bool(exc.is_server_error())
    if isinstance(exc, requests.exceptions.Timeout) or any(
            isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in getattr(exc, "args", ())):
        return False
    if isinstance(exc, (requests.exceptions.RequestException, OSError)):
        return True
    # A new client asks the daemon's API version first; the SDK wraps that failure in a DockerException.
    cause = exc.__cause__ or exc.__context__
    return cause is not None and _no_answer(cause)


class DaemonClient:
    """One client of one Docker daemon, kept across sweeps, and the daemon's identity.

    The client is created lazily and dropped after any failure, so a daemon that comes back is found again.
    `api_calls` counts HTTP requests answered by the daemon (for the benchmark and for tests). `outages`
    keeps when this client found its daemon not answering and answering again: the evidence that a
    container's end was recorded by a restart of its daemon (jobpool/exits.py).
    """

    def __init__(self, docker_host: str | None = None, timeout: float = 10.0) -> None:
        self.docker_host = docker_host
        self.timeout = timeout
        self.api_calls = 0
        self._client: Any = None
        self._daemon_id: str | None = None
        self.identity_problem = ""
        self.outages = Outages()

    def _connect(self) -> Any:
        if self._client is None:
            import docker  # imported here: a subprocess-only deployment never needs the SDK loaded

            if self.docker_host:
                # A float timeout works (requests takes one); the SDK says int.
                client = docker.DockerClient(base_url=self.docker_host, timeout=self.timeout)
            else:
                client = docker.from_env(timeout=self.timeout)
            client.api.hooks["response"].append(self._count)
            self._client = client
        return self._client

    def _count(self, response: Any, *args: Any, **kwargs: Any) -> None:
        self.api_calls += 1

    def client(self) -> Any:
        """The Docker client of this daemon (for the supervisor's other asks of it, volumes.py)."""
        return self._connect()

    def daemon_id(self) -> str:
        """The daemon's identity (jobpool/fleet/daemonid.py), established once per client; '' when it cannot
        be (the reason is kept in `identity_problem`). SDK errors asking the daemon propagate."""
        if self._daemon_id is None:
            try:
                self._daemon_id = daemonid.establish(self._connect(), self.docker_host)
                self.identity_problem = ""
            except daemonid.IdentityUnavailable as exc:
                self._daemon_id = ""
                self.identity_problem = str(exc)
        return self._daemon_id

    def same_daemon(self, recorded: str) -> tuple[bool, str]:
        """Whether this daemon is the one an attempt was recorded on (daemonid.same_daemon)."""
        ok, why = daemonid.same_daemon(recorded, self.daemon_id())
        if not ok and self.identity_problem:
            why = f"{why}: {self.identity_problem}"
        return ok, why

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None
                self._daemon_id = None

    def _failure_reason(self, exc: BaseException) -> str:
        where = self.docker_host or "DOCKER_HOST/default socket"
        text = " ".join(str(exc).split())[:300]
        return f"docker daemon at {where} could not be asked ({type(exc).__name__}: {text})"

    def failed(self, exc: BaseException) -> str:
        """After a failed ask: drop the client, note an outage if the daemon did not answer; says why."""
        self.close()
        if _no_answer(exc):
            self.outages.unanswered(time.time())
        return self._failure_reason(exc)
