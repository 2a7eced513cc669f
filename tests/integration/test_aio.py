"""The asyncio API (jobpool/aio.py) against a real redis-server and a real worker: it makes the jobs `Pool`
makes and refuses what `Pool` refuses, with the same typed errors and nothing written; `wait` wakes on the
job's transition (its poll is set to a minute, so a return within seconds of the end is the stream's doing),
and any number of waiters share one XREAD."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis

from jobpool import JobState, Pool, errors
from jobpool.aio import AsyncPool
from tests.support.constants import SUB
from tests.support.snapshot import keyspace

T = TypeVar("T")
#: `wait`'s poll in these tests: far longer than any wake they expect.
NO_POLL = 60.0


def run(pool: Pool, body: Callable[[AsyncPool], Awaitable[T]]) -> T:
    """`body` on an AsyncPool of the same pool and settings as `pool`, in an event loop of its own."""
    async def main() -> T:
        async with AsyncPool.from_url(pool.settings.redis_url, pool.settings.pool,
                                      executor=pool.settings.executor) as apool:
            return await body(apool)
    return asyncio.run(main())


def test_jobs_run_on_a_real_worker_and_wait_wakes_on_the_end(sub_pool: Pool,
                                                             spawn: Callable[..., Any]) -> None:
    spawn(**SUB)

    async def body(apool: AsyncPool) -> tuple[Any, ...]:
        job = await apool.enqueue("ignored", ["sh", "-c", "sleep 1; echo done"], labels={"team": "aio"})
        assert job.state in (JobState.QUEUED, JobState.RUNNING)
        done = await apool.wait(job.id, timeout=60, fallback_secs=NO_POLL)
        woke_after_ms = sub_pool.now_ms() - (done.finished_at or 0)
        running = await apool.wait(job.id, timeout=1, states="succeeded", fallback_secs=NO_POLL)
        return job, done, woke_after_ms, running, await apool.logs(job.id), await apool.events(job.id)

    job, done, woke_after_ms, running, logs, events = run(sub_pool, body)
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0
    assert woke_after_ms < 5000, f"woke {woke_after_ms} ms after the job ended: a poll, not its transition"
    assert running == done
    assert "done" in logs and logs == sub_pool.logs(job.id)
    assert events == sub_pool.events(job.id) and events[-1]["to"] == "succeeded"
    assert sub_pool.get(job.id).spec == job.spec and job.spec.labels == {"team": "aio"}


def test_the_same_jobs_and_the_same_refusals_as_the_sync_api(sub_pool: Pool, raw: redis.Redis) -> None:
    sub_pool.set_slots(0)  # nothing starts: every job stays where these calls put it

    async def body(apool: AsyncPool) -> dict[str, Any]:
        first = await apool.enqueue("img", ["a"], coalesce=True)
        again = await apool.enqueue("img", ["a"], coalesce=True)
        batch = await apool.enqueue_many([{"image": "img", "command": ["b"]},
                                          {"image": "img", "command": ["c"], "after_index": [0]},
                                          {"image": "img", "command": ["a"], "coalesce": True}], batch_size=2)
        paused = await apool.pause(batch[0].id, reason="hold it")
        resumed = await apool.resume(batch[0].id)
        cancelled = await apool.cancel(batch[0].id, reason="not needed")
        return {"first": first, "again": again, "batch": batch, "paused": paused, "resumed": resumed,
                "cancelled": cancelled, "queued": await apool.list("queued"), "all": await apool.list(),
                "events": await apool.events(count=1000)}

    got = run(sub_pool, body)
    assert got["again"].id == got["first"].id and got["again"].coalesced
    b, c, twin = got["batch"]
    assert twin.id == got["first"].id and twin.coalesced
    assert got["paused"].state is JobState.PAUSED and got["resumed"].state is JobState.QUEUED
    assert got["cancelled"].state is JobState.CANCELLED
    waiting = sub_pool.get(c.id)  # after_index named the batch's first job (a supervisor's timer judges it)
    assert waiting.state is JobState.WAITING and waiting.after == (b.id,)
    assert [j.id for j in got["queued"]] == [j.id for j in sub_pool.list("queued")] == [got["first"].id]
    assert [j.id for j in got["all"]] == [j.id for j in sub_pool.list()]
    assert got["events"] == sub_pool.events(count=1000)
    assert any(e["reason"] == "pause" and e["evidence"] == "hold it" and e["actor"] == "api"
               for e in sub_pool.events(b.id))

    before = keyspace(raw)

    async def refusals(apool: AsyncPool) -> list[type[Exception]]:
        met: list[type[Exception]] = []
        for call in (lambda: apool.get("no-such-job"), lambda: apool.enqueue("img", []),
                     lambda: apool.enqueue("img", ["x"], after=["no-such-job"]),
                     lambda: apool.enqueue_many([{"image": "img", "command": ["ok"]}, {"image": ""}]),
                     lambda: apool.pause(b.id), lambda: apool.list("sleeping"),
                     lambda: apool.wait(got["first"].id, timeout=0.2, fallback_secs=NO_POLL),
                     lambda: apool.cancel(got["first"].id, reason="x" * 100_000)):
            with pytest.raises(errors.JobpoolError) as caught:
                await call()
            met.append(type(caught.value))
        return met

    met = run(sub_pool, refusals)
    assert met == [errors.NotFound, errors.InvalidSpec, errors.InvalidSpec, errors.InvalidSpec,
                   errors.InvalidState, errors.InvalidArgument, errors.JobTimeout, errors.InvalidArgument]
    with pytest.raises(errors.InvalidSpec) as sync_caught:
        sub_pool.enqueue_many([{"image": "img", "command": ["ok"]}, {"image": ""}])
    assert sync_caught.value.index == 1
    assert keyspace(raw) == before, "a refusal writes nothing"


def test_many_waiters_share_one_reader_and_each_wakes_on_its_own_job(sub_pool: Pool, redis_url: str) -> None:
    sub_pool.set_slots(0)
    jobs = [sub_pool.enqueue("img", ["sleep", str(i)]) for i in range(20)]
    raw = redis.Redis.from_url(redis_url, decode_responses=True)

    def xreads() -> int:
        return sum(1 for c in raw.client_list() if c.get("cmd") == "xread")

    async def body(apool: AsyncPool) -> tuple[int, list[JobState], int]:
        waits = [asyncio.create_task(apool.wait(j.id, timeout=60, fallback_secs=NO_POLL)) for j in jobs]
        loop = asyncio.get_running_loop()
        for _ in range(200):  # every waiter registered, the reader blocked in XREAD
            if len(apool._waiters.by_job) == len(jobs) and await loop.run_in_executor(None, xreads) == 1:
                break
            await asyncio.sleep(0.05)
        readers = await loop.run_in_executor(None, xreads)
        # Cancelled by the sync API, from another client: each waiter wakes on its own job's event.
        started = loop.time()
        for j in jobs:
            await loop.run_in_executor(None, sub_pool.cancel, j.id)
        ended = [(await w).state for w in waits]
        assert loop.time() - started < 20, "woken by the transitions, not by the minute's poll"
        return readers, ended, len(apool._waiters.by_job)

    readers, ended, left = run(sub_pool, body)
    assert readers == 1, "twenty waiters, one XREAD"
    assert ended == [JobState.CANCELLED] * len(jobs) and left == 0
    raw.close()


def test_follow_events_yields_the_events_after_a_point_in_order_and_new_ones_as_they_come(
        sub_pool: Pool) -> None:
    sub_pool.set_slots(0)
    sub_pool.enqueue("img", ["before"])
    _, after = sub_pool.tail_events(None, 0)
    a, b = sub_pool.enqueue("img", ["a"]), sub_pool.enqueue("img", ["b"])

    async def body(apool: AsyncPool) -> tuple[list[dict[str, str]], dict[str, str], type[Exception]]:
        stream = apool.follow_events(after=after, block_secs=0.5)
        written = [await anext(stream) for _ in range(2)]
        _, now = await asyncio.get_running_loop().run_in_executor(None, sub_pool.tail_events, None, 0)
        mine = apool.follow_events(b.id, after=now, block_secs=0.5)
        coming = asyncio.ensure_future(anext(mine))  # blocks in XREAD until b's event is written
        for job in (a, b):  # a's cancel first: not b's, so not given
            await asyncio.get_running_loop().run_in_executor(None, sub_pool.cancel, job.id)
        event = await asyncio.wait_for(coming, 10)
        with pytest.raises(errors.InvalidArgument) as caught:
            apool.follow_events(after="yesterday")  # refused at once, before any iteration
        return written, event, type(caught.value)

    written, event, refused = run(sub_pool, body)
    assert [(e["job"], e["reason"]) for e in written] == [(a.id, "enqueued"), (b.id, "enqueued")]
    assert written == sub_pool.events(after=f"({after}", count=2)
    assert (event["job"], event["to"]) == (b.id, "cancelled")
    assert refused is errors.InvalidArgument


def test_a_follower_awaited_starts_from_then(sub_pool: Pool) -> None:
    """`await pool.follow_events()` fixes "from now on" at once, as `Pool.follow_events`'s call does: a
    transition made after it and before the first read is given."""
    sub_pool.set_slots(0)
    job = sub_pool.enqueue("img", ["a"])

    async def body(apool: AsyncPool) -> dict[str, str]:
        events = await apool.follow_events(job.id, block_secs=0.2)
        await asyncio.get_running_loop().run_in_executor(None, sub_pool.cancel, job.id)
        return await asyncio.wait_for(anext(events), 10)

    first = run(sub_pool, body)
    assert (first["job"], first["to"]) == (job.id, "cancelled")


def test_a_cancelled_wait_ends_cancelled_even_as_its_job_wakes_it(sub_pool: Pool) -> None:
    """A waiter cancelled in the very step its job's transition wakes it ends with CancelledError, not
    by reading the job again and waiting on until its timeout; a wait that outlasts its poll ends in
    `JobTimeout`, whatever the Python version's own timeout error."""
    sub_pool.set_slots(0)
    job = sub_pool.enqueue("img", ["a"])

    async def body(apool: AsyncPool) -> tuple[str, float, type[Exception]]:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(apool.wait(job.id, timeout=30, fallback_secs=NO_POLL))
        deadline = loop.time() + 10
        # Until the waiter awaits its wake (an asyncio.Event with a waiter of its own).
        while not any(getattr(e, "_waiters", None) for e in apool._waiters.by_job.get(job.id, ())):
            assert loop.time() < deadline, "the waiter never waited"
            await asyncio.sleep(0.01)
        started = loop.time()
        for woken in apool._waiters.by_job[job.id]:
            woken.set()
        task.cancel()
        try:
            await task
            outcome = "returned"
        except asyncio.CancelledError:
            outcome = "cancelled"
        except errors.JobTimeout:
            outcome = "timed out"
        took = loop.time() - started
        with pytest.raises(errors.JobTimeout) as caught:
            await apool.wait(job.id, timeout=0.6, fallback_secs=0.2)
        return outcome, took, type(caught.value)

    outcome, took, timed_out = run(sub_pool, body)
    assert outcome == "cancelled" and took < 5, (outcome, took)
    assert timed_out is errors.JobTimeout
