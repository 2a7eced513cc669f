"""The pool's history (jobpool/trends.py, scripts/trend_sample.lua) on fakeredis[lua] and a real redis-server:
a point is recorded once whoever tries, only once its span has ended, with the gauges at its end; the history
never holds more than TREND_POINTS points; throughput is the difference of adjacent points' totals, a gap
gives none; the percentiles are those of the jobs that ended in the point's span."""

from __future__ import annotations

import json

import pytest

from jobpool import errors
from jobpool.api import Pool
from jobpool.contract import TREND_POINTS
from jobpool.store.trendreads import EndedTimes
from jobpool.trends import Sampler, percentile, percentiles_arg, read_trends
from tests.support.attempts import claim
from tests.support.pool_helpers import Backend, enqueue

WIDTH = 60_000
#: The percentiles of a point for which no job was read.
NONE = "||||0"


def finish(pool: Pool, job_id: str, code: int = 0) -> None:
    att = claim(pool, job_id)
    att.set_container("cid", "daemon")
    att.finish("exit", code, log_tail="")


def ended_at(pool: Pool, job_id: str, created: int, claimed: int | None, finished: int) -> None:
    """Move a finished job's times (row and state index) to `finished`, as if it had ended then."""
    c = pool.store.client
    c.hset(pool.keys.job(job_id), mapping={"created_at": created, "finished_at": finished})
    if claimed is None:
        c.hdel(pool.keys.job(job_id), "claimed_at")
    else:
        c.hset(pool.keys.job(job_id), "claimed_at", claimed)
    c.zadd(pool.keys.state_index(pool.get(job_id).state.value), {job_id: finished}, xx=True)


def last_point(pool: Pool, width: int = WIDTH) -> int:
    return pool.now_ms() // width - 1


def test_a_point_is_recorded_once_with_the_gauges_at_its_end(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=3)
    jobs = [enqueue(pool, "run", str(i)) for i in range(5)]
    pool.promote()
    finish(pool, jobs[0].id)
    pool.store.client.set(pool.keys.last_sweep, json.dumps({"unknown": 2, "rows": 3}))
    point = last_point(pool)
    assert pool.store.trend_sample(point, WIDTH, "1|2|3|4|5") is True
    assert pool.store.trend_sample(point, WIDTH, "9|9|9|9|9") is False, "a second supervisor records nothing"
    [p] = read_trends(pool.store)
    assert (p.at_ms, p.width_ms) == (point * WIDTH, WIDTH)
    assert (p.queued, p.waiting, p.running, p.slots_used, p.slots_max, p.unknown) == (1, 0, 3, 3, 3, 2)
    assert (p.wait_p50_ms, p.wait_p95_ms, p.run_p50_ms, p.run_p95_ms, p.sampled) == (1, 2, 3, 4, 5)
    assert p.finished == {"succeeded": None, "failed": None, "cancelled": None}, "no point before it"


def test_a_point_not_ended_or_bad_input_is_refused_and_writes_nothing(backend: Backend) -> None:
    pool = backend.pool()
    enqueue(pool, "run")
    before = backend.keyspace()
    now_point = pool.now_ms() // WIDTH
    for args in [(now_point, WIDTH, NONE), (now_point + 5, WIDTH, NONE), (-1, WIDTH, NONE), (1, 0, ""),
                 (1, WIDTH, "1|x"), (1, WIDTH, ""), (1.5, WIDTH, NONE)]:
        with pytest.raises(errors.InvalidArgument):
            pool.store.trend_sample(*args)  # type: ignore[arg-type]
    assert backend.keyspace() == before


def test_the_history_keeps_a_fixed_number_of_points(backend: Backend) -> None:
    pool = backend.pool()
    newest = last_point(pool, 1000)
    for point in range(newest - TREND_POINTS - 40, newest + 1):
        assert pool.store.trend_sample(point, 1000, NONE)
    assert pool.store.client.hlen(pool.keys.trends) == TREND_POINTS
    points = read_trends(pool.store, now_ms=(newest + 1) * 1000)
    assert len(points) == TREND_POINTS, "read at the span the points were recorded at, whatever the reader's"
    assert points[0].at_ms == (newest - TREND_POINTS + 1) * 1000 and points[-1].at_ms == newest * 1000


def test_points_of_a_span_changed_since_are_left_out(backend: Backend) -> None:
    pool = backend.pool()
    minute = last_point(pool)
    pool.store.trend_sample(minute - 2, WIDTH, NONE)
    pool.store.trend_sample(minute - 1, WIDTH, NONE)
    second = last_point(pool, 1000)
    pool.store.trend_sample(second, 1000, NONE)
    [p] = read_trends(pool.store)
    assert (p.at_ms, p.width_ms) == (second * 1000, 1000)


def test_throughput_is_the_difference_of_adjacent_points_and_a_gap_gives_none(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2)
    p = last_point(pool)
    pool.store.trend_sample(p - 3, WIDTH, NONE)
    jobs = [enqueue(pool, "run", str(i)) for i in range(4)]
    pool.promote()
    pool.cancel(jobs[2].id)  # queued: cancelled at once
    finish(pool, jobs[0].id)
    finish(pool, jobs[1].id, code=3)
    pool.store.trend_sample(p - 2, WIDTH, NONE)
    finish(pool, jobs[3].id)
    pool.store.trend_sample(p, WIDTH, NONE)  # p - 1 missing: no supervisor recorded it
    points = read_trends(pool.store)
    assert [x.at_ms for x in points] == [(p - 3) * WIDTH, (p - 2) * WIDTH, p * WIDTH]
    assert points[1].finished == {"succeeded": 1, "failed": 1, "cancelled": 1}
    assert points[2].finished == {"succeeded": None, "failed": None, "cancelled": None}
    assert points[1].running == 1 and points[2].running == 0


def test_the_sampler_records_the_last_ended_point_with_the_percentiles_of_its_jobs(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=3, trend_secs=60)
    point = last_point(pool)
    start = point * WIDTH
    jobs = [enqueue(pool, "run", str(i)) for i in range(4)]
    pool.promote()
    pool.cancel(jobs[3].id)  # queued: cancelled without running
    for job in jobs[:3]:
        finish(pool, job.id)
    # Waits of 1, 2 and 30 s, runs of 10, 20 and 5 s; the cancelled job never ran.
    ended_at(pool, jobs[0].id, start, start + 1000, start + 11_000)
    ended_at(pool, jobs[1].id, start, start + 2000, start + 22_000)
    ended_at(pool, jobs[2].id, start, start + 30_000, start + 35_000)
    ended_at(pool, jobs[3].id, start, None, start + 40_000)
    sampler = Sampler()
    assert sampler(pool.store, "test") is True
    assert sampler(pool.store, "test") is False, "nothing more until the next point ends"
    [p] = read_trends(pool.store)
    assert p.at_ms == start and p.sampled == 4
    assert (p.wait_p50_ms, p.wait_p95_ms, p.run_p50_ms, p.run_p95_ms) == (2000, 30_000, 10_000, 20_000)
    assert Sampler()(pool.store, "another supervisor") is False, "recorded once whoever tries"


def test_percentiles_are_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([7], 95) == 7
    assert [percentile(list(range(1, 101)), p) for p in (50, 95, 100)] == [50, 95, 100]
    assert percentiles_arg([EndedTimes(0, None, 5)]) == "||||1"
    assert percentiles_arg([EndedTimes(0, 3, 10), EndedTimes(5, 4, 4)]) == "0|3|0|7|2"
