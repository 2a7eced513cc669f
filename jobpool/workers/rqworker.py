"""`JobpoolWorker`: RQ's forking worker with a bounded drain (docs/architecture.md, "Workers").

RQ's warm shutdown waits for the running job without limit. Here the first SIGTERM/SIGINT stops claiming
(RQ's own behaviour), asks the horse to interrupt its job (the horse sends the container its stop signal),
and the wait is bounded: past the drain timeout the horse gives up and leaves the job running; should the
horse itself hang, the worker kills it a few seconds later. A second signal exits at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from rq import Queue
from rq.exceptions import DequeueTimeout
from rq.intermediate_queue import IntermediateQueue
from rq.serializers import JSONSerializer
from rq.utils import as_text

from ..errors import JobpoolError
from ..store.keys import worker_name
from ..store.rqconnection import block_then_look, worker_connection
from .boot import Boot
from .outage import Backoff, OutageError, is_transient
from .rqbookkeeping import BooksWorker
from .runtime import DRAIN_SIGNAL, Runtime

log = logging.getLogger("jobpool.worker")

#: How long a worker listening on its daemon's queue too blocks on the pool's queue before looking again: its
#: heartbeat period (`JobpoolWorker.__init__`), within these bounds. An idle worker sends one look at each of
#: its queues a round, so a fleet's idle load is two round trips per worker a round (at a second a round,
#: 2,000 a second for 1,000 workers: BENCHMARKS.md, "Scale"); a job routed to the daemon (an adoption request,
#: a checkpoint affinity) waits at most a round for an idle worker there, a heartbeat period as a lease does.
ROUTED_POLL_SECS = (1, 5)


def routed_poll_secs(heartbeat_secs: float) -> int:
    """A worker's round on its queues (whole seconds, as BLMOVE's timeout is given by RQ): see
    `ROUTED_POLL_SECS`."""
    low, high = ROUTED_POLL_SECS
    return max(low, min(high, int(heartbeat_secs)))

#: How often a worker that may take no job (its daemon's identity not trusted: jobpool/fleet/daemonmark.py)
#: asks again.
REFUSED_POLL_SECS = 0.2

#: Extra time the worker gives its horse past the drain timeout to record the outcome before killing it.
HORSE_MARGIN_SECS = 5.0


class _Queue(Queue):
    """RQ's queue, except that a dropped connection in the dequeue leaves RQ's own dequeue loop (which retries
    it on its own schedule, each retry logged as an error) for `JobpoolWorker`, which waits out every kind of
    outage the same way (jobpool/workers/outage.py)."""

    @staticmethod
    def refusal() -> str:
        """Why the worker may take no job now, '' when it may (a subclass per worker says:
        `JobpoolWorker.__init__`)."""
        return ""

    @staticmethod
    def refused_for_good() -> bool:
        """Whether that refusal lasts until an operator acts (two daemons share the identity)."""
        return False

    #: How long a round blocks on the pool's queue when there are queues before it (whole seconds; set per
    #: worker from its heartbeat period, within `ROUTED_POLL_SECS`).
    routed_poll_secs = ROUTED_POLL_SECS[0]

    #: The queues before the pool's that the blocking round in progress looks at as its block ends (`lmove`),
    #: and the worker's own list of queues, as it is then (another thread may remove one meanwhile:
    #: `JobpoolWorker.forget_earlier_boot`); set by `_dequeue_routed` around the round, in the worker's main
    #: thread, the only one that dequeues.
    _routed_after: tuple[Queue, ...] = ()
    _listening: list[Queue] | None = None

    @staticmethod
    def give_back(queue_key: str, rq_job_id: str, why: str) -> None:
        """Put a job taken but not to be run back at the head of its queue (a subclass per worker says how:
        `JobpoolWorker._give_back_entry`)."""
        raise NotImplementedError

    @classmethod
    def dequeue_any(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            return cls._dequeue_routed(*args, **kwargs)
        except redis.ConnectionError as exc:
            if is_transient(exc):
                raise OutageError(exc) from exc
            raise

    @classmethod
    def lmove(cls, connection: Any, queue_key: str, timeout: int | None) -> Any:
        """RQ's move of one entry of `queue_key` to its intermediate list; in a blocking round of
        `_dequeue_routed`, the queues before the pool's are looked at in the same round trip, right as the
        block ends (a pipeline: the server runs their LMOVEs once the BLMOVE returns). An idle worker so sends
        one round trip a round, not two (BENCHMARKS.md, "Scale"). Should a round take two entries (a job
        routed to the daemon while the pool's queue had one too), the first in the queues' order is kept and
        each other is given back at the head of its queue (`give_back`), as untaken."""
        routed = cls._routed_after
        if timeout is None or not routed:
            return super().lmove(connection, queue_key, timeout)
        # Errors as replies: one taken beside an error is still kept (the error, an outage's, comes back at
        # the next round), and an error is raised as the server said it (UNBLOCKED, READONLY: outage.py reads
        # the reply's own words, which redis-py's first-error annotation would precede). Over Sentinel,
        # redis-py turns READONLY into a dropped connection while reading the replies: an entry taken then
        # stays in its intermediate list, as one taken just before any dropped connection (or a stop signal)
        # does: the supervisor dispatches a job so left again past the claim grace (supervisor/verdicts.py),
        # and RQ's maintenance fails an adoption request so left, which the supervisor then asks again.
        pooled, *looked = block_then_look(connection, queue_key,
                                          IntermediateQueue.get_intermediate_queue_key(queue_key), timeout,
                                          [(q.key, q.intermediate_queue_key) for q in routed])
        replies = [*zip((q.key for q in routed), looked, strict=True), (queue_key, pooled)]
        taken = [(key, as_text(entry)) for key, entry in replies
                 if entry is not None and not isinstance(entry, Exception)]
        # A queue no longer listened on since the round began (an "earlier boot" found to be a clone that
        # publishes again: its jobs' checkpoints are on the clone's host) keeps what was taken from it.
        listening = {q.key for q in (cls._listening or ())} | {queue_key}
        kept = next((t for t in taken if t[0] in listening), None)
        for key, entry in taken:
            if (key, entry) != kept:
                why = "taken with another" if key in listening else "its queue is no longer listened on"
                cls.give_back(key, entry, why)
        if kept is None:
            for _, reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            raise DequeueTimeout(timeout, queue_key)
        return kept

    @classmethod
    def _wait_refused(cls, deadline: float | None, timeout: int | None, queues: list[Queue]) -> bool:
        """Wait a little while this worker may take nothing: its daemon may be another's clone
        (jobpool/fleet/daemonmark.py), and a job taken here could run beside its own attempt elsewhere, or be
        judged by another list. True when a run without a deadline (a burst) is refused for good."""
        if deadline is None:
            if cls.refused_for_good():
                return True
            time.sleep(REFUSED_POLL_SECS)
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            raise DequeueTimeout(timeout, [q.key for q in queues])
        time.sleep(min(REFUSED_POLL_SECS, left))
        return False

    @classmethod
    def _dequeue_routed(cls, queues: Any, timeout: int | None, *args: Any, **kwargs: Any) -> Any:
        """RQ's dequeue of one queue at a time, so every queue keeps RQ's intermediate list (RQ pops several
        queues with BLPOP, which has none: the supervisor reads that list, supervisor/evidence.py). The
        queues before the last (a daemon's own queue: routed adoption requests, supervisor/adoption.py)
        are looked at without blocking, then the last (the pool's) blocks for at most `routed_poll_secs`,
        until `timeout`, the queues before it looked at again in the same round trip as its block ends
        (`lmove`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        looked: tuple[str, ...] | None = None  # the queues before the pool's when last looked at alone
        while True:
            # Read again each round, as it is now: the worker's inventory thread may add a queue to this very
            # list meanwhile (JobpoolWorker.add_queue), and a worker with one queue still blocks for at most
            # a round at a time, so it sees one added.
            now = list(queues)
            if cls.refusal():
                if cls._wait_refused(deadline, timeout, now):
                    return None  # a burst run: nothing it may take
                looked = None
                continue
            if deadline is None and len(now) <= 1:
                return super().dequeue_any(now, None, *args, **kwargs)
            routed_names = tuple(q.name for q in now[:-1])
            if looked != routed_names or deadline is None:
                # At the first round (after a refusal, and once one was added) alone: each later one looks at
                # them as its block ends.
                looked = routed_names
                for queue in now[:-1]:
                    found = super().dequeue_any([queue], None, *args, **kwargs)
                    if found is not None:
                        return found
            if deadline is None:
                return super().dequeue_any(now[-1:], None, *args, **kwargs)
            left = deadline - time.monotonic()
            if left <= 0:
                raise DequeueTimeout(timeout, [q.key for q in now])
            try:
                cls._routed_after, cls._listening = tuple(now[:-1]), queues
                return super().dequeue_any(now[-1:], max(1, min(cls.routed_poll_secs, int(left))), *args,
                                           **kwargs)
            except DequeueTimeout:
                continue
            finally:
                cls._routed_after, cls._listening = (), None


class JobpoolWorker(BooksWorker):
    def __init__(self, runtime: Runtime, boot: Boot, **kwargs: Any) -> None:
        store = runtime.store
        # The daemon's own queue first (routed adoption requests: supervisor/adoption.py), the pool's last.
        daemon_queue = [store.keys.daemon_queue_name(runtime.daemon_id)] if runtime.daemon_id else []
        #: Why this worker may take no job now ('' when it may): its daemon's identity not trusted to be one
        #: daemon's (jobpool/fleet/daemonmark.py `Marker.refusal`, set by run_worker); read before each
        #: dequeue.
        self.claim_refusal: Callable[[], str] | None = None
        self.claim_refused_for_good: Callable[[], bool] | None = None
        queue_class = type("_WorkerQueue", (_Queue,), {
            "routed_poll_secs": routed_poll_secs(store.settings.heartbeat_secs),
            "refusal": staticmethod(lambda: self.claim_refusal() if self.claim_refusal else ""),
            "refused_for_good": staticmethod(
                lambda: bool(self.claim_refused_for_good and self.claim_refused_for_good())),
            "give_back": staticmethod(self._give_back_entry)})
        super().__init__(
            [*daemon_queue, store.keys.rq_queue_name],
            connection=worker_connection(store.settings.redis_url),
            serializer=JSONSerializer,
            name=worker_name(store.keys.pool, boot.id),
            job_monitoring_interval=1,  # how often the drain bound below is checked
            queue_class=queue_class,
            **kwargs,
        )
        self.runtime = runtime
        # A horse stopped this long has let its job's lease lapse (only the horse renews it): the supervisor
        # recovers the job (adopts its container, or redispatches an unclaimed dispatch), and the worker
        # kills the horse to take work again (`check_stopped_horse`).
        # A subprocess job's horse is the parent that reads its exit, which no one can adopt: killed, it loses
        # the exit of a job that runs on in its cgroup, which is kept while it runs and recovered (on its
        # budget) once ended. Waiting for ever would wedge the worker instead: the queue comes first.
        self.horse_stop_limit_secs = store.settings.lease_secs
        # Called in a horse: once its job runs, and once its end is recorded (workers/horses.py).
        runtime.job_ended = self.job_ended
        runtime.job_launched = self.job_launched
        self.boot = boot
        self.outage = boot.outage
        #: Set by the first stop signal. RQ's own `_stop_requested` is set only when the signal comes during a
        #: job: an idle worker is stopped by an exception out of its dequeue, which leaves it False.
        self.stop_asked = False
        #: Set when a --burst run stopped because RQ's workers are suspended (`rq suspend`): a normal end too.
        self.suspended_in_burst = False
        self._drain_kill_at: float | None = None
        self.left_running = 0
        #: Set when a dequeue found the queue empty (how a --burst run ends normally).
        self.found_empty = False
        self.dropped_entries = 0
        #: Held while a queue is added (by the inventory thread: `add_queue`).
        self._queues_lock = threading.Lock()
        # Ignored until the horse installs its handler, so an early drain signal cannot kill it.
        signal.signal(DRAIN_SIGNAL, signal.SIG_IGN)

    # -- first signal: drain ------------------------------------------------------------------------------

    def handle_warm_shutdown_request(self) -> None:
        self.stop_asked = True
        settings = self.runtime.store.settings
        log.info("worker %s: shutting down; draining for at most %ss", self.name, settings.drain_timeout_secs)
        self.boot.set_draining()
        self._drain_kill_at = time.monotonic() + settings.drain_timeout_secs + HORSE_MARGIN_SECS
        self._signal_horse()

    def _signal_horse(self) -> None:
        if self.horse_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.horse_pid, DRAIN_SIGNAL)

    def maintain_heartbeats(self, job: Any) -> bool:
        # RQ's heartbeats for the running job; missed ones during an outage only age keys that live a minute.
        # Only a write that went through says Redis serves again (most wakes write nothing: horses.py).
        wrote = False
        try:
            wrote = super().maintain_heartbeats(job)
        except Exception as exc:
            if not is_transient(exc):
                raise
            self.outage.failed("the running job's RQ heartbeat", exc)
        else:
            if wrote:
                self.outage.recovered()
        if self._drain_kill_at is None:
            return wrote
        # Repeat the request: it is idempotent, and covers a horse that had not yet set its handler.
        self._signal_horse()
        if time.monotonic() >= self._drain_kill_at and self.horse_pid:
            log.warning("worker %s: horse did not finish draining; killing it", self.name)
            self.kill_horse(signal.SIGKILL)
        return wrote

    def setup_work_horse_signals(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        drain = self.runtime.request_drain
        signal.signal(DRAIN_SIGNAL, lambda *_: drain())
        # A service manager may SIGTERM the whole process group: for the horse that is the same request.
        signal.signal(signal.SIGTERM, lambda *_: drain())

    # -- second signal: exit now --------------------------------------------------------------------------

    def request_force_stop(self, signum: int, frame: Any) -> None:
        """Exit at once; the job's container keeps running and the supervisor decides its row."""
        log.warning("worker %s: second signal; exiting now, leaving running jobs to the supervisor",
                    self.name)
        if self.horse_pid:
            self.kill_horse(signal.SIGKILL)
            self.wait_for_horse()
        raise SystemExit(1)

    # -- Redis outages and junk on the queue -----------------------------------------------------------------

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        """RQ's dequeue, retried with backoff while Redis cannot serve it (RQ's loop would end on any error
        but a dropped connection), and past junk on the queue (see `_dequeue`). A standby horse is forked
        first if there is none (the first job, or after one died)."""
        self.have_standby()
        if self.runtime.host_check is not None:
            # Claims wait while this worker's host fails its check (workers/hostcheck.py).
            self.runtime.host_check.before_dequeue(self.heartbeat,
                                                   lambda: self.stop_asked or bool(self._stop_requested))
        backoff = Backoff()
        while True:
            try:
                result = self._dequeue(timeout, max_idle_time)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                # Had BLMOVE taken an entry before the error (RQ failed to load it), it stays in RQ's
                # intermediate list until RQ's maintenance clears it; the supervisor then dispatches the job
                # again (jobpool/supervisor/verdicts.py). It is not junk, so `_dequeue` does not drop it.
                self.outage.failed("the worker's dequeue", exc)
                backoff.sleep()
                continue
            self.outage.recovered()
            if result is None:
                self.found_empty = True
            elif self.claim_refusal is not None and self.claim_refusal():
                self._give_back(*result)  # refused while the pop waited: untaken, at the head again
                continue
            return result

    def _give_back(self, job: Any, queue: Any) -> None:
        """Put a job taken just as this worker found it may take none back at the head of its queue."""
        self._give_back_entry(queue.key, job.id, self.claim_refusal() if self.claim_refusal else "")

    def _give_back_entry(self, queue_key: str, rq_job_id: str, why: str) -> None:
        """Put an entry this worker took but will not run back at the head of its queue
        (scripts/give_back.lua), before anything of the delivery is written; kept as taken if Redis fails
        (the supervisor dispatches it again past the claim grace)."""
        try:
            taken = IntermediateQueue(queue_key, self.connection)
            given = self.runtime.store.give_back(queue_key, taken.key, taken.get_first_seen_key(rq_job_id),
                                                 rq_job_id)
        except JobpoolError as exc:
            log.warning("worker %s: job %s not given back (%s); the supervisor dispatches it again",
                        self.name, rq_job_id, exc)
            return
        if not given:
            log.warning("worker %s: job %s was no longer in %s's intermediate list; the supervisor "
                        "dispatches it again past the claim grace", self.name, rq_job_id, queue_key)
            return
        log.info("worker %s: gave job %s back to %s: %s", self.name, rq_job_id, queue_key, why)

    def listen_on_daemon(self, identity: str) -> None:
        """Listen on the daemon's own queue, first, once the daemon is known (it did not answer at boot);
        called by the inventory thread."""
        self.add_queue(self.runtime.store.keys.daemon_queue_name(identity), first=True,
                       why=f"its docker daemon's queue ({identity})")

    def listen_on_earlier_boot(self, identity: str) -> None:
        """Listen on the queue of an earlier boot of this worker's daemon that is over
        (jobpool/fleet/inventory.py, `earlier_boots`; called by the inventory thread): jobs with a checkpoint
        affinity to it are pushed there, and their checkpoints are on this daemon."""
        self.add_queue(self.runtime.store.keys.daemon_queue_name(identity), first=False,
                       why=f"the queue of an earlier boot of its docker daemon ({identity})")

    def forget_earlier_boot(self, identity: str) -> None:
        """Stop reading the queue of a boot taken for an earlier one that publishes again after all (a clone
        of this daemon's data root on another host: its jobs' checkpoints are there, not here)."""
        name = self.runtime.store.keys.daemon_queue_name(identity)
        with self._queues_lock:
            ordered = self._ordered_queues
            for queues in [self.queues] + ([ordered] if ordered is not self.queues else []):
                queues[:] = [q for q in queues if q.name != name]
        log.warning("worker %s: no longer listening on %s: daemon %s publishes again, so it was no earlier "
                    "boot of this one (a clone of its data root?)", self.name, name, identity)

    def add_queue(self, name: str, first: bool, why: str) -> None:
        """Add a queue to those this worker reads: first, or just before the pool's (always the last). Both
        of RQ's lists are changed in place, under a lock (the caller is another thread): a dequeue in
        progress reads the list again each round (`_Queue._dequeue_routed`)."""
        with self._queues_lock:
            if name in self.queue_names():
                return
            queue = Queue(name, connection=self.connection, serializer=JSONSerializer)
            ordered = self._ordered_queues
            for queues in [self.queues] + ([ordered] if ordered is not self.queues else []):
                queues.insert(0 if first else max(0, len(queues) - 1), queue)
        log.info("worker %s: listening on %s too (%s)", self.name, why, name)

    def _dequeue(self, timeout: int | None, max_idle_time: int | None) -> Any:
        """RQ's dequeue, except that one entry RQ cannot load (an id it refuses, a job hash edited to
        garbage) is taken off the queue and logged instead of ending the work loop, which would leave every
        worker that pops it dead. Anything else still ends the loop (and `run_worker` then fails)."""
        while True:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            except Exception as exc:
                job_id, queue = getattr(exc, "job_id", None), getattr(exc, "queue", None)
                if job_id is None or queue is None or is_transient(exc):
                    raise
                self._drop_entry(queue, str(job_id), exc)

    def _drop_entry(self, queue: Any, job_id: str, exc: Exception) -> None:
        # BLMOVE left it in the intermediate list (RQ's maintenance would choke on it there too).
        self.runtime.store.drop_taken(queue.intermediate_queue_key, job_id)
        self.dropped_entries += 1
        log.error("worker %s: dropped an entry RQ cannot load from %s: %r (%s: %s)", self.name, queue.name,
                  job_id[:200], type(exc).__name__, exc)

    def _pubsub_exception_handler(self, exc: Exception, pubsub: Any, pubsub_thread: Any) -> None:
        """RQ's handler for its command channel thread logs a dropped connection as an error every 2 s and
        lets any other error end the thread; an outage is logged once here and waited out at the same pace."""
        if not is_transient(exc):
            return super()._pubsub_exception_handler(exc, pubsub, pubsub_thread)
        self.outage.failed("the worker's command channel", exc)
        time.sleep(2.0)

    def ended_normally(self, burst: bool) -> bool:
        """Whether `work()` returned because it was asked to (a stop signal, an empty queue or `rq suspend`
        in burst mode), not because its loop died of an exception. `work()` returns the same way in both
        cases; with the arguments `run_worker` passes, every other way out of RQ's loop logs an error."""
        return self.stop_asked or bool(self._stop_requested) or (
            burst and (self.found_empty or self.suspended_in_burst))

    # -- a job's execution ---------------------------------------------------------------------------------

    def execute_job(self, job: Any, queue: Any) -> None:
        """RQ's execute_job (prepare, fork, monitor, idle), with the Redis writes RQ's parent makes around a
        job waited out instead of ending the work loop: before the fork they are retried (the job was
        dequeued and must run); after the horse has exited they are RQ's own bookkeeping of a job whose
        outcome jobpool already recorded, and are skipped."""
        backoff = Backoff()
        while True:
            try:
                self.prepare_execution(job)
                break
            except Exception as exc:
                if not is_transient(exc):
                    raise
                self.outage.failed("preparing a job", exc)
                backoff.sleep()
        self.fork_work_horse(job, queue)
        if self.runtime.cleaner is not None:
            self.runtime.cleaner.launched()  # the removals waiting for the next hand-off (workers/cleanup.py)
        try:
            self.monitor_work_horse(job, queue)
        except Exception as exc:
            if not is_transient(exc):
                raise
            self.outage.failed("RQ's record of a finished job", exc)
            if self.horse_pid:
                self.wait_for_horse()  # reap it: a horse still running here is past its own handling
        # RQ sets the worker idle here and again as its dequeue begins, a moment later: that one is kept.
        if self._drain_kill_at is not None and self._still_ours(job.id):
            self.left_running += 1

    def standby_wanted(self) -> bool:
        return not self.stop_asked and super().standby_wanted()

    def warm_horse(self) -> None:
        super().warm_horse()
        self.runtime.store.ping()

    def _still_ours(self, job_id: str) -> bool:
        try:
            row = self.runtime.store.job(job_id)
        except JobpoolError:
            return False
        return row.state.value == "running" and row.owner_boot == self.boot.id
