"""The watcher: launch (or re-attach to) one attempt, keep its lease, act on requests, finish it.

Every write is fenced on (boot, attempt). When a write is refused (`NotOwner`) the row is no longer ours
(evicted, reconciled, adopted by another boot): the watcher stops the container and leaves without writing.
"""

from __future__ import annotations

import logging
import time

from ..attempt import LOG_TAIL_BYTES, Attempt, Requests
from ..errors import Conflict, InvalidState, NotFound, NotOwner, RedisUnavailable
from .executors import Executor, Handle, LaunchError, LaunchUnknown
from .runtime import Runtime

log = logging.getLogger("jobpool.worker")

#: Longest single wait on the job, so a drain request is noticed within this many seconds.
WAIT_SLICE = 0.5
EXIT_TEMPFAIL = 75
#: How long a worker keeps trying to record an exit through a Redis outage before leaving it to the supervisor.
FINISH_RETRY_SECS = 20.0
TERMINAL_STATES = ("succeeded", "failed", "cancelled")
#: Longest pause between two tries of a write while Redis does not answer.
RETRY_MAX_DELAY = 2.0


def watch(rt: Runtime, attempt: Attempt, handle: Handle, executor: Executor, requests: Requests) -> None:
    """Watch a launched attempt until it exits, the row is lost, or a drain deadline passes."""
    settings = rt.pool.settings
    next_beat = time.monotonic() + settings.heartbeat_secs
    kill_at: float | None = None
    drain_deadline: float | None = None
    asked_stop = False
    while True:
        try:
            code = handle.wait(min(WAIT_SLICE, settings.heartbeat_secs))
        except LaunchUnknown as exc:
            # Removed under us (an operator, or the supervisor finishing an orphan): no exit code to record.
            log.warning("job %s attempt %s: %s; leaving the row to the supervisor", attempt.job_id,
                        attempt.attempt, exc)
            return
        if code is not None:
            break
        now = time.monotonic()
        if rt.drain_requested_at is not None and drain_deadline is None:
            drain_deadline = rt.drain_requested_at + settings.drain_timeout_secs
            log.info("job %s: shutdown, asking it to checkpoint and stop", attempt.job_id)
            handle.signal_stop()
        if drain_deadline is not None and now >= drain_deadline:
            log.warning("job %s: still running at the drain deadline; left running", attempt.job_id)
            rt.left_running.append(attempt.job_id)
            return
        if now >= next_beat:
            next_beat = now + settings.heartbeat_secs
            try:
                requests = attempt.heartbeat()
            except (NotOwner, NotFound):  # NotFound: the row itself is gone; nobody can own it now
                if _adopted_elsewhere(rt, attempt):
                    # We stalled past our lease and a live worker took the job over: it is the owner now.
                    log.warning("job %s attempt %s: adopted by another worker; leaving it to that worker",
                                attempt.job_id, attempt.attempt)
                    return
                log.warning("job %s attempt %s: no longer ours; stopping it without writing",
                            attempt.job_id, attempt.attempt)
                handle.signal_stop()
                _stop_within(handle, settings.stop_grace_secs)
                return
            except RedisUnavailable as exc:
                log.warning("job %s: heartbeat failed (%s); will retry", attempt.job_id, exc)
        if (requests.cancel or requests.pause) and not asked_stop:
            log.info("job %s: %s requested; stopping it", attempt.job_id, "cancel" if requests.cancel else "pause")
            handle.signal_stop()
            asked_stop = True
            kill_at = now + settings.stop_grace_secs
        if kill_at is not None and now >= kill_at and drain_deadline is None:
            handle.kill()
            kill_at = None
    _finish(rt, attempt, handle, executor, "interrupted" if drain_deadline is not None else "exit", code)


