"""The watcher: launch (or re-attach to) one attempt, keep its lease, act on requests, finish it.

Every write is fenced on (boot, attempt). When a heartbeat is refused (`NotOwner`) the row is no longer
ours (evicted, reconciled, adopted, or Redis lost our claim): the watcher leaves its container to another
worker only on proof that that worker re-attached to it, claims the attempt back when Redis hands it out
unclaimed again, and otherwise stops and removes the container and leaves without writing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import redis

from ..errors import Conflict, InvalidState, JobpoolError, NotFound, NotOwner, RedisUnavailable
from ..exits import CRASHED, OOM, Ending
from ..models import Job
from ..store.replies import Requests
from .attempt import LOG_TAIL_BYTES, Attempt
from .executors import Executor, Handle, LaunchError, LaunchUnknown
from .executors.base import Fence, HostFault, NotLaunched
from .launchlease import LaunchLease
from .livelog import LiveLog
from .runtime import Runtime
from .timelimit import REFUSED, STOP, TimeLimit

log = logging.getLogger("jobpool.worker")

#: Longest single wait on the job, so a drain request is noticed within this many seconds.
WAIT_SLICE = 0.5
#: A start that returns this long after the fence before it is followed by a fenced heartbeat at once, not
#: one heartbeat later: the row may have been lost meanwhile (a Redis that lost its last writes while the
#: start was in flight), and a job started for a lost row must be stopped before it runs as one too many.
START_REFENCE_SECS = 1.0
#: How long a bounded write retry lasts before it gives up (an exit code is never given up: see `_finish`).
FINISH_RETRY_SECS = 20.0
TERMINAL_STATES = ("succeeded", "failed", "cancelled")
#: Longest pause between two tries of a write while Redis does not answer: short, because after an outage
#: every lease has lapsed and the worker's write should land before a sweep judges the row without it.
RETRY_MAX_DELAY = 0.5


def watch(rt: Runtime, attempt: Attempt, handle: Handle, executor: Executor, requests: Requests,
          beat_now: bool = False) -> None:
    """Watch a launched attempt until it exits, the row is lost, or a drain deadline passes. `beat_now`: the
    first heartbeat goes at once (the row may have been lost while the launch went on)."""
    if rt.job_launched is not None:
        rt.job_launched()  # it runs, and is recorded: the worker may fork its next standby
    live = LiveLog(attempt, handle).start()
    ended = _watch(rt, attempt, handle, requests, beat_now, live)
    if ended is None:
        live.close(last=False)  # the attempt goes on, or is someone else's: an adopter goes on sending
        return
    _finish(rt, attempt, handle, executor, *ended, live)


def _watch(rt: Runtime, attempt: Attempt, handle: Handle, requests: Requests,
           beat_now: bool, live: LiveLog) -> tuple[Ending, bool] | None:
    """The watch loop of `watch`: how the attempt ended and whether a stop was asked of it, or None when
    the watcher leaves it (the row lost, the drain deadline passed, its container removed)."""
    settings = rt.store.settings
    next_beat = time.monotonic() + (0.0 if beat_now else settings.heartbeat_secs)
    stop = _Stop()
    drain_deadline: float | None = None
    limit = TimeLimit.of(attempt.timeout)
    slice_secs = min(WAIT_SLICE, settings.heartbeat_secs)
    while True:
        try:
            # None while it runs, and while its daemon does not answer: the job is kept and its lease renewed
            # below until the daemon answers with how the container is (executors/docker.py).
            ended = handle.wait(slice_secs)
        except LaunchUnknown as exc:
            # Removed under us (an operator, or the supervisor finishing an orphan): no exit code to record.
            log.warning("job %s attempt %s: %s; leaving the row to the supervisor", attempt.job_id,
                        attempt.attempt, exc)
            return None
        if ended is not None:
            return ended, stop.asked
        now = time.monotonic()
        if rt.drain_requested_at is not None and drain_deadline is None:
            drain_deadline = rt.drain_requested_at + settings.drain_timeout_secs
            log.info("job %s: shutdown, asking it to checkpoint and stop", attempt.job_id)
            handle.signal_stop()
            stop.asked = True
        if drain_deadline is not None and now >= drain_deadline:
            log.warning("job %s: still running at the drain deadline; left running", attempt.job_id)
            rt.left_running.append(attempt.job_id)
            return None
        if limit is not None:
            # Past its time limit: marked first, then stopped (workers/timelimit.py); a refused mark is
            # judged by a heartbeat now, as any refused write is.
            verdict = limit.check(attempt, handle, now, slice_secs)
            if verdict == STOP:
                stop.time_out(handle, now, settings.stop_grace_secs)
            elif verdict == REFUSED:
                next_beat = now
        # A SIGKILL falls due only on a fresh read: a pause withdrawn since the last beat calls it off.
        if now >= next_beat or (stop.kill_at is not None and now >= stop.kill_at):
            next_beat = now + settings.heartbeat_secs
            beat = _beat(rt, attempt, handle, requests)
            if beat is None:
                return None
            requests = beat
            live.followed = requests.followed
        stop.act(attempt.job_id, handle, requests, now, settings.stop_grace_secs, drain_deadline is not None)


@dataclass
class _Stop:
    """What the watcher asked of its job. `asked` stays set once a stop signal went out (a drain, a pause, a
    cancel or its time limit): the exit is then reported as 'interrupted', so one with no persisted
    cancel/pause (a pause withdrawn by a resume) hands the job back instead of failing it, and one marked
    for its time limit fails as `timeout` (scripts/_lib.lua, verdict_for_exit). `kill_at` is the SIGKILL due
    at the end of a pause's or cancel's stop grace, called off when the request is withdrawn; `limit_kill_at`
    the one due at the end of the time limit's, which nothing calls off, a drain included."""

    asked: bool = False
    requested: bool = False
    kill_at: float | None = None
    limit_kill_at: float | None = None

    def time_out(self, handle: Handle, now: float, grace: float) -> None:
        """The attempt is marked as past its time limit: the stop signal now, SIGKILL after `grace`."""
        handle.signal_stop()
        self.asked = True
        self.limit_kill_at = now + grace

    def act(self, job_id: str, handle: Handle, requests: Requests, now: float, grace: float,
            draining: bool) -> None:
        wanted = requests.cancel or requests.pause
        if wanted and not self.requested:
            log.info("job %s: %s requested; stopping it", job_id, "cancel" if requests.cancel else "pause")
            handle.signal_stop()
            self.asked = self.requested = True
            self.kill_at = now + grace
        elif not wanted and self.requested:
            if self.kill_at is not None:
                log.info("job %s: stop request withdrawn before it stopped; not killing it", job_id)
            self.requested, self.kill_at = False, None
        if self.kill_at is not None and now >= self.kill_at and not draining:  # a drain has its own deadline
            handle.kill()
            self.kill_at = None
        if self.limit_kill_at is not None and now >= self.limit_kill_at:
            log.info("job %s: still running at the end of its time limit's stop grace; killing it", job_id)
            handle.kill()
            self.limit_kill_at = None


