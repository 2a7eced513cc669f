"""Time and dependencies in the scripts (scripts/_lib.lua "Time and dependencies", release_waiting.lua,
retry_job.lua, enqueue.lua's holds, end_running's retries), on fakeredis[lua] and a real redis-server: a
job held by a start time or by the jobs it waits for is `waiting`, holds no slot, and is judged again by one
script per step; a failed dependency cancels its dependents one link per step; retries wait and come back
as new attempts; crash recovery stays apart; an operator's retry runs a job again with its history kept.
"""

from __future__ import annotations

import datetime
import time
from typing import cast

import pytest

from jobpool import errors
from jobpool.api import Pool
from jobpool.supervisor.timers import release_due
from tests.support.attempts import claim
from tests.support.pool_helpers import Backend, enqueue, events_of, index_of, reconcile, row, state_of


def release(pool: Pool) -> int:
    return release_due(pool.store, "test")


def run_to_end(pool: Pool, job_id: str, code: int, boot: str = "boot-a") -> str:
    """Claim the job's current attempt and finish it with exit `code`; its state after."""
    assert state_of(pool, job_id) == "running", f"{job_id} is {state_of(pool, job_id)}, not running"
    return claim(pool, job_id, boot).finish("exit", exit_code=code)


def waiting_ids(pool: Pool) -> list[str]:
    return cast("list[str]", pool.store.client.zrange(pool.keys.waiting, 0, -1))


def dependents(pool: Pool) -> list[str]:
    return cast("list[str]", pool.store.client.zrange(pool.keys.dependents, 0, -1))


# ---- delayed starts ---------------------------------------------------------------------------------------


def test_a_delayed_job_waits_holding_no_slot_then_is_queued_when_due(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2)
    later = enqueue(pool, "later", not_before=time.time() + 3600)
    # Two seconds ahead: still to come after the checks below on a slow run, soon enough to wait for.
    soon = enqueue(pool, "soon", not_before=datetime.datetime.now(datetime.timezone.utc)
                   + datetime.timedelta(seconds=2))
    now = enqueue(pool, "now")
    assert (later.state.value, soon.state.value, now.state.value) == ("waiting", "waiting", "running")
    assert pool.slots() == (1, 2) and index_of(pool, later.id) == ["waiting"]
    assert pool.get(later.id).wait_reason == "not_before" and pool.get(later.id).wait_until
    assert release(pool) == 0  # nothing due yet
    deadline = time.monotonic() + 10
    while state_of(pool, soon.id) == "waiting":
        assert time.monotonic() < deadline, "the delayed job was never released"
        release(pool)
    assert state_of(pool, soon.id) == "running" and state_of(pool, later.id) == "waiting"
    kinds = [(e["from"], e["to"], e["reason"]) for e in events_of(pool, soon.id)]
    assert kinds[:3] == [("", "waiting", "enqueued"), ("waiting", "queued", "wait_over"),
                         ("queued", "running", "promoted")]
    assert events_of(pool, later.id)[0]["evidence"].startswith("until ")


def test_a_start_time_already_past_queues_at_once(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    job = enqueue(pool, not_before=time.time() - 60)
    assert job.state.value == "queued" and not waiting_ids(pool)


@pytest.mark.parametrize("bad", [datetime.datetime(2030, 1, 1), "tomorrow", True, float("nan"), -5,
                                 pytest.param(time.time() + 400 * 86400, id="over-a-year-ahead")])
def test_a_bad_start_time_is_refused_and_writes_nothing(backend: Backend, bad: object) -> None:
    pool = backend.pool()
    enqueue(pool)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidSpec, match="not_before"):
        enqueue(pool, not_before=bad)
    assert backend.keyspace() == before


