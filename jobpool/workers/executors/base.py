"""What a worker needs from an executor: launch a job, wait for it, stop it, read its output.

The watcher (workers/watch.py) is written against these two small protocols, so the Docker and the
subprocess executor share one claim -> launch -> watch -> finish path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...contract import LABEL_ATTEMPT, LABEL_BOOT, LABEL_JOB, LABEL_POOL
from ...exits import Ending
from ...spec import JobSpec

#: Where a job finds its checkpoint directory inside a container.
CONTAINER_CHECKPOINT_DIR = "/jobpool/checkpoint"


class LaunchError(Exception):
    """The job could not be started, and it is known that nothing of it runs (image missing, daemon said no).

    `reason` becomes the job's error_reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class LaunchUnknown(Exception):
    """Launching failed in a way that leaves it unknown whether the job runs (daemon unreachable mid-launch).

    The watcher then writes nothing: the row keeps its slot until the supervisor has evidence."""


class NotLaunched(Exception):
    """The launch was given up before the job could run, and it is known that nothing of it runs: the row
    stopped being ours while the launch was in flight (the fence refused), or the container was removed
    before its start (the supervisor, judging the attempt, removes a never-started container first).

    The watcher writes nothing: the row is someone else's, or the supervisor's verdict is on its way."""


class HostFault(Exception):
    """The worker's own host failed before anything of the job was sent to run, and it is known that nothing
    of it runs: its checkpoint root or state directory could not be written (a file system remounted
    read-only, full), or its Docker daemon refused the connection before any request reached it.

    Not the job's fault, so it spends none of the job's recovery budget: the watcher hands the job back to
    its place in the queue (scripts/finish.lua, kind 'handback'), and the worker holds its claims until its
    host passes its check again (workers/hostcheck.py). `what` names the part of the host that failed
    (`CHECKPOINT_ROOT`, `STATE_DIR` or `DOCKER`, below); `cause` says how, for the log and the job's
    history."""

    def __init__(self, what: str, cause: str) -> None:
        super().__init__(f"{what}: {cause}")
        self.what, self.cause = what, cause


#: What a `HostFault` names.
CHECKPOINT_ROOT, STATE_DIR, DOCKER = "checkpoint root", "state directory", "docker daemon"


#: The fence of a launch: called with what was prepared (a created container's id and its daemon's
#: identity; ("", "") when nothing can be named yet, as for a process not yet started), which it records.
Fence = Callable[[str, str], None]


def no_fence(container_id: str = "", daemon_id: str = "") -> None:
    """The fence of a launch that has nobody to ask (tests, tools): always go on."""


@dataclass(frozen=True)
class Launch:
    """What one attempt is launched as."""

    pool: str
    job_id: str
    attempt: int
    boot_id: str
    spec: JobSpec
    env: dict[str, str] = field(default_factory=dict)

    def labels(self) -> dict[str, str]:
        return {LABEL_POOL: self.pool, LABEL_JOB: self.job_id, LABEL_ATTEMPT: str(self.attempt),
                LABEL_BOOT: self.boot_id}


@dataclass(frozen=True)
class Output:
    """What one read of a job's output returned: `text`, oldest first, and the `position` after it. What
    the read skipped to stay within its bounds: `dropped` bytes, and `more`: lines beyond the most one read
    takes were skipped (how many bytes they held is not known)."""

    text: bytes
    position: str
    dropped: int = 0
    more: bool = False


def newest(text: bytes, budget: int) -> tuple[bytes, int]:
    """The newest `budget` bytes of `text` and how many bytes before them were left out; when some were, the
    kept part starts at a line's start (the first newline in it, if any), so the reader's lines are whole."""
    skip = max(0, len(text) - budget)
    if skip:
        cut = text.find(b"\n", skip - 1)  # the byte before the kept part: a newline keeps it whole
        if 0 <= cut < len(text) - 1:
            skip = cut + 1
    return text[skip:], skip


class Handle(Protocol):
    """A launched job."""

    #: What set_container records: container id and daemon id, or a process identity.
    container_id: str
    daemon_id: str
    identity: dict[str, Any] | None

    def wait(self, timeout: float) -> Ending | None:
        """How it ended (exit code, and what ended it: jobpool/exits.py) once it has; None while it runs, or
        while that is unknown (its daemon does not answer). Returns within about `timeout` seconds either
        way, so the watcher keeps renewing its lease; raises `LaunchUnknown` when it was removed."""

    def ran_for(self, timeout: float) -> float | None:
        """Seconds since the job started, from its executor's own record of the start (Docker's
        `State.StartedAt`, a process's start time in /proc), so every watcher of the attempt reads the same
        (workers/timelimit.py); None while that cannot be read (its daemon does not answer within about
        `timeout` seconds)."""

    def signal_stop(self) -> None:
        """Send the stop signal (SIGTERM): "checkpoint and stop at the next unit-of-work boundary"."""

    def kill(self) -> None:
        """SIGKILL: the grace period is over."""

    def log_tail(self, max_bytes: int) -> bytes:
        """The last `max_bytes` of the job's output."""

    def read_output(self, position: str, budget: int, lines: int, timeout: float) -> Output | None:
        """What the job printed after `position` ('' for its start; a token this method returned), of which
        at most the newest `budget` bytes (and, where the executor reads by messages, `lines` of them), for
        its live log (workers/livelog.py); None when it cannot be read now (its daemon does not answer within
        about `timeout` seconds). Bounded work whatever the job prints: what is skipped is said in the
        `Output`."""

    def remove(self) -> None:
        """Remove what is left of this attempt once its exit code is recorded."""


class Executor(Protocol):
    name: str

    def launch(self, launch: Launch, fence: Fence = no_fence) -> Handle:
        """Start the job. `fence(container_id, daemon_id)` is called after everything slow (the container is
        created) and just before the job can run, with what it can already record: it raises `NotLaunched`
        when the attempt is no longer ours, and the executor then removes what it prepared and lets
        `NotLaunched` through. A launch may outlast the lease, so only a check this late proves the row
        still ours when the job starts."""

    def attach(self, pool: str, job_id: str, attempt: int, container_id: str) -> Handle | None:
        """Re-attach to a running attempt (adoption); None when it is not there or cannot be attached."""

    def remove_checkpoint(self, pool: str, job_id: str) -> None:
        """Drop the job's checkpoint once the job is terminal."""

    def close(self) -> None: ...
