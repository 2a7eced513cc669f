"""RQ's success callback (jobpool/rqjob.py `after_delivery`): RQ deletes its record of a delivery once the
job has ended (result TTL 0), and keeps it while the job may be delivered again. A row already pruned is a
job that ended: keeping RQ's record then would leave a key that nothing ever removes (the pruning that
would have taken it has already run)."""

from __future__ import annotations

import pytest
import redis
from rq.job import Job as RQJob

from jobpool.api import Pool
from jobpool.rqjob import after_delivery
from tests.support.pool_helpers import Backend, enqueue


def delivery(backend: Backend, pool: Pool, job_id: str) -> RQJob:
    job = RQJob(id=job_id, connection=backend.raw)
    job.origin = pool.keys.rq_queue_name
    job.result_ttl = -1
    return job


def test_an_ended_job_has_its_rq_record_deleted(backend: Backend, pool: Pool) -> None:
    job = enqueue(pool, "true")
    pool.cancel(job.id)
    rq = delivery(backend, pool, job.id)
    after_delivery(rq, backend.raw, None)
    assert rq.result_ttl == 0


def test_a_job_that_may_be_delivered_again_keeps_it(backend: Backend, pool: Pool) -> None:
    job = enqueue(pool, "true")  # queued: promotion reuses RQ's hash for its next delivery
    rq = delivery(backend, pool, job.id)
    after_delivery(rq, backend.raw, None)
    assert rq.result_ttl == -1


def test_a_delivery_on_a_daemons_own_queue_is_judged_by_its_pools_row(backend: Backend, pool: Pool) -> None:
    """A job with a checkpoint affinity is delivered on its daemon's queue (its RQ origin): a retry or a
    handback of it must keep RQ's record, or its next delivery is one RQ skips (no record to load)."""
    job = enqueue(pool, "true")
    rq = delivery(backend, pool, job.id)
    rq.origin = pool.keys.daemon_queue_name("jpd1:daemon@boot")
    after_delivery(rq, backend.raw, None)
    assert rq.result_ttl == -1
    pool.cancel(job.id)
    after_delivery(rq, backend.raw, None)
    assert rq.result_ttl == 0


def test_a_row_already_pruned_has_its_rq_record_deleted(backend: Backend, pool: Pool) -> None:
    job = enqueue(pool, "true")
    pool.cancel(job.id)
    backend.raw.delete(pool.keys.job(job.id))  # what prune.lua leaves of the row: nothing
    rq = delivery(backend, pool, job.id)
    after_delivery(rq, backend.raw, None)
    assert rq.result_ttl == 0


def test_redis_away_keeps_it(backend: Backend, pool: Pool) -> None:
    job = enqueue(pool, "true")
    pool.cancel(job.id)
    rq = delivery(backend, pool, job.id)
    away = redis.Redis(port=1, socket_connect_timeout=0.2)  # nothing listens on port 1
    after_delivery(rq, away, None)
    assert rq.result_ttl == -1


@pytest.mark.parametrize("origin", ["", "not-a-jobpool-queue", "jobpool:bad name"])
def test_a_queue_that_is_not_a_pool_keeps_it(backend: Backend, pool: Pool, origin: str) -> None:
    rq = delivery(backend, pool, "0" * 32)
    rq.origin = origin
    after_delivery(rq, backend.raw, None)
    assert rq.result_ttl == -1
