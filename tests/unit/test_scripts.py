"""The job life through the Lua scripts, via the public API (`Pool`, `Attempt`): enqueue and coalescing,
promote, claim, the fenced worker writes, finish, and the event trail. Each runs on fakeredis[lua] and on a
real redis-server (the `backend` fixture).

Each test states a promise of the scripts (docs/architecture.md, "Every state change is one Lua script") and
checks it in Redis itself: the row, the state indexes, the RQ hash and list, the lease, and the `events`
stream. A refused call must write nothing: those tests compare the whole keyspace (tests/support/snapshot.py)
before and after.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from importlib import resources
from typing import Any, cast

import pytest
from rq.job import Job as RQJob
from rq.job import JobStatus
from rq.queue import Queue as RQQueue
from rq.serializers import JSONSerializer

from jobpool import contract, errors
from jobpool.models import JobState
from jobpool.rqjob import ENTRY_POINT
from jobpool.store.keys import RQ_QUEUES
from jobpool.workers.attempt import LOG_TAIL_BYTES, Attempt
from tests.support.attempts import claim
from tests.support.pool_helpers import (
    Backend,
    assert_event,
    enqueue,
    events_of,
    index_of,
    last_event,
    lease,
    paused_pool,
    queued_ids,
    reconcile,
    row,
    rq_hash,
    rq_list,
    running_ids,
    state_of,
)

# ---- enqueue ------------------------------------------------------------------------------------------


def test_enqueue_creates_a_queued_row_and_no_rq_record_yet(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    job = enqueue(pool, "echo", "hi", env={"A": "1"})
    assert job.state is JobState.QUEUED and job.seq == 1 and job.attempt == 0 and not job.coalesced
    r = row(pool, job.id)
    assert {k: r[k] for k in ("id", "state", "seq", "attempt", "coalesce_key", "recovery_attempts",
                              "pause_requested", "cancel_requested", "owner_boot", "exit_code")} == {
        "id": job.id, "state": "queued", "seq": "1", "attempt": "0", "coalesce_key": "",
        "recovery_attempts": "0", "pause_requested": "0", "cancel_requested": "0", "owner_boot": "",
        "exit_code": ""}
    assert json.loads(r["spec"])["command"] == ["echo", "hi"] and json.loads(r["spec"])["env"] == {"A": "1"}
    assert index_of(pool, job.id) == ["queued"]
    assert pool.store.client.zscore(pool.keys.queued, job.id) == 1.0
    assert pool.store.client.hget(pool.keys.config, "max_concurrent_jobs") == "0"
    # RQ's record of the job is made when it is promoted: nothing of it yet, nothing on RQ's list.
    assert rq_hash(backend, pool, job.id) == {} and rq_list(pool) == []
    assert_event(last_event(pool, job.id), job.id, "", "queued", "enqueued", actor="api")


def test_enqueue_promotes_at_once_into_a_free_slot(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    assert job.state is JobState.RUNNING and job.attempt == 1 and job.promoted_at is not None
    assert running_ids(pool) == {job.id} and index_of(pool, job.id) == ["running"]
    assert rq_list(pool) == [job.id]
    assert pool.store.client.sismember(RQ_QUEUES, pool.keys.rq_queue)
    evs = events_of(pool, job.id)
    assert [e["reason"] for e in evs] == ["enqueued", "promoted"]
    assert_event(evs[1], job.id, "queued", "running", "promoted", evidence="attempt=1")
    # The second job finds the slot taken.
    second = enqueue(pool)
    assert second.state is JobState.QUEUED and rq_list(pool) == [job.id]


def test_enqueue_writes_the_slot_limit_only_once(backend: Backend) -> None:
    first = backend.pool(max_concurrent_jobs=2)
    enqueue(first)
    later = backend.pool(max_concurrent_jobs=7)  # another process with other settings
    enqueue(later)
    assert later.slots() == (2, 2)


def test_enqueue_seq_is_a_global_counter(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    jobs = [enqueue(pool, str(i)) for i in range(5)]
    assert [j.seq for j in jobs] == [1, 2, 3, 4, 5]
    assert queued_ids(pool) == [j.id for j in jobs]


def test_enqueue_with_an_existing_id_is_refused_and_writes_nothing(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    job = enqueue(pool)
    before = backend.keyspace()
    with pytest.raises(errors.AlreadyExists):
        pool.store.run("enqueue", [pool.keys.job(job.id), pool.keys.rq_job(job.id)],
                       ["t", "", job.id, '{"image":"x","command":["y"]}', "", "", "", ""])
    assert backend.keyspace() == before


# ---- coalescing ---------------------------------------------------------------------------------------


def test_coalesce_returns_the_queued_twin_and_writes_nothing(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    first = enqueue(pool, "build", env={"X": "1"}, coalesce=True)
    assert first.coalesce_key.startswith("spec:") and not first.coalesced
    before = backend.keyspace()
    twin = enqueue(pool, "build", env={"X": "1"}, coalesce=True)
    assert twin.id == first.id and twin.coalesced and twin.state is JobState.QUEUED
    assert backend.keyspace() == before  # no row, no RQ hash, no seq, no event
    assert pool.store.client.hgetall(pool.keys.coalesce) == {first.coalesce_key: first.id}


@pytest.mark.parametrize("change", [
    {"command": ["build", "--other"]}, {"env": {"X": "2"}}, {"image": "other"}, {"labels": {"k": "v"}},
    {"memory": "1g"},
])
def test_coalesce_needs_an_identical_spec(backend: Backend, change: dict[str, Any]) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    base: dict[str, Any] = {"image": "busybox", "command": ["build"], "env": {"X": "1"}}
    first = pool.enqueue(**base, coalesce=True)
    other = pool.enqueue(**{**base, **change}, coalesce=True)
    assert other.id != first.id and not other.coalesced


def test_coalesce_only_when_both_ask_for_it(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    plain = enqueue(pool, "x")
    asked = enqueue(pool, "x", coalesce=True)  # the plain one has no coalesce key: not a twin
    again_plain = enqueue(pool, "x")  # not asking: always a new job
    assert len({plain.id, asked.id, again_plain.id}) == 3
    assert enqueue(pool, "x", coalesce=True).id == asked.id


def test_running_jobs_never_coalesce(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    running = enqueue(pool, "x", coalesce=True)
    assert running.state is JobState.RUNNING
    assert pool.store.client.hgetall(pool.keys.coalesce) == {}  # promotion dropped the entry
    queued = enqueue(pool, "x", coalesce=True)
    assert queued.id != running.id and queued.state is JobState.QUEUED and not queued.coalesced
    assert enqueue(pool, "x", coalesce=True).id == queued.id


def test_explicit_coalesce_key_groups_different_specs(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    a = enqueue(pool, "a", coalesce_key="nightly")
    b = enqueue(pool, "b", coalesce_key="nightly")
    c = enqueue(pool, "a", coalesce_key="hourly")
    d = enqueue(pool, "a", coalesce=True)  # a spec key never matches an explicit key
    assert b.id == a.id and b.coalesced and a.coalesce_key == "key:nightly"
    assert len({a.id, c.id, d.id}) == 3


@pytest.mark.parametrize("leave", ["promote", "pause", "cancel"])
def test_coalesce_entry_is_dropped_when_the_job_leaves_queued(backend: Backend, leave: str) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    first = enqueue(pool, "x", coalesce=True)
    if leave == "promote":
        pool.set_slots(1)
    elif leave == "pause":
        pool.pause(first.id)
    else:
        pool.cancel(first.id)
    assert state_of(pool, first.id) == {"promote": "running", "pause": "paused", "cancel": "cancelled"}[leave]
    assert pool.store.client.hgetall(pool.keys.coalesce) == {}
    assert enqueue(pool, "x", coalesce=True).id != first.id


def test_coalesce_entry_returns_with_the_job(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    job = enqueue(pool, "x", coalesce=True)
    pool.pause(job.id)
    pool.resume(job.id)
    assert pool.store.client.hgetall(pool.keys.coalesce) == {job.coalesce_key: job.id}
    assert enqueue(pool, "x", coalesce=True).id == job.id


# ---- promote ------------------------------------------------------------------------------------------


def test_promote_fills_free_slots_in_fifo_order(backend: Backend) -> None:
    pool, jobs = paused_pool(backend, 5, slots=3)
    assert pool.promote() == 3
    assert running_ids(pool) == {j.id for j in jobs[:3]}
    assert queued_ids(pool) == [j.id for j in jobs[3:]]
    assert rq_list(pool) == [j.id for j in jobs[:3]]  # pushed in FIFO order
    assert pool.promote() == 0  # full


def test_promote_writes_rqs_record_whole_then_only_the_delivery(backend: Backend) -> None:
    pool, (job,) = paused_pool(backend, 1)
    assert rq_hash(backend, pool, job.id) == {}
    assert pool.promote() == 1
    after = rq_hash(backend, pool, job.id)
    assert after[b"status"] == b"queued" and json.loads(after[b"meta"]) == {"jobpool_attempt": 1}
    # Written whole at the first promotion: RQ's payload, the description naming the job and its image, and
    # the creation time the row's (the server's clock), in RQ's own format.
    fetched = RQJob.fetch(job.id, connection=backend.raw, serializer=JSONSerializer)
    assert fetched.func_name == ENTRY_POINT and fetched.description == f"jobpool {job.id} ({job.spec.image})"
    assert int(fetched.created_at.timestamp() * 1000) == job.created_at
    # enqueued_at is the promotion time, in RQ's ISO format (computed in Lua by hand).
    promoted_at = pool.get(job.id).promoted_at
    assert promoted_at is not None
    enqueued = datetime.strptime(after[b"enqueued_at"].decode(), "%Y-%m-%dT%H:%M:%S.%fZ")
    enqueued = enqueued.replace(tzinfo=timezone.utc)
    assert enqueued == datetime.fromtimestamp(promoted_at / 1000, timezone.utc)
    # RQ itself reads it as an ordinary queued job on the pool's queue.
    assert fetched.get_status() == JobStatus.QUEUED and fetched.meta == {"jobpool_attempt": 1}
    assert fetched.origin == "jobpool-default" and fetched.enqueued_at is not None
    rq_queue = RQQueue(pool.keys.rq_queue_name, connection=backend.raw, serializer=JSONSerializer)
    assert rq_queue.job_ids == [job.id]
    # A later delivery of the same record (a redispatch) changes only enqueued_at and meta.
    assert reconcile(pool, job.id, "redispatch")[0] == 0
    again = rq_hash(backend, pool, job.id)
    assert json.loads(again[b"meta"]) == {"jobpool_attempt": 2}
    assert {k: v for k, v in again.items() if k not in (b"enqueued_at", b"meta")} == {
        k: v for k, v in after.items() if k not in (b"enqueued_at", b"meta")}


@pytest.mark.parametrize("seconds", [0, 951782400, 4107542399, 1709164800])
def test_iso_time_in_lua_matches_python(backend: Backend, seconds: int) -> None:
    """iso_utc() in _lib.lua converts by hand (no os.date in Redis' Lua): check leap days and centuries."""
    lib = contract.lua_constants() + (resources.files("jobpool") / "scripts" / "_lib.lua").read_text()
    ms = seconds * 1000 + 789
    got = backend.client.eval(lib + "\nreturn iso_utc(tonumber(ARGV[1]))", 0, ms)
    assert got == datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_iso_time_in_lua_matches_python_across_four_centuries(backend: Backend) -> None:
    """The same over 1970-2369, a time every ~17 days and every millisecond of the first and last seconds of
    days that end a month, a year, a leap year and a century (each field's roll-over)."""
    lib = contract.lua_constants() + (resources.files("jobpool") / "scripts" / "_lib.lua").read_text()
    day = 86_400_000
    edges = [datetime(y, m, 1, tzinfo=timezone.utc) for y in (1970, 1999, 2000, 2024, 2100, 2369)
             for m in (1, 2, 3, 12)]
    times = list(range(0, 146_097 * day, 1_461_017 * 1000 + 7))
    for edge in edges:
        ms = int(edge.timestamp() * 1000)
        times += [ms + k for k in (-1000, -999, -1, 0, 1, 999, 59_999, 3_599_999)]
    script = lib + """
local out = {}
for i = 1, #ARGV do out[i] = iso_utc(tonumber(ARGV[i])) end
return out"""
    got = backend.client.eval(script, 0, *times)
    want = [datetime.fromtimestamp(ms // 1000, timezone.utc).replace(microsecond=ms % 1000 * 1000)
            .strftime("%Y-%m-%dT%H:%M:%S.%fZ") for ms in times]
    assert got == want


def test_promote_holds_while_the_queue_is_paused(backend: Backend) -> None:
    pool, _jobs = paused_pool(backend, 2, slots=2)
    pool.pause(None, reason="maintenance")
    before = backend.keyspace()
    assert pool.promote() == 0
    assert backend.keyspace() == before
    reply = pool.store.run("promote", pool.store.candidates(2), ["t"])
    assert reply == [0, "", 0, "paused"]


def test_promote_is_bounded_per_call(backend: Backend) -> None:
    pool, jobs = paused_pool(backend, 100, slots=1000)
    reply = pool.store.run("promote", pool.store.candidates(100), ["t"])
    assert reply == [0, "", 64, "batch"]  # PROMOTE_BATCH_LIMIT in _lib.lua
    assert running_ids(pool) == {j.id for j in jobs[:64]}
    assert pool.promote() == 36  # Pool.promote loops over batches
    assert len(running_ids(pool)) == 100 and queued_ids(pool) == []


def test_promote_reports_why_it_stopped(backend: Backend) -> None:
    pool, _jobs = paused_pool(backend, 3, slots=1)
    assert pool.store.run("promote", pool.store.candidates(3), ["t"]) == [0, "", 1, "full"]
    pool.set_slots(10)
    assert pool.store.run("promote", pool.store.candidates(3), ["t"]) == [0, "", 0, "empty"]


def test_promote_never_takes_a_candidate_that_is_not_the_head(backend: Backend) -> None:
    pool, jobs = paused_pool(backend, 3, slots=3)
    before = backend.keyspace()
    # A stale read: the caller names the second job as the first candidate.
    stale = [pool.keys.job(jobs[1].id), pool.keys.rq_job(jobs[1].id), pool.keys.rq_queue]
    assert pool.store.run("promote", stale, ["t"]) == [0, "", 0, "stale"]
    assert backend.keyspace() == before
    # no candidates: the caller must retry with some
    assert pool.store.run("promote", [], ["t"]) == [0, "", 0, "batch"]


def test_attempt_counts_promotions(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    claim(pool, job.id).finish("interrupted", 75)  # handed back, promoted again at once (slot free)
    assert pool.get(job.id).attempt == 2
    assert json.loads(rq_hash(backend, pool, job.id)[b"meta"]) == {"jobpool_attempt": 2}


# ---- claim --------------------------------------------------------------------------------------------


def test_claim_takes_the_promoted_row(backend: Backend) -> None:
    pool = backend.pool(lease_secs=30, heartbeat_secs=5)
    job = enqueue(pool, "run", env={"K": "v"})
    spec, requests = Attempt(pool.store, job.id, "boot-a", 1).claim()
    assert spec.command == ("run",) and dict(spec.env) == {"K": "v"}
    assert (requests.pause, requests.cancel) == (False, False)
    got = pool.get(job.id)
    assert got.owner_boot == "boot-a" and got.claimed_at is not None and got.heartbeat_at == got.claimed_at
    assert lease(pool, job.id) == "boot-a:1"
    assert 0 < pool.store.client.pttl(pool.keys.lease(job.id)) <= 30_000
    assert_event(last_event(pool, job.id), job.id, "running", "running", "claimed",
                 evidence="boot=boot-a attempt=1", actor="boot-a")


def test_claim_first_wins_and_a_second_claim_writes_nothing(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    Attempt(pool.store, job.id, "boot-a", 1).claim()
    before = backend.keyspace()
    for boot in ("boot-b", "boot-a"):  # a duplicate delivery, even to the same boot, is refused
        with pytest.raises(errors.NotOwner):
            Attempt(pool.store, job.id, boot, 1).claim()
    assert backend.keyspace() == before


@pytest.mark.parametrize("attempt", [0, 2])
def test_claim_of_another_attempt_is_a_conflict(backend: Backend, attempt: int) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    before = backend.keyspace()
    with pytest.raises(errors.Conflict):
        Attempt(pool.store, job.id, "boot-a", attempt).claim()
    assert backend.keyspace() == before


def test_claim_of_a_job_not_running_is_invalid_state(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    done = enqueue(pool)
    claim(pool, done.id).finish("exit", 0)
    enqueue(pool)  # takes the one slot
    queued = enqueue(pool)
    assert state_of(pool, queued.id) == "queued"
    before = backend.keyspace()
    for job_id, state in ((done.id, "succeeded"), (queued.id, "queued")):
        with pytest.raises(errors.InvalidState) as info:
            Attempt(pool.store, job_id, "boot-a", 1).claim()
        assert info.value.state == state
    assert backend.keyspace() == before


def test_claim_of_an_unknown_job_is_not_found(backend: Backend) -> None:
    pool = backend.pool()
    enqueue(pool)
    before = backend.keyspace()
    with pytest.raises(errors.NotFound):
        Attempt(pool.store, "0" * 32, "boot-a", 1).claim()
    assert backend.keyspace() == before


# ---- fenced writes: heartbeat, set_container, finish --------------------------------------------------


def test_heartbeat_renews_the_lease_and_reads_requests(backend: Backend) -> None:
    pool = backend.pool(lease_secs=30, heartbeat_secs=5)
    job = enqueue(pool)
    att = claim(pool, job.id)
    backend.client.pexpire(pool.keys.lease(job.id), 50)
    req = att.heartbeat()
    assert (req.pause, req.cancel) == (False, False)
    assert pool.store.client.pttl(pool.keys.lease(job.id)) > 20_000 and lease(pool, job.id) == "boot-a:1"
    pool.pause(job.id)
    pool.cancel(job.id)
    req = att.heartbeat()
    assert (req.pause, req.cancel) == (True, True)


def test_set_container_records_what_was_launched(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    att = claim(pool, job.id)
    att.set_container("c0ffee", "daemon-1", identity={"pid": 42, "start": 7})
    got = pool.get(job.id)
    assert (got.container_id, got.daemon_id) == ("c0ffee", "daemon-1")
    assert json.loads(got.identity) == {"pid": 42, "start": 7}
    assert int(row(pool, job.id)["launched_at"]) > 0


def test_set_container_renews_the_lease_and_reads_requests(backend: Backend) -> None:
    # A Docker launch records its container between create and start: that one call is also the fence, so
    # it must renew the lease and say whether a pause or cancel came in meanwhile, as a heartbeat does.
    pool = backend.pool(lease_secs=30, heartbeat_secs=5)
    job = enqueue(pool)
    att = claim(pool, job.id)
    backend.client.pexpire(pool.keys.lease(job.id), 50)
    req = att.set_container("c0ffee", "daemon-1")
    assert (req.pause, req.cancel) == (False, False)
    assert pool.store.client.pttl(pool.keys.lease(job.id)) > 20_000 and lease(pool, job.id) == "boot-a:1"
    pool.cancel(job.id)
    req = att.set_container("c0ffee", "daemon-1")
    assert (req.pause, req.cancel) == (False, True)


FENCED_WRITES = {
    "heartbeat": lambda a: a.heartbeat(),
    "set_container": lambda a: a.set_container("evil", "d"),
    "finish_exit": lambda a: a.finish("exit", 0),
    "finish_interrupted": lambda a: a.finish("interrupted", 75),
    "finish_error": lambda a: a.finish("error", reason="launch failed"),
}


@pytest.mark.parametrize("write", sorted(FENCED_WRITES))
@pytest.mark.parametrize("who", ["other_boot", "old_attempt", "next_attempt", "unclaimed_by_me"])
def test_fenced_write_from_a_non_owner_is_refused_byte_for_byte(backend: Backend, write: str,
                                                                who: str) -> None:
    pool = backend.pool(lease_secs=30, heartbeat_secs=5)
    job = enqueue(pool)
    enqueue(pool)  # a queued job a wrongly accepted finish would promote
    claim(pool, job.id, "boot-a")
    imposter = {"other_boot": Attempt(pool.store, job.id, "boot-b", 1),
                "old_attempt": Attempt(pool.store, job.id, "boot-a", 0),
                "next_attempt": Attempt(pool.store, job.id, "boot-a", 2),
                "unclaimed_by_me": Attempt(pool.store, job.id, "", 1)}[who]
    backend.client.pexpire(pool.keys.lease(job.id), 10_000_000)  # a renewal would show as a shorter TTL
    before_row, before = backend.raw.hgetall(pool.keys.job(job.id)), backend.keyspace()
    with pytest.raises(errors.NotOwner):
        FENCED_WRITES[write](imposter)
    assert backend.raw.hgetall(pool.keys.job(job.id)) == before_row
    assert backend.keyspace() == before
    assert pool.store.client.pttl(pool.keys.lease(job.id)) > 9_000_000


@pytest.mark.parametrize("write", sorted(FENCED_WRITES))
def test_fenced_write_with_an_empty_boot_on_an_unclaimed_row_is_refused(backend: Backend, write: str) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    assert pool.get(job.id).owner_boot == ""
    before = backend.keyspace()
    with pytest.raises(errors.NotOwner):
        FENCED_WRITES[write](Attempt(pool.store, job.id, "", 1))
    assert backend.keyspace() == before


@pytest.mark.parametrize("write", sorted(FENCED_WRITES))
def test_fenced_write_after_the_job_ended_is_refused(backend: Backend, write: str) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    att = claim(pool, job.id)
    att.finish("exit", 0)
    before = backend.keyspace()
    if write.startswith("finish"):
        # Its own finish sent again (its reply was lost): the answer it had, and nothing written.
        assert FENCED_WRITES[write](att) == "succeeded"
    else:
        with pytest.raises(errors.NotOwner):
            FENCED_WRITES[write](att)
    assert backend.keyspace() == before


@pytest.mark.parametrize("write", sorted(FENCED_WRITES))
def test_fenced_write_to_an_unknown_job_is_not_found(backend: Backend, write: str) -> None:
    pool = backend.pool()
    enqueue(pool)
    before = backend.keyspace()
    with pytest.raises(errors.NotFound):
        FENCED_WRITES[write](Attempt(pool.store, "f" * 32, "boot-a", 1))
    assert backend.keyspace() == before


# ---- finish outcomes ----------------------------------------------------------------------------------


def test_finish_exit_0_succeeds_and_frees_the_slot(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    att = claim(pool, job.id)
    assert att.finish("exit", 0, log_tail=b"all done\n") == "succeeded"
    got = pool.get(job.id)
    assert got.state is JobState.SUCCEEDED and got.exit_code == 0 and got.error_reason == ""
    assert got.finished_at is not None and got.owner_boot == ""
    assert index_of(pool, job.id) == ["succeeded"] and running_ids(pool) == set()
    assert lease(pool, job.id) is None and pool.logs(job.id) == "all done\n"
    assert_event(last_event(pool, job.id), job.id, "running", "succeeded", "exit_0", evidence="exit_code=0",
                 actor="boot-a")


@pytest.mark.parametrize("code", [1, 2, 137, 255])
def test_finish_nonzero_exit_fails_with_code_and_reason(backend: Backend, code: int) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    assert claim(pool, job.id).finish("exit", code) == "failed"
    got = pool.get(job.id)
    assert (got.state, got.exit_code, got.error_reason) == (JobState.FAILED, code, f"exit_code_{code}")
    assert index_of(pool, job.id) == ["failed"] and lease(pool, job.id) is None
    assert_event(last_event(pool, job.id), job.id, "running", "failed", f"exit_code_{code}")


def test_finish_error_fails_with_the_given_reason(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    assert claim(pool, job.id).finish("error", reason="image not found") == "failed"
    got = pool.get(job.id)
    assert (got.state, got.exit_code, got.error_reason) == (JobState.FAILED, None, "image not found")
    assert_event(last_event(pool, job.id), job.id, "running", "failed", "image not found")


def test_finish_error_after_a_cancel_request_is_cancelled(backend: Backend) -> None:
    """The launch failed, so nothing runs: the user's cancel is what happened, not a failure."""
    pool = backend.pool()
    job = enqueue(pool)
    att = claim(pool, job.id)
    assert pool.cancel(job.id).cancel_requested
    assert att.finish("error", reason="image not found") == "cancelled"
    assert pool.get(job.id).state == JobState.CANCELLED and pool.slots()[0] == 0


@pytest.mark.parametrize(("request_", "kind", "code", "expected"), [
    ("cancel", "exit", 143, "cancelled"),
    ("pause", "exit", 143, "paused"),
    ("cancel", "interrupted", 75, "cancelled"),
    ("pause", "interrupted", 75, "paused"),  # a user's pause beats a shutdown interrupt already in flight
    ("both", "exit", 1, "cancelled"),
    ("cancel", "exit", 0, "succeeded"),  # exit 0 is success whatever was asked
    ("pause", "interrupted", 0, "succeeded"),
])
def test_finish_persisted_requests_win(backend: Backend, request_: str, kind: str, code: int,
                                       expected: str) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    att = claim(pool, job.id)
    if request_ in ("pause", "both"):
        pool.pause(job.id, reason="user")
    if request_ in ("cancel", "both"):
        pool.cancel(job.id, reason="user")
    assert att.finish(kind, code) == expected
    got = pool.get(job.id)
    assert got.state.value == expected and index_of(pool, job.id) == [expected]
    assert not got.pause_requested and not got.cancel_requested and lease(pool, job.id) is None
    if expected == "paused":
        assert pool.store.client.zscore(pool.keys.paused_jobs, job.id) == got.seq
    assert last_event(pool, job.id)["to"] == expected


def test_finish_interrupted_hands_back_to_its_place_without_spending_budget(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    first = enqueue(pool)
    later = [enqueue(pool) for _ in range(2)]
    att = claim(pool, first.id)
    pool.pause(None)  # keep promotion from taking it straight back
    assert att.finish("interrupted", 75, log_tail="checkpointed") == "queued"
    got = pool.get(first.id)
    assert got.state is JobState.QUEUED and got.seq == first.seq and got.recovery_attempts == 0
    assert got.owner_boot == "" and got.error_reason == "shutdown_handback" and lease(pool, first.id) is None
    assert queued_ids(pool) == [first.id] + [j.id for j in later]
    assert pool.store.client.zscore(pool.keys.queued, first.id) == first.seq
    assert rq_list(pool) == []
    assert_event(last_event(pool, first.id), first.id, "running", "queued", "shutdown_handback")
    pool.resume(None)
    assert state_of(pool, first.id) == "running" and pool.get(first.id).attempt == 2
    assert [state_of(pool, j.id) for j in later] == ["queued", "queued"]


def test_finish_with_a_bad_kind_or_code_writes_nothing(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    att = claim(pool, job.id)
    before = backend.keyspace()
    for kind, code in (("exploded", 1), ("exit", None), ("interrupted", None)):
        with pytest.raises(errors.InvalidArgument, match="bad argument"):
            att.finish(kind, code)
    assert backend.keyspace() == before


def test_finish_promotes_the_next_job_in_the_same_call(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    nxt = enqueue(pool)
    att = claim(pool, job.id)
    reply = pool.store.run("finish",
                           [pool.keys.job(job.id), pool.keys.lease(job.id), *pool.store.candidates(4)],
                           [job.id, "boot-a", att.attempt, "exit", 0, "", ""])
    assert reply[:3] == [0, "succeeded", 1]
    assert state_of(pool, nxt.id) == "running" and rq_list(pool) == [nxt.id]
    assert_event(last_event(pool, nxt.id), nxt.id, "queued", "running", "promoted", actor="boot-a")


def test_finish_promotes_even_when_its_candidates_went_stale(backend: Backend) -> None:
    """The candidates are read before finish; a handed-back job jumps ahead of them. The script promotes
    nothing ('stale') and `Attempt.finish` completes the promotion: the slot is never left idle."""
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    nxt = enqueue(pool)
    reply = pool.store.run("finish",
                           [pool.keys.job(job.id), pool.keys.lease(job.id), *pool.store.candidates(4)],
                           [job.id, claim(pool, job.id).boot_id, 1, "interrupted", 75, "", ""])
    assert reply == [0, "queued", 0, "stale"]
    assert pool.slots() == (0, 1) and queued_ids(pool) == [job.id, nxt.id]  # the gap the caller must close
    assert pool.promote() == 1 and state_of(pool, job.id) == "running" and pool.get(job.id).attempt == 2
    # Through the API the stale reply is followed by a promote at once.
    assert claim(pool, job.id).finish("interrupted", 75) == "queued"
    assert state_of(pool, job.id) == "running" and pool.get(job.id).attempt == 3
    assert state_of(pool, nxt.id) == "queued"


def test_log_tail_keeps_the_last_64_kib(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    tail = b"\xff\xfe" + b"a" * (LOG_TAIL_BYTES + 10) + b"END"
    claim(pool, job.id).finish("exit", 0, log_tail=tail)
    stored = cast(bytes, backend.raw.hget(pool.keys.job(job.id), "log_tail"))
    assert len(stored) < 2048  # 64 KiB of one letter, stored compressed (jobpool/logtail.py)
    assert pool.logs(job.id) == tail[-LOG_TAIL_BYTES:].decode()


# ---- events -------------------------------------------------------------------------------------------


def test_every_transition_of_a_life_is_in_the_stream_in_order(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    att = claim(pool, job.id)
    pool.pause(job.id)
    att.finish("exit", 143)
    pool.resume(job.id)
    att2 = claim(pool, job.id, "boot-b")
    att2.finish("interrupted", 75)
    att3 = claim(pool, job.id, "boot-c")
    att3.finish("exit", 0)
    trail = [(e["from"], e["to"], e["reason"]) for e in events_of(pool, job.id)]
    assert trail == [
        ("", "queued", "enqueued"), ("queued", "running", "promoted"), ("running", "running", "claimed"),
        ("running", "running", "pause_requested"), ("running", "paused", "pause_requested"),
        ("paused", "queued", "resume"), ("queued", "running", "promoted"), ("running", "running", "claimed"),
        ("running", "queued", "shutdown_handback"), ("queued", "running", "promoted"),
        ("running", "running", "claimed"), ("running", "succeeded", "exit_0"),
    ]
    ids = [e["id"] for e in events_of(pool)]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    assert pool.events(job.id, after=events_of(pool, job.id)[-2]["id"]) == events_of(pool, job.id)[-2:]