def test_a_released_job_takes_its_priority_ahead_of_queued_ones(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    first = enqueue(pool, "busy")
    low = [enqueue(pool, "low", str(i)) for i in range(2)]
    high = enqueue(pool, "high", priority=5, not_before=time.time() + 0.2)
    deadline = time.monotonic() + 10
    while state_of(pool, high.id) == "waiting":
        assert time.monotonic() < deadline
        release(pool)
    run_to_end(pool, first.id, 0)
    assert state_of(pool, high.id) == "running" and {state_of(pool, j.id) for j in low} == {"queued"}


# ---- dependencies -----------------------------------------------------------------------------------------


def test_a_dependent_waits_until_every_dependency_succeeded(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2)
    a, b = enqueue(pool, "a"), enqueue(pool, "b")
    c = enqueue(pool, "c", after=[a.id, b.id, a.id])
    assert c.state.value == "waiting" and pool.get(c.id).after == (a.id, b.id)
    assert sorted(dependents(pool)) == sorted([f"{a.id} {c.id}", f"{b.id} {c.id}"])
    run_to_end(pool, a.id, 0)
    assert release(pool) == 0 and state_of(pool, c.id) == "waiting"  # b has not succeeded yet
    run_to_end(pool, b.id, 0)
    assert release(pool) == 1 and state_of(pool, c.id) == "running"
    assert not dependents(pool) and not pool.store.client.hgetall(pool.keys.deps)


def test_a_job_after_one_that_succeeded_already_is_queued_at_once(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    a = enqueue(pool)
    run_to_end(pool, a.id, 0)
    assert enqueue(pool, after=[a.id]).state.value == "running"


def test_waiting_for_a_job_that_does_not_exist_is_refused_and_writes_nothing(backend: Backend) -> None:
    pool = backend.pool()
    enqueue(pool)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidSpec, match="does not exist"):
        enqueue(pool, after=["f" * 32])
    with pytest.raises(errors.InvalidSpec, match="not a job id"):
        enqueue(pool, after=["has space"])
    with pytest.raises(errors.InvalidSpec, match="coalesce"):
        enqueue(pool, after=[], not_before=time.time() + 60, coalesce=True)
    with pytest.raises(errors.InvalidSpec, match="after_index"):
        pool.enqueue_many([{"image": "i", "command": ["x"], "after_index": [0]}])
    assert backend.keyspace() == before


def test_a_failed_dependency_cancels_a_chain_one_link_per_step(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    a, b, c = pool.enqueue_many([{"image": "i", "command": ["a"]},
                                 {"image": "i", "command": ["b"], "after_index": [0]},
                                 {"image": "i", "command": ["c"], "after_index": [1]}])
    assert [a.state.value, b.state.value, c.state.value] == ["running", "waiting", "waiting"]
    assert run_to_end(pool, a.id, 3) == "failed"
    due = pool.store.due_waiting(pool.now_ms(), 10)
    assert due == [b.id]  # c is not due: b has not ended
    assert pool.store.release_waiting(due, "test") == (0, 1, 0)
    assert pool.store.due_waiting(pool.now_ms(), 10) == [c.id]
    assert pool.store.release_waiting([c.id], "test") == (0, 1, 0)
    for job, dep, how in ((b, a, "failed"), (c, b, "cancelled")):
        got = pool.get(job.id)
        assert (got.state.value, got.error_reason) == ("cancelled", "dependency_failed")
        assert events_of(pool, job.id)[-1]["evidence"] == f"job {dep.id} {how}"
    assert not dependents(pool) and not waiting_ids(pool)


def test_a_job_enqueued_after_a_failed_one_is_cancelled_by_the_next_release(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    a = enqueue(pool)
    pool.cancel(a.id)
    b = enqueue(pool, after=[a.id])
    assert b.state.value == "waiting" and pool.store.due_waiting(pool.now_ms(), 5) == [b.id]
    release(pool)
    assert (state_of(pool, b.id), pool.get(b.id).error_reason) == ("cancelled", "dependency_failed")


def test_a_release_sent_twice_or_stale_changes_nothing_twice(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    a = enqueue(pool)
    b = enqueue(pool, after=[a.id])
    pool.cancel(a.id)
    assert pool.store.release_waiting([b.id], "test") == (0, 1, 0)
    before = backend.keyspace()
    assert pool.store.release_waiting([b.id], "test") == (0, 0, 0)
    assert backend.keyspace() == before
    with pytest.raises(errors.InvalidArgument):
        pool.store.run("release_waiting", [pool.keys.job(a.id)], ["test", b.id])


def test_a_pipeline_in_one_call_may_wait_for_a_job_that_coalesced(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    first = enqueue(pool, "same", coalesce=True)
    twin, after = pool.enqueue_many([{"image": "busybox", "command": ["same"], "coalesce": True},
                                     {"image": "busybox", "command": ["next"], "after_index": [0]}])
    assert twin.id == first.id and twin.coalesced
    assert pool.get(after.id).after == (first.id,) and after.state.value == "waiting"


def test_retention_keeps_a_job_that_a_waiting_job_waits_for(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2, keep_succeeded=1)
    a, gate = enqueue(pool, "a"), enqueue(pool, "gate")
    b = enqueue(pool, "b", after=[a.id, gate.id])
    run_to_end(pool, a.id, 0)
    for i in range(3):  # newer succeeded jobs push `a` past the count cap
        job = enqueue(pool, "filler", str(i))
        run_to_end(pool, job.id, 0)
    pool.prune()
    assert state_of(pool, a.id) == "succeeded", "pruned while a waiting job waits for it"
    run_to_end(pool, gate.id, 0)
    release(pool)
    assert state_of(pool, b.id) == "running"
    pool.prune()
    with pytest.raises(errors.NotFound):
        pool.get(a.id)


# ---- pause, resume and cancel of a waiting job ----------------------------------------------------------


def test_a_paused_waiting_job_keeps_what_it_waits_for(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    a = enqueue(pool)
    b, c = enqueue(pool, after=[a.id]), enqueue(pool, after=[a.id])
    assert pool.pause(b.id) is not None and state_of(pool, b.id) == "paused"
    assert pool.resume(b.id) is not None and state_of(pool, b.id) == "waiting"  # a still runs
    pool.pause(b.id)
    run_to_end(pool, a.id, 0)
    release(pool)
    assert state_of(pool, c.id) == "running" and state_of(pool, b.id) == "paused"
    resumed = pool.resume(b.id)
    assert resumed is not None and resumed.state.value == "queued"


def test_a_waiting_job_paused_when_its_dependency_failed_is_cancelled_on_resume(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    a = enqueue(pool)
    b = enqueue(pool, after=[a.id])
    pool.pause(b.id)
    run_to_end(pool, a.id, 1)
    resumed = pool.resume(b.id)
    assert resumed is not None and (resumed.state.value, resumed.error_reason) == (
        "cancelled", "dependency_failed")


def test_cancelling_a_waiting_job_cancels_its_dependents(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    a = enqueue(pool, not_before=time.time() + 3600)
    b = enqueue(pool, after=[a.id])
    assert pool.cancel(a.id).state.value == "cancelled"
    release(pool)
    assert (state_of(pool, b.id), pool.get(b.id).error_reason) == ("cancelled", "dependency_failed")
    assert not waiting_ids(pool) and not dependents(pool)


# ---- retries ----------------------------------------------------------------------------------------------


def test_a_failed_exit_is_retried_with_a_doubling_delay_then_fails(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool, retries=2, retry_delay=0)
    assert run_to_end(pool, job.id, 3) == "waiting"
    got = pool.get(job.id)
    assert (got.retries_used, got.wait_reason, got.error_reason, got.exit_code) == (
        1, "retry", "exit_code_3", 3)
    assert events_of(pool, job.id)[-1]["reason"] == "retry"
    assert events_of(pool, job.id)[-1]["evidence"].startswith("retry 1 of 2 in 0 s after exit_code_3")
    release(pool)
    assert pool.get(job.id).attempt == 2 and state_of(pool, job.id) == "running"
    assert run_to_end(pool, job.id, 3) == "waiting"
    release(pool)
    assert run_to_end(pool, job.id, 3) == "failed"
    assert pool.get(job.id).attempt == 3 and pool.get(job.id).error_reason == "exit_code_3"


def test_the_retry_delay_doubles_with_jitter_and_is_capped(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1, retry_delay_max_secs=30)
    job = enqueue(pool, retries=3, retry_delay=10)
    waits = []
    for _ in range(3):
        before = pool.now_ms()
        run_to_end(pool, job.id, 1)
        waits.append(cast(int, pool.get(job.id).wait_until) - before)
        backend.client.hset(pool.keys.job(job.id), "wait_until", 0)  # due now, not in 10 s
        backend.client.zadd(pool.keys.waiting, {job.id: 0})
        release(pool)
    for wait, full in zip(waits, (10_000, 20_000, 30_000), strict=True):
        assert full * 0.8 - 50 <= wait <= full + 50, (wait, full)


def test_retry_on_names_the_exit_codes_retried_and_a_success_is_never_retried(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    picky = enqueue(pool, "picky", retries=3, retry_on=[4], retry_delay=0)
    assert run_to_end(pool, picky.id, 3) == "failed"
    ok = enqueue(pool, "ok", retries=3, retry_delay=0)
    assert run_to_end(pool, ok.id, 0) == "succeeded"


def test_a_crash_spends_recovery_budget_not_retries(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool, retries=2, retry_delay=0)
    claim(pool, job.id).set_container("cid-1", "daemon-1")
    backend.client.delete(pool.keys.lease(job.id))
    reconcile(pool, job.id, "absent", budget=1)
    got = pool.get(job.id)
    assert (got.state.value, got.recovery_attempts, got.retries_used) in (("queued", 1, 0), ("running", 1, 0))
    assert "retry" not in [e["reason"] for e in events_of(pool, job.id)]


def test_a_cancel_of_a_running_job_is_never_retried(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool, retries=2, retry_delay=0)
    att = claim(pool, job.id)
    pool.cancel(job.id)
    assert att.finish("interrupted", exit_code=143) == "cancelled"


# ---- an operator's retry ------------------------------------------------------------------------------


def test_pool_retry_runs_a_failed_job_again_with_its_history_kept(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool, retries=1, retry_delay=0)
    run_to_end(pool, job.id, 2)
    release(pool)
    run_to_end(pool, job.id, 2)
    assert state_of(pool, job.id) == "failed"
    history = len(events_of(pool, job.id))
    again = pool.retry(job.id)
    assert again.state.value == "running" and again.attempt == 3 and again.retries_used == 0
    assert index_of(pool, job.id) == ["running"] and not again.finished_at
    assert events_of(pool, job.id)[history]["reason"] == "retried"
    assert row(pool, job.id).get("finished_by") is None
    assert run_to_end(pool, job.id, 2) == "waiting"  # its retries are whole again


def test_pool_retry_of_a_dependent_waits_for_its_dependency_retried_first(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    a = enqueue(pool)
    b = enqueue(pool, after=[a.id])
    run_to_end(pool, a.id, 1)
    release(pool)
    assert state_of(pool, b.id) == "cancelled"
    before = backend.keyspace()
    with pytest.raises(errors.InvalidSpec, match="retry that one first"):
        pool.retry(b.id)
    assert backend.keyspace() == before
    pool.retry(a.id)
    assert pool.retry(b.id).state.value == "waiting"
    run_to_end(pool, a.id, 0)
    release(pool)
    assert state_of(pool, b.id) == "running"


def test_pool_retry_of_a_dependent_that_ran_needs_no_dependency_retention_pruned(backend: Backend) -> None:
    """A failed job that ran did so after everything it waits for succeeded: retried once retention pruned
    those, it runs again (a review's finding: it was refused, its dependency "gone")."""
    pool = backend.pool(max_concurrent_jobs=1, keep_succeeded=0, keep_succeeded_secs=1)
    a = enqueue(pool)
    b = enqueue(pool, after=[a.id])
    run_to_end(pool, a.id, 0)
    release(pool)
    run_to_end(pool, b.id, 2)
    assert state_of(pool, b.id) == "failed"
    backend.client.hset(pool.keys.job(a.id), "finished_at", pool.now_ms() - 60_000)  # as if a minute went by
    backend.client.zadd(pool.keys.succeeded, {a.id: pool.now_ms() - 60_000})
    pool.prune()
    assert not backend.client.exists(pool.keys.job(a.id)), "the dependency pruned"
    assert pool.retry(b.id).state.value == "running"


@pytest.mark.parametrize("state", ["queued", "running", "succeeded"])
def test_only_a_failed_or_cancelled_job_is_retried(backend: Backend, state: str) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    busy = enqueue(pool)
    job = enqueue(pool) if state == "queued" else busy
    if state == "succeeded":
        run_to_end(pool, job.id, 0)
    with pytest.raises(errors.InvalidState):
        pool.retry(job.id)


def test_a_missing_job_in_a_later_batch_refuses_the_whole_call_before_anything_is_sent(
        backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    a = enqueue(pool)
    before = backend.keyspace()
    items = [{"image": "i", "command": [str(i)], "after": [a.id]} for i in range(5)]
    items.append({"image": "i", "command": ["x"], "after": [a.id, "e" * 32]})
    with pytest.raises(errors.InvalidSpec, match=r"e{32}, which does not exist") as refused:
        pool.enqueue_many(items, batch_size=2)
    assert refused.value.index == 5
    assert backend.keyspace() == before
    with pytest.raises(errors.InvalidSpec, match="the first item has none"):
        pool.enqueue_many([{"image": "i", "command": ["x"], "after_index": [0]}])


def test_a_job_whose_row_is_gone_cancels_the_jobs_waiting_for_it(backend: Backend) -> None:
    """A row deleted by hand (nothing of jobpool's does it) leaves no dependent waiting for ever: a running
    ghost dropped by the supervisor, or a waiting one found gone by the release step, makes its dependents
    due, and they are cancelled."""
    pool = backend.pool(max_concurrent_jobs=1)
    running, held = enqueue(pool, "a"), enqueue(pool, "b", not_before=time.time() + 3600)
    after_running, after_held = enqueue(pool, after=[running.id]), enqueue(pool, after=[held.id])
    backend.client.delete(pool.keys.job(running.id), pool.keys.job(held.id))
    assert pool.store.drop_ghost(running.id, "no container", "test").dropped
    backend.client.zadd(pool.keys.waiting, {held.id: 0})  # due now
    release(pool)
    for job in (after_running, after_held):
        assert (state_of(pool, job.id), pool.get(job.id).error_reason) == ("cancelled", "dependency_failed")


def test_a_queued_or_waiting_job_whose_row_is_lost_or_replaced_cancels_the_jobs_waiting_for_it(
        backend: Backend) -> None:
    """A queued head whose row is gone, dropped by promotion (_lib.lua `drop_head`), and a waiting job whose
    key holds another type, dropped by the release step, make their dependents due, which are cancelled:
    neither waits for ever (a review's finding)."""
    pool = backend.pool(max_concurrent_jobs=0)
    queued, held = enqueue(pool, "a"), enqueue(pool, "b", not_before=time.time() + 3600)
    after_queued, after_held = enqueue(pool, after=[queued.id]), enqueue(pool, after=[held.id])
    backend.client.delete(pool.keys.job(queued.id), pool.keys.job(held.id))
    backend.client.set(pool.keys.job(held.id), "not a row")
    backend.client.zadd(pool.keys.waiting, {held.id: 0})  # due now
    pool.set_slots(1)
    pool.store.promote_all("test")
    assert backend.client.zscore(pool.keys.queued, queued.id) is None, "the lost head dropped"
    release(pool)
    for job in (after_queued, after_held):
        assert (state_of(pool, job.id), pool.get(job.id).error_reason) == ("cancelled", "dependency_failed")


def test_a_delayed_job_cancelled_then_retried_waits_for_its_start_time_again(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool, not_before=time.time() + 3600)
    pool.cancel(job.id)
    again = pool.retry(job.id)
    assert again.state.value == "waiting" and again.wait_reason == "not_before"
    assert again.wait_until == int(row(pool, job.id)["not_before"]) and release(pool) == 0
    past = enqueue(pool, "past", not_before=time.time() + 3600)
    pool.cancel(past.id)
    # Its start time passes while it is cancelled (set back on its row: as if the hour went by).
    pool.store.client.hset(pool.keys.job(past.id), "not_before", pool.now_ms() - 1000)
    assert pool.retry(past.id).state.value == "running"
