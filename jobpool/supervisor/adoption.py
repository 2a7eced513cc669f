"""Adoption requests: asking a live worker to re-attach to an orphan's running container.

The supervisor never writes ownership (docs/architecture.md, 'Rules the verdicts encode, and why'): it
enqueues an RQ job on the queue only the workers on the container's daemon listen on (docs/architecture.md,
"Many hosts"), which one of them runs, and the worker's `adopt` is a
compare-and-set refused while the old owner's lease exists or when the daemon identity differs. Each request
is a fresh RQ job; `PoolKeys.adoption(job)` names the latest, so a request is asked again only once the
latest one ended or its worker died.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

import redis
from rq import Queue
from rq.exceptions import DuplicateJobError
from rq.serializers import JSONSerializer

from ..contract import ADOPT_RQ_PREFIX
from ..errors import Conflict
from ..fleet.daemonid import is_identity
from ..store.calls import Store
from ..store.keys import worker_name
from ..store.runner import call_redis
from .verdicts import RowSnapshot

log = logging.getLogger("jobpool.supervisor")

#: The RQ function a live worker runs to re-attach to an orphaned running container (jobpool.workers).
ADOPT_ENTRY_POINT = "jobpool.workers.entry.adopt_job"
#: An adoption request still waiting for a worker: do not ask again. A "started" one is pending only while
#: the worker running it lives (a SIGKILLed adopter leaves "started" behind for good).
ADOPT_WAITING = frozenset({"queued", "deferred", "scheduled", "created"})
#: How long the pointer to the latest adoption request of a job is kept.
ADOPT_REQUEST_TTL_SECS = 86400


def adopt_rq_job_id(job_id: str, attempt: int) -> str:
    """A fresh RQ job id for one adoption request. Never reused: RQ's registries still name an earlier
    request (a dead adopter's stays in the started registry until RQ cleans it up, which would fail a new
    request that had the same id)."""
    return f"{ADOPT_RQ_PREFIX}{job_id}-{attempt}-{uuid.uuid4().hex[:12]}"


class Adoptions:
    """The adoption requests of one pool. Holds the RQ connection (opened on first use), which only RQ's own
    `Queue` uses: the pointers and RQ's statuses are read and written through the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._rq_client: redis.Redis | None = None

    def close(self) -> None:
        if self._rq_client is not None:
            self._rq_client.close()
            self._rq_client = None

    def rq_client(self) -> redis.Redis:
        """RQ needs a client that does not decode replies; built the way RQ rebuilds connections."""
        if self._rq_client is None:
            self._rq_client = self.store.rq_client()
        return self._rq_client

    def pending(self, rows: Sequence[RowSnapshot]) -> set[str]:
        """Ids of the rows whose latest adoption request still waits for a worker, or is being run by a
        worker that lives (two round trips, plus one for the boots of "started" ones)."""
        if not rows:
            return set()
        store = self.store
        requests = {row.id: r for row, r in zip(rows, store.adoption_requests([row.id for row in rows]),
                                                strict=True) if r}
        if not requests:
            return set()
        found = dict(zip(requests, store.rq_job_status(list(requests.values())), strict=True))
        pending = {job_id for job_id, (status, _) in found.items() if status in ADOPT_WAITING}
        started = {job_id: worker for job_id, (status, worker) in found.items() if status == "started"}
        live = self.live_workers(set(started.values()))
        return pending | {job_id for job_id, worker in started.items() if worker in live}

    def live_workers(self, names: set[str]) -> set[str]:
        """Which of these RQ worker names belong to a jobpool worker whose boot record lives. RQ's own worker
        key outlives a SIGKILLed worker by its worker_ttl (minutes); the boot record by one lease."""
        if not names:
            return set()
        by_name = {worker_name(self.store.keys.pool, b): b for b in self.store.fleet_boots()}
        mine = {n: by_name[n] for n in names if n in by_name}
        if not mine:
            return set()
        alive = self.store.boots_alive(list(mine.values()))
        return {n for n, live in zip(mine, alive, strict=True) if live}

    def queue_for(self, row: RowSnapshot) -> str:
        """Where a request for this row goes: the queue only the workers on its daemon listen on
        (`PoolKeys.daemon_queue_name`), so no worker on another daemon ever takes it; the pool's queue for a
        row with no daemon identity (recorded before identities), which any worker takes and all refuse."""
        if is_identity(row.daemon_id):
            return self.store.keys.daemon_queue_name(row.daemon_id)
        return self.store.keys.rq_queue_name

    def request(self, row: RowSnapshot) -> str:
        """Ask a live worker to re-attach to this orphan's running container, unless a request is pending.

        The supervisor never writes ownership: the worker's `adopt` is a compare-and-set refused while the
        old owner's lease exists. Each request is a new RQ job; `adoption(job)` names the latest, and the
        WATCH on it makes two supervisors asking at once enqueue one request.
        """
        if row.id in self.pending([row]):
            return "adoption pending"
        rq_id = adopt_rq_job_id(row.id, row.attempt)
        try:
            self.store.repoint_adoption(row.id, rq_id, ADOPT_REQUEST_TTL_SECS)
            queue = Queue(self.queue_for(row), connection=self.rq_client(), serializer=JSONSerializer)
            call_redis(
                queue.enqueue_call, func=ADOPT_ENTRY_POINT, args=[row.id, row.owner_boot, row.attempt],
                job_id=rq_id, timeout=-1, result_ttl=600, failure_ttl=600, unique=True,
                description=f"jobpool adopt {row.id} attempt {row.attempt} from {row.owner_boot}",
                what="adoption request")
        except (Conflict, DuplicateJobError):
            return "adoption pending"  # another supervisor asked in the same moment
        log.info("job %s attempt %d: owner %s gone, container running: adoption requested (%s)",
                 row.id, row.attempt, row.owner_boot, rq_id)
        return "adoption requested"