def _beat(rt: Runtime, attempt: Attempt, handle: Handle, requests: Requests) -> Requests | None:
    """Renew the lease and read the persisted requests back; None when the watcher must leave: the job is
    its adopter's now, or no longer anyone's (then its container was stopped and removed)."""
    try:
        return attempt.heartbeat()
    except RedisUnavailable as exc:
        log.warning("job %s: heartbeat failed (%s); will retry", attempt.job_id, exc)
        return requests
    except (NotOwner, NotFound):  # NotFound: the row itself is gone; nobody can own it now
        fate = _after_refusal(rt, attempt, handle)
    if isinstance(fate, Requests):
        return fate  # claimed back after Redis lost our claim: watched as before
    if fate == UNKNOWN:
        return requests
    if fate == ADOPTED:
        # We stalled past our lease and a live worker re-attached to this very container.
        log.warning("job %s attempt %s: adopted by another worker; leaving it to that worker",
                    attempt.job_id, attempt.attempt)
        return None
    log.warning("job %s attempt %s: no longer ours; stopping it without writing", attempt.job_id,
                attempt.attempt)
    _stop_within(handle, rt.store.settings.stop_grace_secs)
    handle.remove()  # nothing will record it, and a relaunch of this attempt would reuse its name
    return None


T = TypeVar("T")