def _retrying(call, within: float | None = None, what: str = "a write"):  # noqa: ANN001, ANN202 - local
    """Send a write until Redis answers it. A lost reply (a connection reset after the script ran) and an
    outage both read as `RedisUnavailable`, and every worker write is safe to send again: the fenced writes
    are idempotent, and a claim sent again by the same `Attempt` succeeds again. A refusal (`NotOwner`, ...)
    is an answer and is raised. With `within`, give up after that many seconds and raise the last error;
    without, only the worker's force stop (it kills this horse) ends the wait."""
    deadline = None if within is None else time.monotonic() + within
    delay, tries = 0.1, 0
    while True:
        try:
            result = call()
        except RedisUnavailable as exc:
            tries += 1
            if deadline is not None and time.monotonic() + delay > deadline:
                raise
            if tries == 1:
                log.warning("%s: redis did not answer (%s); retrying until it does", what, exc)
            time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_DELAY)
            continue
        if tries:
            log.info("%s: done after %d retries", what, tries)
        return result


def _adopted_elsewhere(rt: Runtime, attempt: Attempt) -> bool:
    """The row still runs this very attempt, under another boot: it was adopted, not ended."""
    try:
        row = rt.pool.get(attempt.job_id)
    except (NotFound, RedisUnavailable):
        return False
    return row.state.value == "running" and row.attempt == attempt.attempt and row.owner_boot != attempt.boot_id


def _stop_within(handle: Handle, grace: float) -> None:
    if grace <= 0 or handle.wait(grace) is None:
        handle.kill()


def _finish(rt: Runtime, attempt: Attempt, handle: Handle, executor: Executor, kind: str, code: int) -> None:
    tail = handle.log_tail(LOG_TAIL_BYTES)
    try:
        state = _retrying(lambda: attempt.finish(kind, code, log_tail=tail), FINISH_RETRY_SECS)
    except RedisUnavailable as exc:
        # The container stays, exited: the supervisor finishes the row from its exit code.
        log.warning("job %s attempt %s: could not record exit %s (%s); leaving it to the supervisor",
                    attempt.job_id, attempt.attempt, code, exc)
        return
    except (NotOwner, NotFound):
        log.warning("job %s attempt %s: finished, but the row is no longer ours; not recorded",
                    attempt.job_id, attempt.attempt)
        if not _adopted_elsewhere(rt, attempt):
            handle.remove()  # an adopter would still need the container to read its exit code
        return
    log.info("job %s attempt %s: exit %s -> %s", attempt.job_id, attempt.attempt, code, state)
    handle.remove()
    if state in TERMINAL_STATES:
        executor.remove_checkpoint(rt.pool.keys.pool, attempt.job_id)


def launch_and_watch(rt: Runtime, attempt: Attempt, executor: Executor, launch_fn) -> None:
    """Launch through `launch_fn()`, record what was launched, then watch it."""
    what = f"job {attempt.job_id} attempt {attempt.attempt}"
    try:
        handle = launch_fn()
    except LaunchError as exc:
        log.warning("job %s: could not launch: %s", attempt.job_id, exc.reason)
        reason = exc.reason
        try:
            _retrying(lambda: attempt.finish("error", reason=reason),
                      what=f"{what}: recording its launch failure")
        except (NotOwner, NotFound):
            return
        executor.remove_checkpoint(rt.pool.keys.pool, attempt.job_id)
        return
    except LaunchUnknown as exc:
        # It may or may not run: keep the slot (write nothing) and let the supervisor find out.
        log.warning("job %s: launch outcome unknown (%s); leaving it to the supervisor", attempt.job_id, exc)
        return
    try:
        # Until this is recorded the supervisor cannot find a subprocess job, so it is sent until answered.
        _retrying(lambda: attempt.set_container(handle.container_id, handle.daemon_id, handle.identity),
                  what=f"{what}: recording what was launched")
    except (NotOwner, NotFound):
        log.warning("job %s: lost the row while launching; stopping it", attempt.job_id)
        handle.kill()
        return
    watch(rt, attempt, handle, executor, Requests(False, False))


def quietly_refused(exc: Exception) -> bool:
    """Duplicate or stale deliveries are normal under at-least-once dispatch: refuse them without noise."""
    return isinstance(exc, (NotOwner, Conflict, InvalidState, NotFound))
