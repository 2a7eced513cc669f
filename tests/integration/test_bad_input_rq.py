"""Junk on the pool's RQ queue, on a real redis-server with real worker processes: ids no job has, late and
early deliveries of real jobs, entries RQ itself cannot load. A worker refuses each without running anything,
keeps running, and runs the good jobs after; the rows of the other jobs are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from jobpool import JobState, Pool
from jobpool.workers.attempt import Attempt
from tests.support.attempts import claim
from tests.support.bad_input import UNKNOWN_ID, alive, rows, runs_to_success
from tests.support.constants import SUB
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess


def test_a_worker_skips_junk_rq_ids_and_stale_attempts_and_runs_the_next_job(
        sub_pool: Pool, raw: redis.Redis, spawn: Callable[..., JobpoolProcess]) -> None:
    pool = sub_pool
    pool.set_slots(5)
    # A job that already ran (its RQ job hash is still there): a late duplicate delivery of attempt 1.
    done = pool.enqueue("ignored", ["sh", "-c", "echo done"])
    raw.lrem(pool.keys.rq_queue, 0, done.id)
    Attempt(pool.store, done.id, "oldboot", 1).claim()
    Attempt(pool.store, done.id, "oldboot", 1).finish("exit", 0)
    # A running job another (live) boot owns: a duplicate delivery of its current attempt.
    owned = pool.enqueue("ignored", ["sh", "-c", "echo owned"])
    raw.lrem(pool.keys.rq_queue, 0, owned.id)
    claim(pool, owned.id, "otherboot")
    raw.pexpire(pool.keys.lease(owned.id), 120_000)
    # A queued job not yet promoted (RQ's record of it is made at promotion: RQ skips an id it has no record
    # of): delivered before its time.
    pool.pause()
    early = pool.enqueue("ignored", ["sh", "-c", "echo early"])
    # Garbage rows no worker was asked about: they must not matter.
    spoilt = pool.enqueue("ignored", ["sh", "-c", "echo spoilt"])
    pool.pause(spoilt.id)
    raw.hset(pool.keys.job(spoilt.id), "spec", "{not json")
    raw.zadd(pool.keys.running, {"ghost" + UNKNOWN_ID[5:]: 1})
    raw.set(pool.keys.lease(UNKNOWN_ID), "garbage")
    others = [done.id, owned.id]
    before = rows(pool, others)
    raw.rpush(pool.keys.rq_queue, UNKNOWN_ID, done.id, owned.id, early.id)
    raw.sadd("rq:queues", pool.keys.rq_queue)

    worker = spawn(**SUB)
    eventually(lambda: alive(worker) and raw.llen(pool.keys.rq_queue) == 0, timeout=20,
               message="the worker took every junk id")
    eventually(lambda: alive(worker) and worker.log().count("not claimed") >= 2, timeout=10,
               message="the worker refused the two stale deliveries")
    assert pool.get(early.id).state is JobState.QUEUED and pool.get(early.id).attempt == 0
    pool.resume()
    good = pool.enqueue("ignored", ["sh", "-c", "echo good"])
    assert runs_to_success(pool, early.id, (worker,), 20).attempt == 1
    runs_to_success(pool, good.id, (worker,), 20)
    assert pool.logs(early.id).strip() == "early" and pool.logs(good.id).strip() == "good"
    assert rows(pool, others) == before
    alive(worker)


@pytest.mark.parametrize("junk", ["id", "hash"])
def test_a_worker_survives_an_rq_entry_rq_cannot_load(sub_pool: Pool, raw: redis.Redis,
                                                      spawn: Callable[..., JobpoolProcess],
                                                      junk: str) -> None:
    pool = sub_pool
    pool.set_slots(1)
    if junk == "id":
        raw.rpush(pool.keys.rq_queue, "not a {job} id\n")
    else:
        raw.hset("rq:job:" + UNKNOWN_ID, mapping={"created_at": "x", "data": "garbage", "status": "queued"})
        raw.rpush(pool.keys.rq_queue, UNKNOWN_ID)
    raw.sadd("rq:queues", pool.keys.rq_queue)
    worker = spawn(**SUB)
    eventually(lambda: alive(worker) and raw.llen(pool.keys.rq_queue) == 0, timeout=20,
               message="the worker took the junk")
    good = pool.enqueue("ignored", ["sh", "-c", "echo good"])
    runs_to_success(pool, good.id, (worker,), 15)