def _retrying(call: Callable[[], T], within: float | None = None, what: str = "a write") -> T:
    """Send a write until Redis answers it. A lost reply (a connection reset after the script ran) and an
    outage both read as `RedisUnavailable`, and every worker write is safe to send again: a heartbeat or
    set_container sent twice writes the same, a finish sent again gets the answer it had (finished_by),
    and a claim sent again by the same `Attempt` succeeds again. A refusal (`NotOwner`, ...) is an answer
    and is raised. With `within`, give up after that many seconds and raise the last error;
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


#: What a refused heartbeat turned out to mean (besides `Requests`: claimed back, go on watching).
ADOPTED, LOST, UNKNOWN = "adopted", "lost", "unknown"


def _adopted_elsewhere(rt: Runtime, attempt: Attempt, handle: Handle) -> bool:
    """Proof that another worker re-attached to OUR container; anything short of proof is False."""
    try:
        row = rt.store.job(attempt.job_id)
        return _adoption_proven(rt, attempt, handle, row)
    except (JobpoolError, redis.RedisError):
        return False


def _adoption_proven(rt: Runtime, attempt: Attempt, handle: Handle, row: Job) -> bool:
    """The row runs this attempt under a non-empty boot other than ours, that boot's record is live, and
    the row names the very container (or process) we watch. Anything less is not an adoption: a row
    Redis rolled back to before our claim (owner '') or re-issued to another worker that launched its own
    container passes "same attempt, other owner" too. Raises RedisUnavailable when it cannot tell."""
    if row.state.value != "running" or row.attempt != attempt.attempt:
        return False
    if row.owner_boot in ("", attempt.boot_id) or not _names_ours(row, handle):
        return False
    return rt.store.boot_is_live(row.owner_boot)


def _names_ours(row: Job, handle: Handle) -> bool:
    """The row records the container (Docker) or the process identity (subprocess) we watch."""
    if handle.container_id:
        return row.container_id == handle.container_id
    if not handle.identity or not row.identity:
        return False
    try:
        recorded: object = json.loads(row.identity)
        return recorded == handle.identity
    except ValueError:
        return False


def _after_refusal(rt: Runtime, attempt: Attempt, handle: Handle) -> Requests | str:
    """What a refused heartbeat means for the container we watch: ADOPTED only on proof (it goes on under
    its adopter); the row running this attempt unclaimed again (Redis lost its last writes: a crash before
    they reached disk, a failover to a lagging replica) is claimed back for our container, so this attempt
    runs once and its restored RQ delivery is refused (the `Requests` it carries are returned); LOST
    (stop it) for everything else; UNKNOWN while Redis cannot answer (ask again at the next beat)."""
    try:
        row = rt.store.job(attempt.job_id)
        if row.state.value == "running" and row.attempt == attempt.attempt:
            if row.owner_boot == "" and row.container_id in ("", handle.container_id):
                return _claim_back(rt, attempt, handle)
            if row.owner_boot == attempt.boot_id and _names_ours(row, handle):
                return UNKNOWN  # ours again already: the next beat says so
        return ADOPTED if _adoption_proven(rt, attempt, handle, row) else LOST
    except RedisUnavailable:
        return UNKNOWN
    except JobpoolError:  # NotFound, CorruptRow: no row anyone could own
        return LOST


def _claim_back(rt: Runtime, attempt: Attempt, handle: Handle) -> Requests | str:
    try:
        _, requests = attempt.claim(rt.store.settings.executor, rt.daemon_id)
    except RedisUnavailable:
        return UNKNOWN
    except JobpoolError as exc:  # another worker claimed it first, or it moved on: theirs, not ours
        log.warning("job %s attempt %s: Redis lost our claim and it could not be taken back (%s)",
                    attempt.job_id, attempt.attempt, exc)
        return LOST
    log.warning("job %s attempt %s: Redis lost our claim; claimed it back for the container we run",
                attempt.job_id, attempt.attempt)
    try:
        _retrying(lambda: attempt.set_container(handle.container_id, handle.daemon_id, handle.identity),
                  FINISH_RETRY_SECS)
    except RedisUnavailable as exc:  # the row is ours and watched; only a crash of ours would miss it
        log.warning("job %s: could not record its container again (%s)", attempt.job_id, exc)
    except JobpoolError:
        return LOST
    return requests


def _stop_within(handle: Handle, grace: float) -> None:
    """SIGTERM, then SIGKILL if it is still running after `grace` seconds."""
    handle.signal_stop()
    try:
        if grace <= 0 or handle.wait(grace) is None:
            handle.kill()
    except LaunchUnknown:
        pass  # removed under us: nothing left to stop


def finish_kind(ended: Ending, stop_asked: bool) -> str:
    """The finish kind (scripts/finish.lua) of an ending: an OOM kill is one whatever was asked; asked to
    stop, a job may exit non-zero for that alone (or its daemon may have ended it meanwhile): without a
    persisted cancel/pause it is handed back; otherwise a crash (its daemon ended it) or its own exit."""
    if ended.cause == OOM:
        return "oom"
    if stop_asked:
        return "interrupted"
    return "crashed" if ended.cause == CRASHED else "exit"


def _finish(rt: Runtime, attempt: Attempt, handle: Handle, executor: Executor, ended: Ending,
            stop_asked: bool, live: LiveLog | None = None) -> None:
    """Record the exit code, however long Redis is away. A subprocess job's code lives only here, and a
    dropped code makes the supervisor re-run a job that succeeded (it finds a dead pid and nothing else).
    Only an answer ends the wait: recorded, or refused (the row moved on: proof it was superseded); the
    worker's force stop kills this horse, and then the supervisor decides from what it can see."""
    # Reading the log tail can take seconds (a job that printed a lot): the lease is renewed meanwhile, or the
    # supervisor could judge the exit first and the tail be lost. So is the live log's last append, made
    # before the end is recorded so that its followers read it before they learn the job ended.
    with LaunchLease(attempt, rt.store.settings.heartbeat_secs):
        if live is not None:
            live.close(last=True)
        tail = handle.log_tail(LOG_TAIL_BYTES)
    kind, code = finish_kind(ended, stop_asked), ended.code
    try:
        state = _retrying(lambda: attempt.finish(kind, code, reason=ended.reason, log_tail=tail,
                                                 evidence=ended.evidence),
                          what=f"job {attempt.job_id} attempt {attempt.attempt}: recording exit {code}")
    except (NotOwner, NotFound):
        log.warning("job %s attempt %s: finished, but the row is no longer ours; not recorded",
                    attempt.job_id, attempt.attempt)
        if not _adopted_elsewhere(rt, attempt, handle):
            handle.remove()  # an adopter would still need the container to read its exit code
        return
    log.info("job %s attempt %s: exit %s%s -> %s", attempt.job_id, attempt.attempt, code,
             f" ({ended.evidence})" if ended.evidence else "", state)
    job_over = state in TERMINAL_STATES
    checkpoint_of = attempt.job_id if job_over and attempt.checkpoint else ""  # to remove with the container
    # Recorded: the container may go. Its removal is handed to the worker's main process, so this horse
    # exits at once and the worker takes its next job meanwhile (workers/cleanup.py).
    cleaner, pool = rt.cleaner, rt.store.keys.pool
    if not (handle.container_id and cleaner and cleaner.hand_off(handle.container_id, pool, checkpoint_of)):
        handle.remove()
        if checkpoint_of:
            executor.remove_checkpoint(rt.store.keys.pool, attempt.job_id)
    if job_over and rt.job_ended is not None:
        rt.job_ended()


