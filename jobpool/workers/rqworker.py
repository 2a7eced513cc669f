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

from rq import Queue
from rq.intermediate_queue import IntermediateQueue
from rq.serializers import JSONSerializer

from ..contract import ADOPT_RQ_PREFIX
from ..errors import JobpoolError
from ..store.keys import worker_name
from ..store.rqconnection import worker_connection
from .boot import Boot
from .outage import Backoff, is_transient
from .routedqueue import RoutedQueue, routed_poll_secs
from .rqbookkeeping import BooksWorker
from .runtime import DRAIN_SIGNAL, Runtime

log = logging.getLogger("jobpool.worker")

#: Extra time the worker gives its horse past the drain timeout to record the outcome before killing it.
HORSE_MARGIN_SECS = 5.0
#: How far past now a started registry's entries are read before RQ's maintenance cleans it up
#: (`clean_registries`): RQ reads its own clock a moment later.
ABANDONED_MARGIN_SECS = 60.0


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
        queue_class = type("_WorkerQueue", (RoutedQueue,), {
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

    def handle_job_failure(self, job: Any, queue: Any, started_job_registry: Any = None,
                           exc_string: str = "") -> None:
        """RQ's failure record of a delivery (its horse died, or its job function raised), then deleted again
        if the job has no row (scripts/forget_rq_failure.lua): a job made and taken after the last writes a
        Redis then lost has none, and RQ's record of a jobpool job never expires on its own. A Redis that
        fails here leaves it (a warning says which)."""
        super().handle_job_failure(job, queue, started_job_registry, exc_string)
        if self._said_done or str(job.id).startswith(ADOPT_RQ_PREFIX):  # deleted already; not a job's row
            return
        self._forget_if_rowless(job.id, job.failed_job_registry.key)

    def clean_registries(self) -> None:
        """RQ's registry maintenance, then RQ's record of each delivery it found abandoned deleted again when
        the job has no row, as `handle_job_failure` does for one this worker saw fail. A delivery is
        abandoned when its worker died during it (SIGKILL, a host lost): RQ's `StartedJobRegistry.cleanup`
        takes it out of the started registry and records it failed, or, when the record has no payload (the
        four fields RQ's worker wrote of a job that a Redis then lost, or that was pruned, as it took it),
        leaves that record as it is. Either way nothing would ever delete it.

        The registries' entries past their score (and those within `ABANDONED_MARGIN_SECS` of it, which
        RQ's own clock may reach first) are read before RQ's call; an entry gone from its registry after it
        was cleaned up, by this worker or another, in one transaction with its failure record (RQ pipelines
        it in a MULTI), so its job's record is looked at only then. One still there is left for later."""
        store = self.runtime.store
        until = time.time() + ABANDONED_MARGIN_SECS
        try:
            due = [(q, store.deliveries_due(q.started_job_registry.key, until)) for q in list(self.queues)]
        except JobpoolError as exc:  # RQ's own call below meets the same Redis, and says so its own way
            log.warning("worker %s: RQ's started registries not read before its maintenance (%s): RQ's "
                        "records of deliveries it finds abandoned this time are kept", self.name, exc)
            due = []
        super().clean_registries()  # type: ignore[no-untyped-call]  # RQ's, untyped
        for queue, entries in due:
            try:
                gone = store.deliveries_gone(queue.started_job_registry.key, entries)
            except JobpoolError as exc:
                log.warning("worker %s: RQ's started registry %s not read after its maintenance (%s): RQ's "
                            "records of deliveries it found abandoned there are kept",
                            self.name, queue.started_job_registry.key, exc)
                continue
            for entry in gone:
                job_id = queue.started_job_registry.parse_job_id(entry)
                if not job_id.startswith(ADOPT_RQ_PREFIX):
                    self._forget_if_rowless(job_id, queue.failed_job_registry.key)

    def _forget_if_rowless(self, job_id: str, failed_key: str) -> None:
        try:
            forgot = self.runtime.store.forget_rq_failure(job_id, failed_key)
        except JobpoolError as exc:
            log.warning("worker %s: could not check that job %s has a row after RQ recorded its delivery "
                        "failed (%s): if it has none, RQ's record of it stays", self.name, job_id, exc)
            return
        if forgot:
            log.warning("worker %s: job %s has no row (pruned meanwhile, or lost by Redis since it was "
                        "taken): RQ's record of its failed delivery deleted", self.name, job_id)

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
        progress reads the list again each round (jobpool/workers/routedqueue.py
        `RoutedQueue._dequeue_routed`)."""
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
