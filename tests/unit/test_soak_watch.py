"""The soak's keyspace census (bench/soak_watch.py): once retention pruned a state to its cap, a job that
leaves that state again (a failed job retried) is a row the cap no longer holds, so the census accepts one
row fewer per such job instead of reading it as a lost row (`Keyspace.fewest_rows`)."""

from __future__ import annotations

from bench.soak_watch import EventLog, Keyspace
from jobpool.api import Pool
from tests.support.attempts import claim
from tests.support.pool_helpers import Backend, enqueue


def fail(pool: Pool, job_id: str, at: int) -> None:
    """The job fails, as if at `at` (ms): each in a millisecond of its own, so retention's order is known."""
    att = claim(pool, job_id)
    att.set_container("cid", "daemon")
    att.finish("exit", 3, log_tail="")
    pool.store.client.zadd(pool.keys.state_index("failed"), {job_id: at}, xx=True)


def test_a_failed_job_retried_after_a_prune_leaves_one_row_fewer_and_the_census_accepts_it(
        backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=4, keep_failed=3)
    log = EventLog("", pool.keys, client=backend.client)
    jobs = [enqueue(pool, "run", str(i)).id for i in range(4)]
    at = pool.now_ms() - 10_000
    for i, job_id in enumerate(jobs):
        fail(pool, job_id, at + i)
    assert pool.prune().counts.get("failed") == 1, "the oldest failed job goes: three are kept"
    pool.retry(jobs[-1])  # the newest failed job leaves `failed`: the cap now holds two rows
    log.read()
    ended = log.ended()
    caps = {"succeeded": 3, "failed": 3, "cancelled": 3}
    census = Keyspace(caps, events_maxlen=100)
    rows = pool.store.client.zcard(pool.keys.state_index("failed"))
    assert (ended["failed"], rows) == (3, 2), "the log still counts the pruned job as failed"
    assert census.expected_rows(ended) == 3 and census.fewest_rows(ended, log) == 2
    assert log.reopened["failed"] == 1 and log.pruned["failed"] == 1
