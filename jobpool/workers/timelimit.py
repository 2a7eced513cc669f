"""Time limits: an attempt that has run longer than its spec's `timeout` is stopped by whoever watches it.

How long an attempt has run is read from its executor's own record of when it started, never from the
watcher's memory or the row: Docker's `State.StartedAt` of the attempt's container, or for a subprocess job
the start time of its main process (/proc/<pid>/stat, clock ticks since the kernel booted, against
/proc/uptime). So the worker that launched it and a worker that adopted it after the first died compute the
same deadline from the same container; nothing a Redis rollback or an adoption rewrites moves it (the row's
`launched_at` is written again by every `set_container`, the adopter's too); and each attempt has a
container or process of its own, so a new attempt (after a handback, a retry, a crash recovery) gets the
whole limit. Docker's timestamps are compared with this host's clock: the daemon is on a local socket
(jobpool/exits.py reads them the same way).

At the deadline the watcher first marks the attempt (`Store.time_out`, fenced on boot and attempt: whatever
then records its exit, the watcher's finish or the supervisor's reconcile after the watcher died, fails it
as `timeout` or retries it), then stops it as a cancel does: the stop signal, SIGKILL after the stop grace
(workers/watch.py). Only the mark lets the stop go out: a job stopped unmarked would be handed back as an
interrupted attempt and run again. While Redis does not answer, the job runs on past its limit until it
does. docs/architecture.md, "Time and dependencies", "Time limits".
"""

from __future__ import annotations

import logging

from ..errors import NotFound, NotOwner, RedisUnavailable
from .attempt import Attempt
from .executors.base import Handle

log = logging.getLogger("jobpool.worker")

#: How soon a start that could not be read (its daemon did not answer) is read again.
LOOK_AGAIN_SECS = 1.0
#: How soon a mark Redis did not answer, or refused, is sent again.
MARK_AGAIN_SECS = 0.5

#: What `TimeLimit.check` asks of the watcher: nothing yet, stop the job now (it is marked), or heartbeat
#: now (the mark was refused: the row is no longer ours, and the heartbeat's refusal says what to do).
WAIT, STOP, REFUSED = "", "stop", "refused"


def duration(secs: float) -> str:
    """Whole seconds as hours, minutes and seconds, without the leading and trailing zero units: '2h 0m 3s',
    '2h', '1m 30s', '5s'."""
    total = max(0, int(secs))
    parts = [(total // 3600, "h"), (total // 60 % 60, "m"), (total % 60, "s")]
    while len(parts) > 1 and parts[0][0] == 0:
        parts.pop(0)
    while len(parts) > 1 and parts[-1][0] == 0:
        parts.pop()
    return " ".join(f"{n}{unit}" for n, unit in parts)


class TimeLimit:
    """One attempt's time limit as its watcher keeps it. The deadline (on `time.monotonic`) is fixed the
    first time the attempt's start can be read, so the limit costs a job without one nothing, and a job with
    one a single read of its start."""

    def __init__(self, limit_secs: int) -> None:
        self.limit = limit_secs
        #: When the limit runs out (monotonic), once the start was read.
        self.deadline: float | None = None
        #: Marked: its stop is under way, and nothing more is asked of the limit.
        self.marked = False
        self._next_try = 0.0

    @classmethod
    def of(cls, timeout: int | None) -> TimeLimit | None:
        """The limit of a spec's `timeout` (seconds per attempt; None: none)."""
        return None if timeout is None else cls(timeout)

    def over(self, handle: Handle, now: float, read_within: float) -> bool:
        """Whether the attempt has run its limit out at `now` (monotonic). Its start is read once, within
        about `read_within` seconds (the watcher keeps renewing its lease); until it can be, the limit
        waits: a start that cannot be read yet is no evidence that the job ran long."""
        if self.deadline is None:
            if now < self._next_try:
                return False
            ran = handle.ran_for(read_within)
            if ran is None:
                self._next_try = now + LOOK_AGAIN_SECS
                return False
            self.deadline = now + self.limit - ran
        return now >= self.deadline

    def evidence(self, now: float) -> str:
        """What the job's history says of the mark: how long it ran, and its limit."""
        ran = self.limit + (now - self.deadline if self.deadline is not None else 0.0)
        return f"ran {duration(ran)}; its limit is {duration(self.limit)}"

    def check(self, attempt: Attempt, handle: Handle, now: float, read_within: float) -> str:
        """What the watcher does about the limit now: WAIT, STOP (the attempt is marked, by this call or
        before it: by this watcher's earlier call whose reply was lost, or by the watcher it adopted the job
        from) or REFUSED (the row is not ours any more)."""
        if self.marked or not self.over(handle, now, read_within) or now < self._next_try:
            return WAIT
        what = f"job {attempt.job_id} attempt {attempt.attempt}"
        try:
            first = attempt.time_out(self.evidence(now))
        except RedisUnavailable as exc:
            log.warning("%s: past its time limit, but redis did not answer the mark (%s); the job runs on "
                        "until it does", what, exc)
            self._next_try = now + MARK_AGAIN_SECS
            return WAIT
        except (NotOwner, NotFound):
            self._next_try = now + MARK_AGAIN_SECS
            return REFUSED
        self.marked = True
        log.warning("%s: %s%s; stopping it", what, self.evidence(now), "" if first else " (marked before)")
        return STOP
