"""RQ's own bookkeeping in a jobpool worker: its worker hash (state, heartbeat, current job, counters, which
expire by themselves) and its registry maintenance (which the next round redoes).

Two things differ from RQ's worker. Between two jobs, which is between a slot's release and the next
launch when there are as many workers as slots, the writes RQ sends one round trip at a time are sent
together (the idle state with the suspension check, a heartbeat's two commands), or within a second of the
last not at all. And during a Redis outage none of it may end the work loop, nor lose a job already
dequeued or running (the job's own record is the horse's business: jobpool/workers/watch.py): a failed
write is reported to the worker's outage tracker (`outage`, jobpool/workers/outage.py) and skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from rq.exceptions import StopRequested
from rq.suspension import WORKERS_SUSPENDED
from rq.worker import WorkerStatus

from .horses import HorseWorker
from .outage import Backoff, Outage, is_transient

log = logging.getLogger("jobpool.worker")

#: The least time between two of RQ's worker heartbeats sent on their own (see `BooksWorker.heartbeat`).
HEARTBEAT_GAP_SECS = 1.0

#: How long a stopping worker waits for RQ's pubsub to close (`unsubscribe`).
UNSUBSCRIBE_WAIT_SECS = 3.0


class BooksWorker(HorseWorker):
    """RQ's worker bookkeeping, trimmed and outage-proof (see the module's docstring). jobpool's worker
    (jobpool/workers/rqworker.py) sets `outage` before its work loop starts."""

    outage: Outage
    #: Set by the first stop signal (jobpool/workers/rqworker.py, the drain).
    stop_asked: bool
    #: Set when a --burst run stopped because RQ's workers are suspended (`rq suspend`): a normal end too.
    suspended_in_burst: bool
    _last_beat = float("-inf")

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        if pipeline is not None:  # only queued: the caller's execute() meets any error
            super().heartbeat(timeout, pipeline)
            return
        # RQ beats after each job and again as its dequeue begins, both between a slot's release and the
        # next launch; its worker key lives `worker_ttl` + 60 s, and a dequeue blocks for less than
        # `worker_ttl`, so one beat a second keeps it as well (and the suspension check beats each round).
        if timeout is None and time.monotonic() - self._last_beat < HEARTBEAT_GAP_SECS:
            return
        self._last_beat = time.monotonic()
        self._best_effort("the worker's RQ heartbeat", self._pipelined, super().heartbeat, timeout)

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().set_state(state, pipeline)
            return
        if state != WorkerStatus.IDLE:
            self._best_effort("the worker's RQ state", super().set_state, state)
        elif self.get_state() != WorkerStatus.IDLE:  # else the suspension check has just written it
            # Idle: no current job. RQ's horse deletes that field as it ends, except one that said it was
            # done before writing RQ's record (workers/horses.py): the worker may be on its next job by then.
            self._best_effort("the worker's RQ state", self._pipelined, self._idle)

    def _idle(self, pipeline: Any) -> None:
        super().set_state(WorkerStatus.IDLE, pipeline)
        self.set_current_job_id(None, pipeline=pipeline)

    def _idle_and_suspended(self) -> bool:
        """The idle state and RQ's suspension check with its heartbeat (`rq.suspension.is_suspended`), in
        one round trip: whether RQ's workers are suspended (`rq suspend`)."""
        with self.connection.pipeline() as pipe:
            super().heartbeat(pipeline=pipe)
            self._idle(pipe)
            pipe.exists(WORKERS_SUSPENDED)
            return bool(pipe.execute()[-1])

    def check_for_suspension(self, burst: bool) -> None:
        """RQ's check (a read, between jobs), retried while Redis cannot serve it. Sent with the worker's
        idle state, which RQ would write in a round trip of its own as its dequeue begins."""
        backoff = Backoff()
        while True:
            try:
                if self._stop_requested or not self._idle_and_suspended():
                    return None
                super().check_for_suspension(burst)
                return None
            except StopRequested:
                self.suspended_in_burst = burst and not self.stop_asked
                raise
            except Exception as exc:
                if not is_transient(exc):
                    raise
                self.outage.failed("the worker's suspension check", exc)
                backoff.sleep()

    def _pipelined(self, write: Any, *args: Any) -> None:
        """`write(*args, pipeline=...)` sent as one round trip (RQ sends each command on its own)."""
        with self.connection.pipeline(transaction=False) as pipe:
            write(*args, pipeline=pipe)
            pipe.execute()

    def set_current_job_working_time(self, working_time: float, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().set_current_job_working_time(working_time, pipeline)
            return
        if not working_time:
            return  # RQ's reset as its horse ends: the next horse's preparation resets it in its own pipeline
        self._best_effort("the worker's RQ job time", super().set_current_job_working_time, working_time)

    def run_maintenance_tasks(self) -> None:
        self._best_effort("RQ's registry maintenance", super().run_maintenance_tasks)

    def teardown(self) -> None:
        self.close_standby()
        self._best_effort("the worker's RQ deregistration", super().teardown)

    def unsubscribe(self) -> None:
        """RQ's, within `UNSUBSCRIBE_WAIT_SECS`: closing its pubsub waits on the thread listening on it, and a
        read of that thread's that never returns kept a drained worker from exiting (seen once in this
        suite, tests/integration/test_workers_subprocess.py, its jobs all ended). The worker exits then; the
        connection goes with its process."""
        closing = threading.Thread(target=super().unsubscribe, name="rq-unsubscribe", daemon=True)
        closing.start()
        closing.join(UNSUBSCRIBE_WAIT_SECS)
        if closing.is_alive():
            log.warning("worker %s: RQ's pubsub did not close within %.0fs; exiting without it", self.name,
                        UNSUBSCRIBE_WAIT_SECS)

    def _best_effort(self, what: str, call: Any, *args: Any) -> None:
        try:
            call(*args)
        except Exception as exc:
            if not is_transient(exc):
                raise
            self.outage.failed(what, exc)

