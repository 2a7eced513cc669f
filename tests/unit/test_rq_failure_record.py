"""RQ's failure record of a delivery whose job has no row (jobpool/workers/rqworker.py
`JobpoolWorker.handle_job_failure`, scripts/forget_rq_failure.lua), against a real redis-server through RQ's
own failure path.

The case, as a soak met it: a worker took a job, then Redis went back to a file older than the job (a
rollback). RQ's worker wrote its "started" fields of the job into the Redis that had lost it (a hash of four
fields, with no payload), the horse could not load it and died, and RQ recorded the delivery as failed: a
job hash and a result stream that never expire (a jobpool job's RQ record goes with its row) and that no row
names, for ever. The record is deleted once written; a job that has its row keeps RQ's record until its row
is pruned, as before. A worker killed during such a delivery leaves it to RQ's maintenance in another
worker (`JobpoolWorker.clean_registries`), which deletes it the same way."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from rq.job import Job
from rq.results import Result

from jobpool import errors
from jobpool.api import Pool
from jobpool.config import Settings
from jobpool.contract import ADOPT_RQ_PREFIX, JobState
from jobpool.store.redisurl import connect
from jobpool.workers.boot import Boot
from jobpool.workers.rqworker import JobpoolWorker
from jobpool.workers.runtime import Runtime
from tests.support.pool_helpers import Backend
from tests.support.servers import RedisServer

DAEMON = "jpd1:" + "f" * 32 + "@boot-1"
HORSE_DIED = "Work-horse terminated unexpectedly; waitpid returned 256"


@contextlib.contextmanager
def taken(url: str) -> Iterator[tuple[JobpoolWorker, Pool, redis.Redis, Job]]:
    """A worker, its pool, a client, and a job promoted and taken by the worker (RQ's loaded job)."""
    settings = Settings(redis_url=url, pool="failures")
    pool = Pool(connect(url), settings)
    boot = Boot(pool.store, "docker", DAEMON)
    w = JobpoolWorker(Runtime(store=pool.store, boot_id=boot.id, daemon_id=DAEMON), boot)
    with contextlib.closing(pool):
        pool.set_slots(1)
        job_id = pool.enqueue("img", ["true"]).id
        yield w, pool, redis.Redis.from_url(url), Job.fetch(job_id, connection=w.connection,
                                                            serializer=w.serializer)


def rq_keys(client: redis.Redis, job_id: str) -> list[str]:
    return [str(k) for k in client.keys(f"rq:*{job_id}*")]


def test_a_failed_delivery_of_a_job_redis_lost_leaves_no_rq_record(redis_url: str) -> None:
    with taken(redis_url) as (w, pool, admin, job):
        queue = w.queues[-1]
        # Redis goes back to before the job: its row and RQ's record gone, as all of it is.
        admin.flushall()
        # RQ's worker prepares the delivery it took in the Redis that lost it: the hash the horse cannot load.
        admin.hset(f"rq:job:{job.id}", mapping={"status": "started", "worker_name": w.name,
                                                "started_at": "2026-12-04T22:03:46.184427Z",
                                                "last_heartbeat": "2026-12-04T22:03:46.184427Z"})
        w.handle_job_failure(job, queue, exc_string=HORSE_DIED)
        assert rq_keys(admin, job.id) == []
        assert admin.zscore(queue.failed_job_registry.key, job.id) is None
        assert not admin.exists(pool.keys.job(job.id)), "and no row made"


def test_a_failed_delivery_of_a_job_with_its_row_keeps_rqs_record(redis_url: str) -> None:
    with taken(redis_url) as (w, pool, admin, job):
        queue = w.queues[-1]
        w.handle_job_failure(job, queue, exc_string=HORSE_DIED)
        assert Job.fetch(job.id, connection=w.connection, serializer=w.serializer).get_status() == "failed"
        assert Result.fetch_latest(job, serializer=w.serializer) is not None
        assert admin.zscore(queue.failed_job_registry.key, job.id) is not None
        assert pool.get(job.id).state is JobState.RUNNING, "the row is the supervisor's to judge"


def test_the_script_checks_its_keys_and_changes_nothing_for_a_row(backend: Backend) -> None:
    pool = backend.pool()
    store, k, c = pool.store, pool.keys, pool.store.client
    c.hset(k.rq_job("j1"), "status", "failed")
    c.xadd(k.rq_results("j1"), {"type": "2"})
    c.zadd("rq:failed:q", {"j1": 1})
    c.hset(k.job("j1"), "state", "failed")
    # Another id's key, and another pool's row (which this pool's job j1 does not have): refused.
    for row, rq_job in ((k.job("j1"), k.rq_job("j2")), ("jobpool:{other}:job:j1", k.rq_job("j1"))):
        with pytest.raises(errors.InvalidArgument):
            store.run("forget_rq_failure", [row, rq_job, k.rq_results("j1"), "rq:failed:q"], ["j1"])
    assert store.forget_rq_failure("j1", "rq:failed:q") is False
    assert c.exists(k.rq_job("j1"), k.rq_results("j1")) == 2 and c.zscore("rq:failed:q", "j1") == 1
    c.delete(k.job("j1"))
    # A registry of another type (edited by hand) fails the call before anything is deleted.
    c.set("rq:failed:junk", "x")
    with pytest.raises(errors.JobpoolError):
        store.forget_rq_failure("j1", "rq:failed:junk")
    assert c.exists(k.rq_job("j1"), k.rq_results("j1")) == 2
    assert store.forget_rq_failure("j1", "rq:failed:q") is True
    assert c.exists(k.rq_job("j1"), k.rq_results("j1")) == 0 and c.zscore("rq:failed:q", "j1") is None
    assert store.forget_rq_failure("j1", "rq:failed:q") is False, "nothing left to delete"


def test_an_adoption_requests_record_is_left_to_the_supervisor(redis_url: str) -> None:
    # An adoption request has no row of its own (its RQ id is not a job's): RQ's record of it stays.
    with taken(redis_url) as (w, _, admin, job):
        job_id = f"{ADOPT_RQ_PREFIX}{job.id}-1"
        request = Job.create(func=print, id=job_id, connection=w.connection, serializer=w.serializer,
                             origin=w.queues[-1].name)
        request.save()
        w.handle_job_failure(request, w.queues[-1], exc_string=HORSE_DIED)
        assert admin.exists(f"rq:job:{job_id}") and admin.zscore(request.failed_job_registry.key, job_id)


def test_a_redis_that_fails_the_check_leaves_a_warning_and_the_worker_goes_on(
        redis_server_factory: Callable[[], RedisServer], caplog: pytest.LogCaptureFixture) -> None:
    server = redis_server_factory()
    server.start()
    with taken(server.url) as (w, _, _, job):
        server.stop()
        with caplog.at_level(logging.WARNING, logger="jobpool.worker"):
            w.handle_job_failure(job, w.queues[-1], exc_string=HORSE_DIED)
    assert any(f"could not check that job {job.id} has a row" in r.getMessage() for r in caplog.records)


def abandoned(admin: redis.Redis, w: JobpoolWorker, job: Job) -> None:
    """The delivery of `job` as a worker killed during it leaves it: RQ's entry in the queue's started
    registry, past its score (the dead worker no longer renews it), that RQ's maintenance cleans up."""
    queue = w.queues[-1]
    admin.zadd(queue.started_job_registry.key, {f"{job.id}:execution-1": 1})


def test_a_delivery_of_a_job_redis_lost_abandoned_by_a_killed_worker_leaves_no_rq_record(
        redis_url: str) -> None:
    """RQ's maintenance (in any live worker) records an abandoned delivery failed: jobpool's worker deletes
    that record again when the job has no row (rqworker.py `clean_registries`)."""
    with taken(redis_url) as (w, pool, admin, job):
        queue = w.queues[-1]
        admin.flushall()
        admin.hset(f"rq:job:{job.id}", mapping={"status": "started", "worker_name": "a-dead-worker",
                                                "started_at": "2026-12-04T22:03:46.184427Z",
                                                "last_heartbeat": "2026-12-04T22:03:46.184427Z"})
        abandoned(admin, w, job)
        w.clean_registries()
        assert admin.zcard(queue.started_job_registry.key) == 0, "RQ's maintenance ran"
        assert rq_keys(admin, job.id) == []
        assert admin.zscore(queue.failed_job_registry.key, job.id) is None
        assert not admin.exists(pool.keys.job(job.id)), "and no row made"


def test_an_abandoned_delivery_rq_records_failed_of_a_job_without_row_leaves_no_rq_record(
        redis_url: str) -> None:
    """RQ's whole record, its row gone (a Redis that lost only the row's write): RQ's maintenance records
    the abandoned delivery failed, and that record goes again."""
    with taken(redis_url) as (w, pool, admin, job):
        queue = w.queues[-1]
        admin.delete(pool.keys.job(job.id))
        abandoned(admin, w, job)
        w.clean_registries()
        assert admin.zcard(queue.started_job_registry.key) == 0, "RQ's maintenance ran"
        assert rq_keys(admin, job.id) == []
        assert admin.zscore(queue.failed_job_registry.key, job.id) is None


def test_a_delivery_still_in_its_registry_is_left_alone(redis_url: str) -> None:
    """A delivery whose entry is not past its score (its worker lives) is not RQ's maintenance's, nor
    this: its record stays, row or not."""
    with taken(redis_url) as (w, pool, admin, job):
        queue = w.queues[-1]
        admin.delete(pool.keys.job(job.id))
        admin.zadd(queue.started_job_registry.key, {f"{job.id}:execution-1": time.time() + 30})
        w.clean_registries()
        assert admin.zcard(queue.started_job_registry.key) == 1
        assert admin.exists(f"rq:job:{job.id}")


def test_an_abandoned_delivery_of_a_job_with_its_row_keeps_rqs_record(redis_url: str) -> None:
    with taken(redis_url) as (w, pool, admin, job):
        queue = w.queues[-1]
        abandoned(admin, w, job)
        w.clean_registries()
        assert Job.fetch(job.id, connection=w.connection, serializer=w.serializer).get_status() == "failed"
        assert admin.zscore(queue.failed_job_registry.key, job.id) is not None
        assert pool.get(job.id).state is JobState.RUNNING, "the row is the supervisor's to judge"
