"""The control scripts, via the public API: pause/resume of a job and of the queue, cancel, set_slots, evict,
and the supervisor's compare-and-set scripts reconcile_apply and adopt. On fakeredis[lua] and a real server.

A refused call must write nothing: those tests compare the whole keyspace (tests/support/snapshot.py) before
and after.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from jobpool import Pool, errors
from jobpool.models import JobState
from jobpool.workers.attempt import Attempt
from tests.support.attempts import claim
from tests.support.pool_helpers import (
    Backend,
    assert_event,
    enqueue,
    events_of,
    index_of,
    last_event,
    lease,
    orphan,
    paused_pool,
    queued_ids,
    reconcile,
    row,
    rq_hash,
    rq_list,
    running_ids,
    state_of,
)

# ---- pause_job / resume_job ---------------------------------------------------------------------------


def test_pause_and_resume_a_queued_job_keeps_its_place(backend: Backend) -> None:
    pool, jobs = paused_pool(backend, 3, slots=0)
    paused = pool.pause(jobs[0].id, reason="hold")
    assert paused is not None and paused.state is JobState.PAUSED
    assert index_of(pool, jobs[0].id) == ["paused"]
    assert pool.store.client.zscore(pool.keys.paused_jobs, jobs[0].id) == jobs[0].seq
    assert row(pool, jobs[0].id)["pause_reason"] == "hold"
    assert_event(last_event(pool, jobs[0].id), jobs[0].id, "queued", "paused", "pause", evidence="hold")
    enqueue(pool)
    resumed = pool.resume(jobs[0].id)
    assert resumed is not None and resumed.state is JobState.QUEUED
    assert queued_ids(pool)[0] == jobs[0].id  # back at the head, ahead of later jobs
    assert_event(last_event(pool, jobs[0].id), jobs[0].id, "paused", "queued", "resume")
    pool.set_slots(1)
    assert state_of(pool, jobs[0].id) == "running"


def test_pause_an_unclaimed_running_job_frees_its_slot(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    nxt = enqueue(pool)
    assert rq_list(pool) == [job.id]
    got = pool.pause(job.id)
    assert got is not None and got.state is JobState.PAUSED and not got.pause_requested
    assert index_of(pool, job.id) == ["paused"]
    assert pool.store.client.zscore(pool.keys.paused_jobs, job.id) == job.seq
    assert state_of(pool, nxt.id) == "running"
    assert rq_list(pool) == [nxt.id]  # a late RQ delivery of the paused one cannot run it
    assert_event(events_of(pool, job.id)[-1], job.id, "running", "paused", "pause")
    # ...and a worker that still got the old delivery is refused.
    with pytest.raises(errors.InvalidState):
        Attempt(pool.store, job.id, "boot-a", 1).claim()
    pool.resume(job.id)
    assert state_of(pool, job.id) == "queued" and queued_ids(pool) == [job.id]


def test_pause_a_claimed_job_persists_a_request(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    nxt = enqueue(pool)
    att = claim(pool, job.id)
    got = pool.pause(job.id, reason="night")
    assert got is not None and got.state is JobState.RUNNING and got.pause_requested
    assert state_of(pool, nxt.id) == "queued" and running_ids(pool) == {job.id}
    assert_event(last_event(pool, job.id), job.id, "running", "running", "pause_requested", evidence="night")
    assert att.heartbeat().pause
    resumed = pool.resume(job.id)  # withdrawn before the watcher acted on it
    assert resumed is not None and resumed.state is JobState.RUNNING and not resumed.pause_requested
    assert_event(last_event(pool, job.id), job.id, "running", "running", "pause_withdrawn")
    assert not att.heartbeat().pause


def test_paused_job_keeps_its_place_after_acting_on_the_request(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    att = claim(pool, job.id)
    pool.pause(job.id)
    later = [enqueue(pool) for _ in range(2)]
    assert att.finish("exit", 143) == "paused"
    assert state_of(pool, later[0].id) == "running"
    pool.resume(job.id)
    assert queued_ids(pool) == [job.id, later[1].id]


def test_illegal_pause_and_resume_are_invalid_state_and_write_nothing(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    done = enqueue(pool)
    claim(pool, done.id).finish("exit", 0)
    running = enqueue(pool)
    claim(pool, running.id)
    queued = enqueue(pool)
    paused = enqueue(pool)
    pool.pause(paused.id)
    before = backend.keyspace()
    cases: list[tuple[Callable[[str], object], str, str]] = [
        (pool.pause, done.id, "succeeded"), (pool.pause, paused.id, "paused"),
        (pool.resume, running.id, "running"), (pool.resume, queued.id, "queued"),
        (pool.resume, done.id, "succeeded")]
    for call, job_id, state in cases:
        with pytest.raises(errors.InvalidState) as info:
            call(job_id)
        assert info.value.state == state
    assert backend.keyspace() == before


# ---- cancel -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("start", ["queued", "paused"])
def test_cancel_a_waiting_job(backend: Backend, start: str) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    job = enqueue(pool, coalesce=True)
    if start == "paused":
        pool.pause(job.id)
    got = pool.cancel(job.id, reason="not needed")
    assert got.state is JobState.CANCELLED and got.error_reason == "cancelled" and got.finished_at is not None
    assert index_of(pool, job.id) == ["cancelled"] and pool.store.client.hgetall(pool.keys.coalesce) == {}
    assert_event(last_event(pool, job.id), job.id, start, "cancelled", "cancel", evidence="not needed")


def test_cancel_an_unclaimed_running_job_frees_the_slot_and_promotes(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    nxt = enqueue(pool)
    got = pool.cancel(job.id)
    assert got.state is JobState.CANCELLED and index_of(pool, job.id) == ["cancelled"]
    assert state_of(pool, nxt.id) == "running" and rq_list(pool) == [nxt.id]
    assert_event(events_of(pool, job.id)[-1], job.id, "running", "cancelled", "cancel")
    with pytest.raises(errors.InvalidState):
        Attempt(pool.store, job.id, "boot-a", 1).claim()


def test_cancel_a_claimed_job_persists_a_request(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    nxt = enqueue(pool)
    att = claim(pool, job.id)
    got = pool.cancel(job.id, reason="user")
    assert got.state is JobState.RUNNING and got.cancel_requested and running_ids(pool) == {job.id}
    assert state_of(pool, nxt.id) == "queued"
    assert_event(last_event(pool, job.id), job.id, "running", "running", "cancel_requested", evidence="user")
    assert att.heartbeat().cancel
    assert att.finish("exit", 143) == "cancelled"
    assert state_of(pool, nxt.id) == "running"


@pytest.mark.parametrize("end", ["succeeded", "failed", "cancelled"])
def test_cancel_a_finished_job_is_invalid_state(backend: Backend, end: str) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    if end == "cancelled":
        pool.cancel(job.id)
    else:
        claim(pool, job.id).finish("exit", 0 if end == "succeeded" else 1)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidState) as info:
        pool.cancel(job.id)
    assert info.value.state == end
    assert backend.keyspace() == before


# ---- pause_queue / resume_queue -----------------------------------------------------------------------


def test_pause_queue_holds_promotion_and_resume_promotes(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2)
    running = enqueue(pool)
    att = claim(pool, running.id)
    pool.pause(None, reason="deploy")
    paused = pool.store.client.hgetall(pool.keys.paused)
    assert paused["by"] == "api" and paused["reason"] == "deploy" and int(paused["since"]) > 0
    ev = events_of(pool)[-1]
    assert (ev["reason"], ev["evidence"], ev["job"]) == ("queue_paused", "deploy", "")
    assert pool.stats()["queue_paused"] and pool.stats()["paused_reason"] == "deploy"
    before = backend.keyspace()
    pool.pause(None, reason="second")  # idempotent: the first record stays, no event
    assert backend.keyspace() == before
    waiting = [enqueue(pool) for _ in range(3)]
    assert [state_of(pool, j.id) for j in waiting] == ["queued"] * 3
    assert att.finish("exit", 0) == "succeeded"  # finishing goes on, promoting does not
    assert [state_of(pool, j.id) for j in waiting] == ["queued"] * 3
    pool.resume(None)
    assert [state_of(pool, j.id) for j in waiting] == ["running", "running", "queued"]
    assert not pool.store.client.exists(pool.keys.paused)
    assert [e["reason"] for e in events_of(pool) if e["job"] == ""] == ["queue_paused", "queue_resumed"]
    reply = pool.store.run("resume_queue", [], ["t"])  # not paused: nothing to resume, no event
    assert reply[1] == 0
    assert [e["reason"] for e in events_of(pool) if e["job"] == ""] == ["queue_paused", "queue_resumed"]


def test_paused_queue_still_pauses_and_cancels_jobs(backend: Backend) -> None:
    pool, jobs = paused_pool(backend, 2, slots=1)
    pool.pause(None)
    assert pool.cancel(jobs[0].id).state is JobState.CANCELLED
    paused = pool.pause(jobs[1].id)
    assert paused is not None and paused.state is JobState.PAUSED
    resumed = pool.resume(jobs[1].id)
    assert resumed is not None and resumed.state is JobState.QUEUED  # queue still paused


# ---- set_slots ----------------------------------------------------------------------------------------


def test_raising_slots_promotes_at_once(backend: Backend) -> None:
    pool, jobs = paused_pool(backend, 5, slots=0)
    assert pool.set_slots(3) == 0
    assert running_ids(pool) == {j.id for j in jobs[:3]} and pool.slots() == (3, 3)
    ev = events_of(pool)
    assert any(e["reason"] == "slots_set" and e["evidence"] == "0->3" for e in ev)


def test_raising_slots_beyond_one_batch_promotes_everything(backend: Backend) -> None:
    pool, _jobs = paused_pool(backend, 80, slots=0)
    pool.set_slots(100)
    assert len(running_ids(pool)) == 80 and queued_ids(pool) == []


def test_lowering_slots_never_stops_running_jobs(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=3)
    running = [enqueue(pool) for _ in range(3)]
    waiting = enqueue(pool)
    attempts = [claim(pool, j.id) for j in running]
    assert pool.set_slots(1) == 3
    assert running_ids(pool) == {j.id for j in running}
    assert pool.slots() == (3, 1)
    attempts[0].finish("exit", 0)
    assert state_of(pool, waiting.id) == "queued" and pool.slots() == (2, 1)
    attempts[1].finish("exit", 0)
    assert state_of(pool, waiting.id) == "queued" and pool.slots() == (1, 1)
    attempts[2].finish("exit", 0)
    assert state_of(pool, waiting.id) == "running" and pool.slots() == (1, 1)


def test_a_fresh_pool_reports_the_limit_its_scripts_use(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=4)
    reported = pool.slots()[1]
    assert pool.set_slots(4) == reported  # set_slots returns the limit the scripts were using


@pytest.mark.parametrize("bad", ["-1", "1.5", "abc", "", "nan", "inf", "-inf", "100001", "1e300"])
def test_set_slots_script_rejects_a_bad_limit(backend: Backend, bad: str) -> None:
    pool = backend.pool()
    enqueue(pool)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument, match="bad argument"):
        pool.store.run("set_slots", [], [bad, "t"])
    assert backend.keyspace() == before


# ---- evict --------------------------------------------------------------------------------------------


def test_evict_fails_the_job_frees_the_slot_and_fences_the_old_owner(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    nxt = enqueue(pool)
    att = claim(pool, job.id)
    got = pool.evict(job.id, 1, reason="evicted_stale", evidence="running 25h", actor="alice")
    assert got.state is JobState.FAILED and got.error_reason == "evicted_stale"
    assert index_of(pool, job.id) == ["failed"] and lease(pool, job.id) is None
    assert state_of(pool, nxt.id) == "running"
    assert_event(last_event(pool, job.id), job.id, "running", "failed", "evicted_stale",
                 evidence="running 25h", actor="alice")
    before = backend.keyspace()
    with pytest.raises(errors.NotOwner):
        att.heartbeat()
    with pytest.raises(errors.NotOwner):
        att.finish("exit", 0)
    assert backend.keyspace() == before


def test_evict_is_compare_and_set_on_the_attempt(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    claim(pool, job.id)
    before = backend.keyspace()
    with pytest.raises(errors.Conflict):
        pool.evict(job.id, 2)
    assert backend.keyspace() == before


def test_evict_a_job_not_running_is_invalid_state(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    job = enqueue(pool)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidState):
        pool.evict(job.id, 0)
    assert backend.keyspace() == before


# ---- reconcile_apply ----------------------------------------------------------------------------------


def test_reconcile_refuses_while_the_lease_is_present(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    claim(pool, job.id)
    before = backend.keyspace()
    for verdict in ("exited", "absent"):
        with pytest.raises(errors.Conflict, match="lease"):
            reconcile(pool, job.id, verdict, code="0", budget=1)
    assert backend.keyspace() == before


@pytest.mark.parametrize("changed", [{"attempt": "2"}, {"owner": "boot-z"}, {"container_id": "cid-other"},
                                     {"owner": ""}])
def test_reconcile_refuses_when_the_row_changed(backend: Backend, changed: dict[str, str]) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    orphan(backend, pool, job.id)
    before = backend.keyspace()
    with pytest.raises(errors.Conflict):
        reconcile(pool, job.id, "absent", budget=1, **changed)
    assert backend.keyspace() == before


def test_reconcile_refuses_a_job_no_longer_running(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    att = claim(pool, job.id)
    att.finish("exit", 0)
    before = backend.keyspace()
    with pytest.raises(errors.Conflict):
        reconcile(pool, job.id, "absent", owner="boot-a", attempt="1")
    assert backend.keyspace() == before


@pytest.mark.parametrize(("code", "intent", "expected", "reason"), [
    ("0", None, "succeeded", "exit_0"), ("2", None, "failed", "exit_code_2"),
    ("137", "cancel", "cancelled", "cancel_requested"), ("137", "pause", "paused", "pause_requested"),
    ("0", "cancel", "succeeded", "exit_0"),
])
def test_reconcile_exited_ends_as_finish_would(backend: Backend, code: str, intent: str | None, expected: str,
                                               reason: str) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    nxt = enqueue(pool)
    orphan(backend, pool, job.id)
    if intent:
        pool.pause(job.id) if intent == "pause" else pool.cancel(job.id)
    assert reconcile(pool, job.id, "exited", code=code)[:2] == [0, expected]
    got = pool.get(job.id)
    assert got.state.value == expected and got.exit_code == int(code) and index_of(pool, job.id) == [expected]
    assert state_of(pool, nxt.id) == "running"
    assert_event(last_event(pool, job.id), job.id, "running", expected, reason, evidence="probe:absent",
                 actor="supervisor")


def test_reconcile_absent_with_budget_requeues_at_its_place_and_spends_budget(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    later = enqueue(pool)
    orphan(backend, pool, job.id)
    pool.pause(None)
    assert reconcile(pool, job.id, "absent", reason="recovered", budget=1)[:2] == [0, "queued"]
    got = pool.get(job.id)
    assert got.state is JobState.QUEUED and got.recovery_attempts == 1 and got.owner_boot == ""
    assert queued_ids(pool) == [job.id, later.id]
    assert_event(last_event(pool, job.id), job.id, "running", "queued", "recovered")
    # The budget is spent: the next loss of the same job fails it with the reason given.
    pool.resume(None)
    assert state_of(pool, job.id) == "running"
    orphan(backend, pool, job.id, boot="boot-b")
    reply = reconcile(pool, job.id, "absent", reason="orphan_reconciled_no_container", budget=1)
    assert reply[:2] == [0, "failed"]
    got = pool.get(job.id)
    assert (got.state, got.error_reason) == (JobState.FAILED, "orphan_reconciled_no_container")
    assert got.recovery_attempts == 1
    assert state_of(pool, later.id) == "running"


@pytest.mark.parametrize(("intent", "expected"),
                         [(None, "failed"), ("cancel", "cancelled"), ("pause", "paused")])
def test_reconcile_absent_without_budget(backend: Backend, intent: str | None, expected: str) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    orphan(backend, pool, job.id)
    if intent:
        pool.pause(job.id) if intent == "pause" else pool.cancel(job.id)
    assert reconcile(pool, job.id, "absent", reason="gone", budget=0)[:2] == [0, expected]
    got = pool.get(job.id)
    assert got.state.value == expected and got.recovery_attempts == 0
    reasons = {"failed": "gone", "cancelled": "cancel_requested", "paused": "pause_requested"}
    assert got.error_reason == reasons[expected]
    assert last_event(pool, job.id)["reason"] == got.error_reason


def test_reconcile_redispatch_pushes_a_new_attempt_and_keeps_the_slot(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    nxt = enqueue(pool)
    backend.client.delete(pool.keys.rq_queue)  # RQ lost the delivery
    assert reconcile(pool, job.id, "redispatch") == [0, "running", 0, "none"]
    got = pool.get(job.id)
    assert got.state is JobState.RUNNING and got.attempt == 2 and running_ids(pool) == {job.id}
    assert state_of(pool, nxt.id) == "queued" and rq_list(pool) == [job.id]
    assert json.loads(rq_hash(backend, pool, job.id)[b"meta"]) == {"jobpool_attempt": 2}
    assert_event(last_event(pool, job.id), job.id, "running", "running", "redispatched")
    reconcile(pool, job.id, "redispatch")
    assert rq_list(pool) == [job.id]  # never twice on RQ's list
    with pytest.raises(errors.Conflict):
        Attempt(pool.store, job.id, "boot-a", 2).claim()  # the superseded delivery
    Attempt(pool.store, job.id, "boot-a", 3).claim()


@pytest.mark.parametrize("lost", ["whole", "all but the fields promotion writes"])
def test_a_redispatch_writes_rqs_record_whole_again_if_it_was_lost(backend: Backend, lost: str) -> None:
    """RQ skips, in silence, an entry whose record has no `data` (it leaves it in its intermediate list): a
    record deleted as an old delivery ended, under a row a Redis rollback then restored, made every dispatch
    of that job vanish unclaimed (seen in the soak). The redispatch writes it whole, as enqueue does."""
    from rq.job import Job as RQJob
    from rq.serializers import JSONSerializer

    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    whole = rq_hash(backend, pool, job.id)
    backend.client.delete(pool.keys.rq_job(job.id))
    if lost != "whole":
        backend.client.hset(pool.keys.rq_job(job.id), mapping={"status": "queued", "origin": "x"})
    assert reconcile(pool, job.id, "redispatch") == [0, "running", 0, "none"]
    again = rq_hash(backend, pool, job.id)
    assert again[b"data"] == whole[b"data"] and again[b"description"] == whole[b"description"]
    fetched = RQJob.fetch(job.id, connection=backend.raw, serializer=JSONSerializer)
    assert fetched.origin == pool.keys.rq_queue_name and fetched.meta == {"jobpool_attempt": 2}


def test_reconcile_refuses_a_bad_verdict_and_redispatch_of_a_claimed_job(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    orphan(backend, pool, job.id)
    before = backend.keyspace()
    for verdict, code in (("redispatch", ""), ("vanished", ""), ("exited", "")):
        with pytest.raises(errors.InvalidArgument, match="bad argument"):
            reconcile(pool, job.id, verdict, code=code)
    assert backend.keyspace() == before


def test_reconcile_unknown_job_is_not_found(backend: Backend) -> None:
    pool = backend.pool()
    before = backend.keyspace()
    with pytest.raises(errors.NotFound):
        pool.store.run("reconcile_apply", [pool.keys.job("x"), pool.keys.lease("x"), pool.keys.rq_job("x")],
                       ["x", "1", "", "", "absent", "r", "", 0, "", "t"])
    assert backend.keyspace() == before


# ---- adopt --------------------------------------------------------------------------------------------


def test_adopt_takes_over_when_the_lease_is_gone(backend: Backend) -> None:
    pool = backend.pool(lease_secs=30, heartbeat_secs=5)
    job = enqueue(pool, "long")
    old = orphan(backend, pool, job.id, "boot-a")
    pool.pause(job.id)
    me, spec, container_id, requests = Attempt.adopt(pool.store, job.id, "boot-a", 1, "boot-b",
                                                     "probe: running", daemon_id="daemon-1")
    assert spec.command == ("long",) and container_id == "cid-1" and requests.pause and not requests.cancel
    got = row(pool, job.id)
    assert got["owner_boot"] == "boot-b" and got["adopted_from"] == "boot-a" and got["state"] == "running"
    assert lease(pool, job.id) == "boot-b:1"
    assert_event(last_event(pool, job.id), job.id, "running", "running", "adopted", evidence="probe: running",
                 actor="boot-b")
    before = backend.keyspace()
    with pytest.raises(errors.NotOwner):
        old.heartbeat()
    assert backend.keyspace() == before
    me.heartbeat()
    assert me.finish("exit", 143) == "paused"


def test_adopt_is_refused_while_the_lease_is_present(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    Attempt(pool.store, job.id, "boot-a", 1).claim("docker", "daemon-1")
    before = backend.keyspace()
    with pytest.raises(errors.Conflict):
        Attempt.adopt(pool.store, job.id, "boot-a", 1, "boot-b", "", daemon_id="daemon-1")
    assert backend.keyspace() == before


@pytest.mark.parametrize(("old_owner", "attempt"), [("boot-x", 1), ("boot-a", 2), ("boot-a", 0)])
def test_adopt_is_compare_and_set(backend: Backend, old_owner: str, attempt: int) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    orphan(backend, pool, job.id, "boot-a")
    before = backend.keyspace()
    with pytest.raises(errors.Conflict):
        Attempt.adopt(pool.store, job.id, old_owner, attempt, "boot-b", "", daemon_id="daemon-1")
    assert backend.keyspace() == before


def test_adopt_is_refused_to_a_worker_on_another_daemon(backend: Backend) -> None:
    """Only a worker on the daemon the attempt was recorded on can watch its container (daemonid.py)."""
    pool = backend.pool()
    job = enqueue(pool)
    Attempt(pool.store, job.id, "boot-a", 1).claim("docker", "jpd1:aaaa@boot-1")
    pool.store.client.delete(pool.keys.lease(job.id))
    before = backend.keyspace()
    for other in ("jpd1:bbbb@boot-1", ""):
        with pytest.raises(errors.Conflict):
            Attempt.adopt(pool.store, job.id, "boot-a", 1, "boot-b", "", daemon_id=other)
    assert backend.keyspace() == before
    # A row claimed with no identity is adopted by nobody, not even an adopter with none.
    pool.set_slots(2)
    blind = enqueue(pool, "blind")
    Attempt(pool.store, blind.id, "boot-a", 1).claim()
    pool.store.client.delete(pool.keys.lease(blind.id))
    with pytest.raises(errors.Conflict):
        Attempt.adopt(pool.store, blind.id, "boot-a", 1, "boot-b", "", daemon_id="")
    Attempt.adopt(pool.store, job.id, "boot-a", 1, "boot-b", "", daemon_id="jpd1:aaaa@boot-1")
    assert row(pool, job.id)["owner_boot"] == "boot-b"


def test_an_adoption_sent_again_after_its_reply_was_lost_succeeds_again(backend: Backend) -> None:
    pool = backend.pool(lease_secs=30, heartbeat_secs=5)
    job = enqueue(pool, "long")
    orphan(backend, pool, job.id, "boot-a")
    Attempt.adopt(pool.store, job.id, "boot-a", 1, "boot-b", "probe: running", daemon_id="daemon-1")
    pool.store.client.pexpire(pool.keys.lease(job.id), 5)  # the retry also renews the lease
    again, spec, container_id, _ = Attempt.adopt(pool.store, job.id, "boot-a", 1, "boot-b", "probe: running",
                                                 daemon_id="daemon-1")
    assert (spec.command, container_id) == (("long",), "cid-1")
    assert lease(pool, job.id) == "boot-b:1" and pool.store.client.pttl(pool.keys.lease(job.id)) > 1000
    assert [e["reason"] for e in events_of(pool, job.id)].count("adopted") == 1
    again.heartbeat()
    # Another boot, or another daemon, is still refused.
    for boot, daemon in (("boot-c", "daemon-1"), ("boot-b", "daemon-2")):
        with pytest.raises(errors.Conflict):
            Attempt.adopt(pool.store, job.id, "boot-a", 1, boot, "", daemon_id=daemon)


def test_adopt_of_a_finished_or_unknown_job(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    claim(pool, job.id).finish("exit", 1)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidState):
        Attempt.adopt(pool.store, job.id, "boot-a", 1, "boot-b", "", daemon_id="daemon-1")
    with pytest.raises(errors.NotFound):
        Attempt.adopt(pool.store, "e" * 32, "boot-a", 1, "boot-b", "", daemon_id="daemon-1")
    assert backend.keyspace() == before


# ---- rows edited to garbage: the scripts take them out of the way, never abort half-way ------------------


def test_promote_drops_a_queued_id_whose_row_is_gone_and_promotes_the_next(backend: Backend) -> None:
    pool, jobs = paused_pool(backend, 2, slots=1)
    backend.client.delete(pool.keys.job(jobs[0].id))
    assert pool.promote() == 1
    assert queued_ids(pool) == [] and running_ids(pool) == {jobs[1].id}
    assert_event(last_event(pool, jobs[0].id), jobs[0].id, "queued", "", "dropped_corrupt_row",
                 evidence="row key is missing")


def test_promote_drops_a_queued_id_whose_key_is_not_a_hash(backend: Backend) -> None:
    pool, jobs = paused_pool(backend, 2, slots=1)
    backend.client.delete(pool.keys.job(jobs[0].id))
    backend.client.set(pool.keys.job(jobs[0].id), "garbage")
    assert pool.promote() == 1
    assert running_ids(pool) == {jobs[1].id}
    assert backend.client.get(pool.keys.job(jobs[0].id)) == "garbage"  # not written to
    assert last_event(pool, jobs[0].id)["evidence"] == "row key is a string"


def test_promote_fails_a_head_whose_rq_job_key_is_not_a_hash(backend: Backend) -> None:
    pool, jobs = paused_pool(backend, 2, slots=1)
    backend.client.delete(pool.keys.rq_job(jobs[0].id))
    backend.client.set(pool.keys.rq_job(jobs[0].id), "garbage")
    assert pool.promote() == 1
    assert state_of(pool, jobs[0].id) == "failed" and index_of(pool, jobs[0].id) == ["failed"]
    assert row(pool, jobs[0].id)["error_reason"] == "dropped_corrupt_row"
    assert running_ids(pool) == {jobs[1].id}


def test_promote_counts_a_garbage_attempt_as_zero(backend: Backend) -> None:
    pool, jobs = paused_pool(backend, 1, slots=1)
    backend.client.hset(pool.keys.job(jobs[0].id), "attempt", "x")
    assert pool.promote() == 1
    assert pool.get(jobs[0].id).attempt == 1
    assert json.loads(rq_hash(backend, pool, jobs[0].id)[b"meta"]) == {"jobpool_attempt": 1}


def test_a_coalesce_entry_left_by_a_dropped_row_is_replaced(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    first = enqueue(pool, coalesce_key="k")
    backend.client.delete(pool.keys.job(first.id))
    pool.set_slots(1)  # the rowless head is dropped from the queue; its coalesce entry stays behind
    pool.set_slots(0)
    second = enqueue(pool, "other", coalesce_key="k")
    assert not second.coalesced
    again = enqueue(pool, "again", coalesce_key="k")
    assert again.coalesced and again.id == second.id


def test_reconcile_judges_the_lease_by_its_value(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    orphan(backend, pool, job.id)
    backend.client.set(pool.keys.lease(job.id), "garbage")
    assert reconcile(pool, job.id, "absent")[1] == "failed"
    assert lease(pool, job.id) is None


def test_reconcile_refuses_while_the_owners_lease_holds_its_value(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    claim(pool, job.id)
    before = backend.keyspace()
    with pytest.raises(errors.Conflict):
        reconcile(pool, job.id, "absent")
    assert backend.keyspace() == before


def test_reconcile_counts_a_garbage_recovery_budget_as_zero_spent(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    orphan(backend, pool, job.id)
    backend.client.hset(pool.keys.job(job.id), "recovery_attempts", "-x")
    assert reconcile(pool, job.id, "absent", budget=1)[1] == "queued"


# ---- drop_ghost ---------------------------------------------------------------------------------------


def drop_ghost(pool: Pool, job_id: str) -> list[Any]:
    return pool.store.run("drop_ghost",
                          [pool.keys.job(job_id), pool.keys.lease(job_id), *pool.store.candidates(4)],
                          [job_id, "probe: no container", "supervisor"])


def test_drop_ghost_frees_the_slot_of_a_running_id_without_a_row(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    waiting = enqueue(pool)
    backend.client.delete(pool.keys.job(job.id))
    assert drop_ghost(pool, job.id) == [0, 1, 1, "empty"]
    assert running_ids(pool) == {waiting.id} and job.id not in rq_list(pool)
    assert_event(last_event(pool, job.id), job.id, "running", "", "dropped_ghost",
                 evidence="probe: no container", actor="supervisor")
    assert drop_ghost(pool, job.id)[:2] == [0, 0]  # gone from `running` already: nothing to do


@pytest.mark.parametrize("spoil", ["none", "live lease"])
def test_drop_ghost_refuses_a_row_that_is_a_hash_or_a_live_lease(backend: Backend, spoil: str) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    if spoil == "live lease":
        backend.client.delete(pool.keys.job(job.id))
        backend.client.set(pool.keys.lease(job.id), "boot-a:1", px=60_000)
    before = backend.keyspace()
    with pytest.raises(errors.Conflict):
        drop_ghost(pool, job.id)
    assert backend.keyspace() == before
