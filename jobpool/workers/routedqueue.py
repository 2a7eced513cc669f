"""`RoutedQueue`: how a worker takes its next job from its queues (docs/architecture.md, "Workers").

A worker listens on its daemon's own queue (routed adoption requests: supervisor/adoption.py) before the
pool's. RQ's dequeue pops several queues with BLPOP, which keeps no intermediate list, and the supervisor
reads that list (supervisor/evidence.py); so here each queue is moved one at a time, the daemon's looked at
in the same round trip as the pool's block ends. A worker whose daemon's identity is not trusted takes
nothing (jobpool/fleet/daemonmark.py), and a dropped connection is left to the worker's own outage wait
(jobpool/workers/outage.py).
"""

from __future__ import annotations

import time
from typing import Any

import redis
from rq import Queue
from rq.exceptions import DequeueTimeout
from rq.intermediate_queue import IntermediateQueue
from rq.utils import as_text

from ..store.rqconnection import block_then_look
from .outage import OutageError, is_transient

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


class RoutedQueue(Queue):
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
