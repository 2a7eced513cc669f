"""Docker executor: each attempt is a labelled container, found again by label, never by a pid.

Containers are not auto-removed, so an exit code outlives the worker that watched it; the container is
removed only after `finish` has recorded it (by the worker's main process, off the handoff path:
workers/cleanup.py). Each job has one checkpoint volume shared by its attempts, or, with a checkpoint root on
storage every host shares (Settings.checkpoint_root), one directory there.

Everything here uses the SDK's low-level client by container id: the high-level `containers.create` reads
every container back with a second request (an inspect) that a launch does not need.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

import docker
import docker.errors
import requests.exceptions
import urllib3.exceptions

from ... import dockerclient
from ...contract import ENV_CHECKPOINT_DIR, LABEL_ATTEMPT, LABEL_JOB, LABEL_POOL
from ...exits import (
    EXIT_SIGKILL,
    OOM_EVENT_GRACE_SECS,
    Ending,
    Outages,
    container_events,
    docker_time,
    ending,
    killed_by_removal,
)
from ...fleet import daemonid
from .base import (
    CHECKPOINT_ROOT,
    CONTAINER_CHECKPOINT_DIR,
    DOCKER,
    Fence,
    HostFault,
    Launch,
    LaunchError,
    LaunchUnknown,
    NotLaunched,
    Output,
    no_fence,
)
from .dockerlogs import read_logs, read_output
from .refusals import create_refused, names_the_spec, words_of

log = logging.getLogger(__name__)

#: The first pause before asking again a daemon that did not answer; it doubles up to the watcher's slice
#: (`wait`'s timeout), so the lease is renewed on time and a restart is noticed within one slice.
NO_ANSWER_FIRST_DELAY = 0.05

_UNREACHABLE = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError)


def _never_connected(exc: BaseException) -> OSError | None:
    """The connect's own error when a request failed because no connection to the daemon could be made (its
    socket missing, or nothing listening on it), else None. Then not a byte of the request reached the daemon:
    the SDK's adapter never retries (urllib3's `Retry(total=0)`), so a refused or missing socket is the one
    connection it tried, and a send on a connection once made fails otherwise (reset, broken pipe,
    timeout)."""
    seen: set[int] = set()
    stack: list[object] = [exc]
    while stack:
        err = stack.pop()
        if not isinstance(err, BaseException) or id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, (ConnectionRefusedError, FileNotFoundError)):
            return err
        stack += [err.__cause__, err.__context__, getattr(err, "reason", None), *err.args]
    return None


def checkpoint_volume(pool: str, job_id: str) -> str:
    return f"jobpool-ckpt-{pool}-{job_id}"


def container_name(pool: str, job_id: str, attempt: int) -> str:
    return f"jobpool-{pool}-{job_id}-a{attempt}"


def _timed_out(exc: BaseException) -> bool:
    """A request that got no answer within its own timeout: for a wait, the container still runs; for a
    daemon starting up (it holds requests until it serves), not yet an answer. The SDK reports a read
    timeout on its unix socket as a ConnectionError wrapping urllib3's ReadTimeoutError."""
    if isinstance(exc, requests.exceptions.Timeout):
        return True
    return isinstance(exc, requests.exceptions.ConnectionError) and any(
        isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args)


#: Errors talking to the daemon that are no answer about the container (refused, reset mid-answer as when
#: dockerd is killed under a wait, a 5xx): while they last, how the container is is unknown.
_NO_ANSWER = (requests.exceptions.RequestException, docker.errors.DockerException, OSError)


@contextlib.contextmanager
def _bounded(api: Any, secs: float) -> Iterator[None]:
    """Requests of `api` time out after `secs`: a daemon starting up holds them until it serves, and the
    watcher must keep renewing its lease meanwhile. Only the handle's own client, used by one thread."""
    saved, api.timeout = api.timeout, max(secs, 0.05)
    try:
        yield
    finally:
        api.timeout = saved