def launch_and_watch(rt: Runtime, attempt: Attempt, executor: Executor,
                     launch_fn: Callable[[Fence], Handle]) -> None:
    """Launch through `launch_fn(fence)`, record what was launched, then watch it.

    A launch may outlast the lease, so the lease is renewed all through it (`LaunchLease`), and `fence`, a
    fenced heartbeat the executor calls just before the job can start, proves the row still ours then: a
    refusal means the job is not started (`NotLaunched`). A start that finds its container removed is
    `NotLaunched` too: the supervisor removes a never-started container before applying its verdict, which
    then stands; writing anything here would only race it. Nothing runs, so nothing is written."""
    what = f"job {attempt.job_id} attempt {attempt.attempt}"
    recorded: list[str] = []  # the container the fence recorded (Docker: created, not yet started)
    fenced_at: list[float] = []
    with LaunchLease(attempt, rt.store.settings.heartbeat_secs) as lease:

        def fence(container_id: str, daemon_id: str) -> None:
            fenced_at.append(time.monotonic())
            # Docker names its container before the start: recording it is the fence (set_container is
            # fenced, renews the lease and reads the requests back), one round trip instead of two. A
            # process gets its identity only once started: a heartbeat fences it, set_container follows.
            try:
                if container_id:
                    lease.requests = _retrying(lambda: attempt.set_container(container_id, daemon_id),
                                               what=f"{what}: recording its container before start")
                    recorded.append(container_id)
                else:
                    lease.requests = _retrying(attempt.heartbeat,
                                               what=f"{what}: confirming the row before start")
            except (NotOwner, NotFound) as exc:
                raise NotLaunched(f"the row is no longer ours ({exc})") from None

        try:
            handle = launch_fn(fence)
        except NotLaunched as exc:
            log.warning("%s: not started: %s; nothing runs, and the row is left as it is", what, exc)
            return
        except LaunchError as exc:
            log.warning("job %s: could not launch: %s", attempt.job_id, exc.reason)
            reason = exc.reason
            try:
                _retrying(lambda: attempt.finish("error", reason=reason),
                          what=f"{what}: recording its launch failure")
            except (NotOwner, NotFound):
                return
            if attempt.checkpoint:
                executor.remove_checkpoint(rt.store.keys.pool, attempt.job_id)
            return
        except HostFault as exc:
            _hand_back(rt, attempt, exc)
            return
        except LaunchUnknown as exc:
            # It may or may not run: keep the slot (write nothing) and let the supervisor find out.
            log.warning("%s: launch outcome unknown (%s); leaving it to the supervisor", what, exc)
            return
        try:
            # Until this is recorded the supervisor cannot find a subprocess job: sent until answered.
            if not (handle.container_id and handle.container_id in recorded and handle.identity is None):
                _retrying(lambda: attempt.set_container(handle.container_id, handle.daemon_id,
                                                        handle.identity),
                          what=f"{what}: recording what was launched")
        except (NotOwner, NotFound):
            log.warning("job %s: lost the row while launching; stopping it", attempt.job_id)
            handle.kill()
            handle.remove()  # nothing will record it, and a relaunch of this attempt would reuse its name
            return
    # The start can come long after the fence (a daemon or a proxy holding it): if the row was refused
    # meanwhile, or may have been, the first heartbeat goes now, so a job started for a lost row is stopped at
    # once (bench/soak.py saw one run 0.7 s past a Redis rollback that took back its claim).
    late = bool(fenced_at) and time.monotonic() - fenced_at[-1] >= START_REFENCE_SECS
    watch(rt, attempt, handle, executor, lease.requests or Requests(False, False),
          beat_now=lease.refused or late)


