"""The worker process's runtime: who this boot is, and whether a drain was asked for.

RQ forks a work horse per job; the horse inherits this module's state, which is how the RQ job function
(called with no arguments) finds its pool, its boot id and its settings without passing them through RQ.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field

from ..api import Pool


@dataclass
class Runtime:
    pool: Pool
    boot_id: str
    #: The Docker daemon's identity (jobpool/daemonid.py), established at boot or, if the daemon did not
    #: answer then, before the first claim (workers/entry.py); '' for the subprocess executor.
    daemon_id: str = ""
    #: The Docker API version negotiated once at boot, so each job's client skips the negotiation.
    api_version: str | None = None
    #: Set in the horse when a drain (shutdown) is requested: monotonic time of the request.
    drain_requested_at: float | None = None
    left_running: list[str] = field(default_factory=list)

    def request_drain(self) -> None:
        if self.drain_requested_at is None:
            self.drain_requested_at = time.monotonic()


_current: Runtime | None = None


def install(runtime: Runtime) -> None:
    global _current
    _current = runtime


def current() -> Runtime:
    if _current is None:
        raise RuntimeError("jobpool job functions run only inside a jobpool worker")
    return _current


#: The signal the worker sends its horse to start a drain. SIGTERM sent straight to the horse (a service
#: manager killing the whole process group) means the same.
DRAIN_SIGNAL = signal.SIGUSR1