class DockerHandle:
    """One attempt's container. While its daemon does not answer, `wait` keeps answering "not ended" (the
    job is kept, its lease renewed by the watcher) and asks again with a bounded backoff; when the daemon
    answers, it reads how the container is, and how it ended (jobpool/exits.py: the outage window it saw
    is the evidence that tells an exit lost in a daemon restart from the job's own)."""

    def __init__(self, client: docker.DockerClient, container_id: str, daemon_id: str,
                 started: float | None = None) -> None:
        self._client = client
        self._api = client.api
        self.container_id: str = container_id
        self.daemon_id = daemon_id
        self.identity: dict[str, Any] | None = None
        self.outages = Outages()
        self._delay = NO_ANSWER_FIRST_DELAY
        #: The container's `State.StartedAt` (epoch seconds), once read.
        self._started = started

    def ran_for(self, timeout: float) -> float | None:
        if self._started is None:
            try:
                with _bounded(self._api, timeout):
                    state = self._api.inspect_container(self.container_id).get("State") or {}
            except (docker.errors.NotFound, *_NO_ANSWER):
                return None  # gone (the wait says so) or no answer: no start to measure from yet
            self._started = docker_time(state.get("StartedAt"))  # None while never started
            if self._started is None:
                return None
        return max(0.0, time.time() - self._started)

    def wait(self, timeout: float) -> Ending | None:
        if not self.outages.ongoing:
            try:
                waited = self._api.wait(self.container_id, timeout=timeout)
            except docker.errors.NotFound:
                raise LaunchUnknown("container vanished") from None
            except _NO_ANSWER as exc:
                if _timed_out(exc):
                    return None  # still running
                self._no_answer(exc, timeout)
                return None
            if waited.get("StatusCode") == 0 and not waited.get("Error"):
                # Exit 0 is success whatever else the inspect would say (exits.ending): no need to ask.
                return Ending(0)
        # It ended non-zero, or its daemon was away: read how the container is now, in one bounded inspect.
        return self._look(timeout)

    def _look(self, timeout: float) -> Ending | None:
        api = self._client.api
        try:
            with _bounded(api, timeout):
                state = api.inspect_container(self.container_id).get("State") or {}
            if state.get("Running") or state.get("Paused") or state.get("Restarting"):
                self._answered("still running")
                return None
            self._answered("ended")
            if killed_by_removal(state):
                raise LaunchUnknown("container removed while it ran (killed by docker rm -f, its removal "
                                    "under way)")
            with _bounded(api, timeout + OOM_EVENT_GRACE_SECS):
                seen: set[str] = set()
                if state.get("ExitCode") == EXIT_SIGKILL and state.get("OOMKilled") is not True:
                    # SIGKILLed: by the OOM killer (its event may come after the exit), or by a removal
                    # under the job (`docker rm -f`: kill, then destroy): neither is the job's own exit.
                    seen = container_events(api, self.container_id, state, ("oom", "destroy"),
                                            OOM_EVENT_GRACE_SECS)
                if "destroy" in seen and "oom" not in seen:
                    raise LaunchUnknown("container removed while it ran (killed, then destroyed: rm -f)")
                return ending(state, self.outages, lambda: api.info().get("LiveRestoreEnabled") is not False,
                              lambda: "oom" in seen)
        except docker.errors.NotFound:
            raise LaunchUnknown("container vanished") from None
        except _NO_ANSWER as exc:
            if _timed_out(exc):
                return None  # a daemon starting up: no answer yet, and no proof that it is gone
            self._no_answer(exc, timeout)
            return None

    def _no_answer(self, exc: BaseException, timeout: float) -> None:
        if not self.outages.ongoing:
            log.warning("container %s: its docker daemon did not answer (%s: %s); keeping the job and "
                        "watching until it answers", self.container_id[:12], type(exc).__name__, exc)
        self.outages.unanswered(time.time())
        time.sleep(min(self._delay, timeout))
        self._delay = min(self._delay * 2, timeout)

    def _answered(self, how: str) -> None:
        if self.outages.ongoing:
            since = self.outages.lost_at or time.time()
            log.warning("container %s: its docker daemon answers again (%.1fs after it last did not); %s",
                        self.container_id[:12], time.time() - since, how)
        self.outages.answered(time.time())
        self._delay = NO_ANSWER_FIRST_DELAY

    def signal_stop(self) -> None:
        try:
            self._api.kill(self.container_id, signal="SIGTERM")
        except _NO_ANSWER as exc:
            log.warning("could not signal container %s: %s", self.container_id[:12], exc)

    def kill(self) -> None:
        try:
            self._api.kill(self.container_id, signal="SIGKILL")
        except _NO_ANSWER as exc:
            log.warning("could not kill container %s: %s", self.container_id[:12], exc)

    def log_tail(self, max_bytes: int) -> bytes:
        try:
            return read_logs(self._api, self.container_id, tail=4000, max_bytes=max_bytes)
        except _NO_ANSWER as exc:
            return f"[jobpool: logs unavailable: {exc}]".encode()

    def read_output(self, position: str, budget: int, lines: int, timeout: float) -> Output | None:
        try:
            return read_output(self._api, self.container_id, position, budget, lines, timeout)
        except _NO_ANSWER:
            return None  # no answer, or gone: the watcher learns which from its wait

    def remove(self) -> None:
        remove_container(self._api, self.container_id)