def _hand_back(rt: Runtime, attempt: Attempt, fault: HostFault) -> None:
    """The worker's own host failed before anything of the job was sent to run (executors/base.py,
    HostFault): no fault of the job's, so it goes back to the queue at its place with no recovery budget
    spent (scripts/finish.lua, 'handback'), and the worker holds its claims until its host passes its check
    (workers/hostcheck.py). Nothing was created, so nothing is removed, and its checkpoint stays."""
    what = f"job {attempt.job_id} attempt {attempt.attempt}"
    log.error("%s: not started: this worker's %s failed: %s; handing the job back", what, fault.what,
              fault.cause)
    if rt.host_check is not None:
        rt.host_check.note.write(fault)
    try:
        state = _retrying(lambda: attempt.finish("handback", reason=f"host_fault: {fault.what}",
                                                 evidence=fault.cause),
                          what=f"{what}: handing it back")
    except (NotOwner, NotFound):
        return  # the row moved on meanwhile: nothing of ours runs, and nothing is ours to write
    log.info("%s: handed back -> %s", what, state)


def quietly_refused(exc: Exception) -> bool:
    """Duplicate or stale deliveries are normal under at-least-once dispatch: refuse them without noise."""
    return isinstance(exc, (NotOwner, Conflict, InvalidState, NotFound))