#: How long a removal waits for another one of the same container (Docker's 409 "removal ... is already in
#: progress") to end, before it leaves what follows (the job's checkpoint volume) to the leftover passes.
REMOVAL_IN_PROGRESS_WAIT_SECS = 10.0


def remove_container(api: Any, container_id: str) -> bool:
    """Remove an attempt's container (its exit is recorded, or nothing will record it); True once it is gone.
    A removal already under way by someone else (the inventory publisher's clean-up, the supervisor's
    leftover pass) is as good as this one: it is waited for, so that the caller's clean-up after it (the
    checkpoint volume, which Docker refuses to remove while a container holds it) still happens. A removal
    that fails is logged and left: the supervisor removes leftover containers of ended attempts
    (supervisor/volumes.py)."""
    try:
        api.remove_container(container_id, force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code == HTTPStatus.CONFLICT and "in progress" in str(exc.explanation or exc):
            return _gone_within(api, container_id, REMOVAL_IN_PROGRESS_WAIT_SECS)
        log.warning("could not remove container %s: %s", container_id[:12], exc)
        return False
    except _NO_ANSWER as exc:
        log.warning("could not remove container %s: %s", container_id[:12], exc)
        return False
    return True


def _gone_within(api: Any, container_id: str, secs: float) -> bool:
    """Whether the container is gone within `secs` (another removal of it is under way)."""
    deadline = time.monotonic() + secs
    while True:
        try:
            api.inspect_container(container_id)
        except docker.errors.NotFound:
            return True
        except _NO_ANSWER as exc:
            log.warning("could not see container %s go: %s", container_id[:12], exc)
            return False
        if time.monotonic() >= deadline:
            log.warning("container %s: another removal of it still runs after %.0fs", container_id[:12], secs)
            return False
        time.sleep(0.05)


class DockerExecutor:
    name = "docker"

    def __init__(self, client: docker.DockerClient | None = None, daemon_id: str = "",
                 api_version: str | None = None, checkpoint_root: str = "") -> None:
        # A known API version skips the per-client GET /version (a fifth of a handoff); proxies from the
        # environment never apply to the daemon's socket, and reading them costs every request.
        self.client = client or dockerclient.shared(docker.from_env(version=api_version or "auto"))
        self.client.api.trust_env = False
        self._daemon_id: str | None = daemon_id or None
        #: Settings.checkpoint_root: checkpoints on storage every host shares, so no daemon holds them.
        self.checkpoint_root = checkpoint_root

    def checkpoint_path(self, pool: str, job_id: str) -> str:
        return os.path.join(self.checkpoint_root, pool, job_id)

    @property
    def api_version(self) -> str:
        return str(self.client.api.api_version)

    def daemon_id(self) -> str:
        """The daemon's identity (jobpool/fleet/daemonid.py), recorded at claim; raises `IdentityUnavailable`
        (or the SDK's error) when it cannot be established, so nothing is launched without it."""
        if self._daemon_id is None:
            self._daemon_id = daemonid.establish(self.client)
        return self._daemon_id

    def _checkpoint_mount(self, launch: Launch) -> docker.types.Mount:
        """The job's checkpoint volume, created by the container create itself when it is not there yet; or,
        under a shared checkpoint root, its directory there, made here first (Docker refuses to bind a path
        that does not exist). The root is the same path on every host and in this worker's filesystem."""
        if self.checkpoint_root:
            path = self.checkpoint_path(launch.pool, launch.job_id)
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as exc:  # the host's file system (read-only, full, gone): nothing is sent yet
                raise HostFault(CHECKPOINT_ROOT, f"cannot make {path}: {exc}") from None
            # The directory of an earlier attempt is found even on a file system remounted read-only (mkdir
            # answers "exists" first); a job started there could not write its checkpoint.
            if not os.access(path, os.W_OK):
                raise HostFault(CHECKPOINT_ROOT, f"{path} is not writable (a read-only file system?)")
            return docker.types.Mount(CONTAINER_CHECKPOINT_DIR, path, type="bind")
        return docker.types.Mount(CONTAINER_CHECKPOINT_DIR, checkpoint_volume(launch.pool, launch.job_id),
                                  type="volume", labels={LABEL_POOL: launch.pool, LABEL_JOB: launch.job_id})

    def _create_args(self, launch: Launch) -> dict[str, Any]:
        """The low-level `create_container` arguments of an attempt (the SDK's own split of the high-level
        `containers.create` keywords into the container's config and its host config)."""
        spec = launch.spec
        env = {**spec.env, **launch.env}
        if spec.checkpoint:
            env[ENV_CHECKPOINT_DIR] = CONTAINER_CHECKPOINT_DIR
        binds: dict[str, dict[str, str]] = {}
        for m in spec.mounts:
            source, target, *mode = m.split(":")
            binds[source] = {"bind": target, "mode": mode[0] if mode else "rw"}
        host_config: dict[str, Any] = {"auto_remove": False, "network_mode": spec.network, "init": spec.init}
        if spec.checkpoint:
            host_config["mounts"] = [self._checkpoint_mount(launch)]
        if binds:
            host_config["binds"] = binds
        if spec.cpus:
            host_config["nano_cpus"] = int(spec.cpus * 1e9)
        if spec.memory:
            host_config["mem_limit"] = spec.memory
        args: dict[str, Any] = {
            "command": list(spec.command), "environment": env, "labels": {**spec.labels, **launch.labels()},
            "name": container_name(launch.pool, launch.job_id, launch.attempt), "stop_signal": "SIGTERM",
            "host_config": self.client.api.create_host_config(**host_config),
        }
        if binds:
            args["volumes"] = [b["bind"] for b in binds.values()]
        if spec.workdir:
            args["working_dir"] = spec.workdir
        if spec.user:
            args["user"] = spec.user
        return args

    def launch(self, launch: Launch, fence: Fence = no_fence) -> DockerHandle:
        """Create, fence, start: never `run`, which pulls a missing image (jobs must not reach registries),
        and never start after a create without asking the fence (a create can outlast the lease); the fence
        is given the created container, which it records. With the spec's `init` (the default) the daemon's
        init (tini) is PID 1, so the command gets the stop signal as it would outside a container (see
        JobSpec.init in jobpool/spec.py)."""
        spec = launch.spec
        api = self.client.api
        args = self._create_args(launch)  # a HostFault here comes before anything is sent to the daemon
        try:
            container_id = str(api.create_container(spec.image, **args)["Id"])
        except docker.errors.ImageNotFound as exc:
            raise LaunchError(f"image_not_found: {spec.image}: {exc.explanation or exc}") from None
        except docker.errors.NotFound as exc:
            raise LaunchError(f"launch_failed: {exc.explanation or exc}") from None
        except docker.errors.APIError as exc:
            verdict = create_refused(exc, spec)
            if isinstance(verdict, LaunchError) and not self._gone_by_name(launch):
                # A spec the daemon refused after all the same may have left its container: only a gone one
                # lets the slot go.
                raise LaunchUnknown(f"{verdict} (and its container could not be removed)") from None
            raise verdict from None
        except _UNREACHABLE as exc:
            refused = _never_connected(exc)
            if refused is not None:  # the create never reached the daemon: nothing of the job exists
                raise HostFault(DOCKER, f"no connection for the create ({refused})") from None
            # It may have been sent and the answer lost: the container may exist, and run if started.
            raise LaunchUnknown(f"docker daemon unreachable during create: {exc}") from None
        try:
            daemon = self.daemon_id()
            fence(container_id, daemon)
        except BaseException:
            self._remove_created(container_id)
            raise
        try:
            api.start(container_id)
        except docker.errors.APIError as exc:
            raise self._start_refused(exc, container_id, spec) from None
        except _UNREACHABLE as exc:
            raise LaunchUnknown(f"docker daemon unreachable during start: {exc}") from None
        return DockerHandle(self.client, container_id, daemon)

    def _start_refused(self, exc: docker.errors.APIError, container_id: str, spec: Any) -> Exception:
        """What a start the daemon answered with an error means for the attempt. A 404 names either the
        container (removed before it could start: nothing runs) or something the spec names (a network the
        daemon does not have): the container being still there tells which. Any refusal may still have left
        something running, so only a container known to be gone lets the slot go; then a refusal of the spec
        (a 4xx, or a 5xx naming the spec) fails the job at once, and any other 5xx (a daemon restarted just
        before: "failed to update store for object type *libnetwork.endpoint") is a crash, recovered on the
        job's budget by the sweep."""
        words = words_of(exc)
        if isinstance(exc, docker.errors.NotFound) and not self._exists(container_id):
            return NotLaunched("its container was removed before it could start")
        if not self._remove_created(container_id):
            return LaunchUnknown(f"start failed ({words}) and its container could not be removed")
        if exc.is_server_error() and not names_the_spec(words, spec):
            # The daemon's own fault, or the job's in words that do not name its spec ("container init was
            # OOM-killed"): nothing runs, but which it was is unknown. A crash's answer, then: the slot stays,
            # the sweep finds nothing and spends a unit of recovery budget, so it is bounded (a handback,
            # which spends none, would hand a job the daemon always refuses back for ever).
            return LaunchUnknown(f"the daemon failed the start ({words}); its container was removed")
        return LaunchError(f"launch_failed: {words}")

    def _exists(self, container_id: str) -> bool:
        """Whether the container is still there; True when the daemon cannot tell (unknown keeps it)."""
        try:
            self.client.api.inspect_container(container_id)
        except docker.errors.NotFound:
            return False
        except (docker.errors.APIError, *_UNREACHABLE):
            return True
        return True

    def _gone_by_name(self, launch: Launch) -> bool:
        """After a create refused: no container of this attempt's name is left (one that is gets removed)."""
        name = container_name(launch.pool, launch.job_id, launch.attempt)
        try:
            found = self.client.api.inspect_container(name)
        except docker.errors.NotFound:
            return True
        except (docker.errors.APIError, *_UNREACHABLE):
            return False
        return self._remove_created(str(found["Id"]))

    def _remove_created(self, container_id: str) -> bool:
        """Remove the container this launch created, so no one mistakes it for work (and a late start cannot
        run it); True once it is gone. Only that container, by id: a name may belong to another launch."""
        try:
            self.client.api.remove_container(container_id, force=True)
        except docker.errors.NotFound:
            pass
        except (docker.errors.APIError, *_UNREACHABLE) as exc:
            # Left created: the supervisor removes a never-started container before it judges the attempt.
            log.warning("could not remove created container %s: %s", container_id[:12], exc)
            return False
        return True

    def attach(self, pool: str, job_id: str, attempt: int, container_id: str) -> DockerHandle | None:
        try:
            if container_id:
                container = self.client.containers.get(container_id)
            else:
                found = self.client.containers.list(all=True, filters={"label": [
                    f"{LABEL_POOL}={pool}", f"{LABEL_JOB}={job_id}", f"{LABEL_ATTEMPT}={attempt}"]})
                if not found:
                    return None
                container = found[0]
        except docker.errors.NotFound:
            return None
        labels = container.labels or {}
        if labels.get(LABEL_JOB) != job_id or labels.get(LABEL_ATTEMPT) != str(attempt):
            return None
        started = docker_time((container.attrs.get("State") or {}).get("StartedAt"))
        return DockerHandle(self.client, str(container.id), self.daemon_id(), started)

    def remove_checkpoint(self, pool: str, job_id: str) -> None:
        if self.checkpoint_root:
            shutil.rmtree(self.checkpoint_path(pool, job_id), ignore_errors=True)
            return
        try:
            self.client.api.remove_volume(checkpoint_volume(pool, job_id), force=True)
        except docker.errors.NotFound:
            pass
        except (docker.errors.APIError, *_UNREACHABLE) as exc:
            log.warning("could not remove checkpoint volume of %s: %s", job_id, exc)

    def close(self) -> None:
        self.client.close()
