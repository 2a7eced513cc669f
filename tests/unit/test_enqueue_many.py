"""`Pool.enqueue_many` and the batch enqueue script, on fakeredis[lua] and a real redis-server (`backend`).

What a batch promises (jobpool/submit.py, scripts/enqueue.lua): every spec is checked before anything is
written (one bad spec refuses all, the keyspace unchanged: tests/support/snapshot.py); the jobs are queued in
input order, across batch boundaries; equal jobs coalesce, into a job queued before or one earlier in the
input; the new jobs at the head are promoted into free slots in the same step; the Jobs returned are the rows
as written. And the RQ job hash the script writes is the one RQ itself would read back.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from rq.job import Callback, JobStatus
from rq.job import Job as RQJob
from rq.serializers import JSONSerializer

from jobpool import errors, submit
from jobpool.api import Pool
from jobpool.config import Settings
from jobpool.models import Job, JobState
from jobpool.rqjob import ENTRY_POINT, after_delivery
from jobpool.store import runner
from jobpool.store.redisurl import connect
from jobpool.store.runner import _held_call
from jobpool.submit import MAX_BATCH_SIZE
from tests.support.pool_helpers import Backend, enqueue, events_of, queued_ids, rq_hash, rq_list, running_ids
from tests.support.servers import free_port


def spec(*command: str, **kw: Any) -> dict[str, Any]:
    return {"image": "busybox", "command": list(command) or ["true"], **kw}


def same_as_row(pool: Pool, job: Job) -> None:
    """A Job returned by enqueue_many is its row as written (read back with `get`)."""
    assert pool.get(job.id, coalesced=job.coalesced).to_dict() == job.to_dict()


# ---- order and batches ----------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [1, 3, 100])
def test_jobs_are_queued_in_input_order_across_batches(backend: Backend, batch_size: int) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    before = enqueue(pool, "before")
    jobs = pool.enqueue_many([spec("echo", str(i)) for i in range(7)], batch_size=batch_size)
    assert [j.spec.command for j in jobs] == [("echo", str(i)) for i in range(7)]
    assert [j.seq for j in jobs] == list(range(2, 9))
    assert queued_ids(pool) == [before.id] + [j.id for j in jobs]
    assert len({j.id for j in jobs}) == 7 and all(len(j.id) == 32 for j in jobs)
    for job in jobs:
        assert job.state is JobState.QUEUED and not job.coalesced
        same_as_row(pool, job)
    assert [e["reason"] for e in events_of(pool)] == ["enqueued"] * 8
    assert [e["job"] for e in events_of(pool)] == [before.id] + [j.id for j in jobs]


def test_each_job_has_its_history_and_a_promoted_one_its_rq_record(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2)
    jobs = pool.enqueue_many([spec("a"), spec("b", image="other"), spec("c")], batch_size=3)
    for job in jobs[:2]:
        fetched = RQJob.fetch(job.id, connection=backend.raw, serializer=JSONSerializer)
        assert fetched.func_name == ENTRY_POINT and fetched.get_status() == JobStatus.QUEUED
        assert fetched.origin == pool.keys.rq_queue_name
        assert fetched.description == f"jobpool {job.id} ({job.spec.image})"
    assert rq_hash(backend, pool, jobs[2].id) == {}  # queued: RQ's record is made when it is promoted
    assert [[e["reason"] for e in pool.events(j.id)] for j in jobs] == [["enqueued", "promoted"]] * 2 + [
        ["enqueued"]]
    assert rq_list(pool) == [j.id for j in jobs[:2]]


def test_the_rq_hash_is_read_by_rq_as_its_own(backend: Backend) -> None:
    """Promotion leaves out RQ's empty fields and writes the per-job ones itself: RQ must restore the hash
    exactly as it restores the one its own `Job.create` and enqueue write for the same job."""
    pool = backend.pool(max_concurrent_jobs=1)
    (job,) = pool.enqueue_many([spec("x")])
    ours = RQJob.fetch(job.id, connection=backend.raw, serializer=JSONSerializer)
    theirs = RQJob.create(
        func=ENTRY_POINT, id="theirs", origin=pool.keys.rq_queue_name, timeout=-1, result_ttl=-1,
        failure_ttl=-1, status=JobStatus.QUEUED, serializer=JSONSerializer, description=ours.description,
        on_success=Callback(after_delivery), meta={"jobpool_attempt": 1}, connection=backend.raw)
    theirs.created_at, theirs.enqueued_at = ours.created_at, ours.enqueued_at
    theirs.save()
    restored = RQJob.fetch("theirs", connection=backend.raw, serializer=JSONSerializer)
    assert ours.to_dict() == restored.to_dict()
    fields = ("func_name", "args", "kwargs", "success_callback", "success_callback_timeout",
              "failure_callback", "stopped_callback", "worker_name", "started_at", "ended_at",
              "last_heartbeat", "group_id", "timeout", "result_ttl", "failure_ttl", "origin", "meta",
              "enqueued_at")
    assert {f: getattr(ours, f) for f in fields} == {f: getattr(restored, f) for f in fields}
    assert ours.get_status() == restored.get_status() == JobStatus.QUEUED
    assert ours.success_callback is after_delivery
    # The creation time is the row's (the server's clock), in RQ's own format.
    assert int(ours.created_at.timestamp() * 1000) == job.created_at


def test_an_empty_input_writes_nothing(backend: Backend) -> None:
    pool = backend.pool()
    before = backend.keyspace()
    assert pool.enqueue_many([]) == [] and pool.enqueue_many(iter(())) == []
    assert backend.keyspace() == before


def test_any_iterable_is_taken_once(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    jobs = pool.enqueue_many(spec("g", str(i)) for i in range(3))
    assert [j.spec.command[1] for j in jobs] == ["0", "1", "2"]


# ---- coalescing ---------------------------------------------------------------------------------------


def test_equal_jobs_in_one_batch_coalesce_into_the_first(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    jobs = pool.enqueue_many([spec("a", coalesce=True), spec("b"), spec("a", coalesce=True),
                              spec("a"), spec("a", coalesce=True)])
    first = jobs[0]
    assert [j.coalesced for j in jobs] == [False, False, True, False, True]
    assert jobs[2].id == jobs[4].id == first.id and jobs[3].id != first.id  # no coalesce asked: a new job
    assert jobs[2].state is JobState.QUEUED and jobs[2].seq == first.seq
    assert queued_ids(pool) == [first.id, jobs[1].id, jobs[3].id]
    assert [j.seq for j in (first, jobs[1], jobs[3])] == [1, 2, 3]
    assert pool.store.client.hgetall(pool.keys.coalesce) == {first.coalesce_key: first.id}
    for job in jobs:
        same_as_row(pool, job)
    # Counted once per new job (the script counts a batch in one step), and one event each.
    assert pool.store.client.hget(pool.keys.metrics, "transitions:queued:enqueued") == "3"
    assert [e["job"] for e in events_of(pool)] == [first.id, jobs[1].id, jobs[3].id]


def test_a_job_coalesces_into_one_queued_before_and_across_batches(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    queued = enqueue(pool, "a", coalesce=True)
    jobs = pool.enqueue_many([spec("b", coalesce_key="k"), spec("a", coalesce=True), spec("c"),
                              spec("other", coalesce_key="k")], batch_size=2)
    assert [j.coalesced for j in jobs] == [False, True, False, True]
    assert jobs[1].id == queued.id and jobs[3].id == jobs[0].id  # the key joined different specs
    assert jobs[3].spec.command == ("b",)  # the job it coalesced into, not the spec asked for
    assert queued_ids(pool) == [queued.id, jobs[0].id, jobs[2].id]


def test_a_running_job_is_not_coalesced_into(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    running = enqueue(pool, "a", coalesce=True)
    assert running.state is JobState.RUNNING
    (job,) = pool.enqueue_many([spec("a", coalesce=True)])
    assert not job.coalesced and job.id != running.id and job.state is JobState.QUEUED


def test_twins_in_one_batch_coalesce_even_when_the_first_is_promoted_by_it(backend: Backend) -> None:
    """Within one call the first job is still queued when its twin comes (promotion comes after every job is
    written), so they coalesce; the twin's Job is the first as it is after the call: running."""
    pool = backend.pool(max_concurrent_jobs=1)
    first, twin = pool.enqueue_many([spec("a", coalesce=True), spec("a", coalesce=True)])
    assert twin.coalesced and twin.id == first.id
    assert first.state is twin.state is JobState.RUNNING and twin.attempt == 1
    assert running_ids(pool) == {first.id} and queued_ids(pool) == []


# ---- promotion ----------------------------------------------------------------------------------------


def test_the_new_head_is_promoted_into_free_slots_in_order(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=3)
    jobs = pool.enqueue_many([spec("p", str(i)) for i in range(5)])
    assert [j.state for j in jobs] == [JobState.RUNNING] * 3 + [JobState.QUEUED] * 2
    assert [j.attempt for j in jobs] == [1, 1, 1, 0, 0]
    assert rq_list(pool) == [j.id for j in jobs[:3]]
    assert queued_ids(pool) == [j.id for j in jobs[3:]]
    for job in jobs:
        same_as_row(pool, job)
    assert rq_hash(backend, pool, jobs[0].id)[b"status"] == b"queued"
    assert rq_hash(backend, pool, jobs[3].id) == {}  # made at its promotion


def test_a_twin_in_the_batch_does_not_stop_promotion(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=3)
    jobs = pool.enqueue_many([spec("a", coalesce=True), spec("a", coalesce=True), spec("b"), spec("c")])
    assert [j.state for j in jobs] == [JobState.RUNNING] * 4 and jobs[1].id == jobs[0].id
    assert rq_list(pool) == [jobs[0].id, jobs[2].id, jobs[3].id]


def test_more_free_slots_than_one_script_promotes(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=100)
    jobs = pool.enqueue_many([spec("m", str(i)) for i in range(80)], batch_size=100)
    # The script promotes at most 64 (PROMOTE_BATCH_LIMIT, _lib.lua); the caller promotes the rest at once.
    assert [j.state for j in jobs] == [JobState.RUNNING] * 64 + [JobState.QUEUED] * 16
    assert pool.slots() == (80, 100) and rq_list(pool) == [j.id for j in jobs]


def test_behind_an_older_head_the_caller_promotes_in_fifo_order(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    old = enqueue(pool, "old")
    pool.store.client.hset(pool.keys.config, "max_concurrent_jobs", 2)  # free slots, nothing promoted yet
    jobs = pool.enqueue_many([spec("x"), spec("y")])
    assert running_ids(pool) == {old.id, jobs[0].id} and queued_ids(pool) == [jobs[1].id]
    assert rq_list(pool) == [old.id, jobs[0].id]


def test_a_paused_queue_promotes_nothing(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2)
    pool.pause(None, reason="hold")
    jobs = pool.enqueue_many([spec("x"), spec("y")])
    assert [j.state for j in jobs] == [JobState.QUEUED] * 2 and rq_list(pool) == []


# ---- bad input: refused whole, nothing written --------------------------------------------------------

BAD_ITEMS = [
    (spec("x", image=""), "image must be a non-empty string"),
    ({"command": ["x"]}, "image must be a non-empty string"),
    (spec("x", privileged=True), "unknown spec field(s): privileged"),
    (spec("x", env={"1A": "v"}), "env key '1A' is not a valid name"),
    (spec("x", coalesce="yes"), "coalesce must be true or false"),
    (spec("x", coalesce_key=""), "coalesce_key must be a non-empty string"),
    (spec("x", coalesce_key="k" * 1025), "coalesce_key is longer than 1024 bytes"),
    (spec("x", network="host"), "network 'host' would share another namespace"),
    (["busybox", "true"], "must be a mapping of enqueue's arguments, got list"),
    ("busybox true", "must be a mapping of enqueue's arguments, got str"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_ITEMS, ids=[m for _, m in BAD_ITEMS])
@pytest.mark.parametrize("position", [0, 4, 6])
def test_one_bad_spec_refuses_the_whole_input_and_writes_nothing(
        backend: Backend, bad: Any, message: str, position: int) -> None:
    pool = backend.pool(max_concurrent_jobs=2)
    enqueue(pool, "seeded", coalesce=True)  # some state, so "nothing written" means more than an empty db
    items: list[Any] = [spec("ok", str(i)) for i in range(6)]
    items.insert(position, bad)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidSpec) as caught:
        pool.enqueue_many(items, batch_size=2)
    assert caught.value.index == position
    assert str(caught.value) == f"spec {position}: {caught.value.reason}"
    assert message in caught.value.reason
    assert backend.keyspace() == before


@pytest.mark.parametrize("specs", [None, 3, "busybox", {"image": "busybox", "command": ["x"]}])
def test_specs_that_are_not_a_list_of_jobs_are_refused(backend: Backend, specs: Any) -> None:
    pool = backend.pool()
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument, match="specs must be an iterable of mappings"):
        pool.enqueue_many(specs)
    assert backend.keyspace() == before


@pytest.mark.parametrize("size", [0, -1, MAX_BATCH_SIZE + 1, 2.5, True])
def test_a_bad_batch_size_is_refused(backend: Backend, size: Any) -> None:
    pool = backend.pool()
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument, match="batch_size"):
        pool.enqueue_many([spec("x")], batch_size=size)
    assert backend.keyspace() == before


def _raw_batch(pool: Pool, ids: list[str]) -> list[Any]:
    keys: list[str] = []
    args: list[Any] = ["t", ""]
    for job_id in ids:
        keys += [pool.keys.job(job_id), pool.keys.rq_job(job_id)]
        args += [job_id, '{"image":"x","command":["y"]}', "", "", "", ""]
    return pool.store.run("enqueue", keys, args)


def test_an_id_that_exists_or_repeats_refuses_the_whole_call(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    job = enqueue(pool)
    before = backend.keyspace()
    with pytest.raises(errors.AlreadyExists, match=job.id):
        _raw_batch(pool, ["a" * 32, "b" * 32, job.id])
    with pytest.raises(errors.AlreadyExists, match="c" * 32):
        _raw_batch(pool, ["c" * 32, "d" * 32, "c" * 32])
    assert backend.keyspace() == before
    assert _raw_batch(pool, ["a" * 32, "b" * 32])[1] == 2  # the same ids alone are fine


def test_keys_and_arguments_that_disagree_are_refused(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument, match="job keys for"):
        pool.store.run("enqueue", [pool.keys.job("a"), pool.keys.rq_job("a")], ["t", "", "a", "{}", ""])
    with pytest.raises(errors.InvalidArgument, match="job keys for"):
        pool.store.run("enqueue", [pool.keys.job("a")], ["t", "", "a", "{}", "", "x", "", "", ""])
    with pytest.raises(errors.InvalidArgument, match="job keys for"):
        pool.store.run("enqueue", [], ["t", ""])
    assert backend.keyspace() == before


# ---- the client side: connections ---------------------------------------------------------------------


def test_the_script_is_loaded_again_after_a_script_flush(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    enqueue(pool, "one")
    backend.raw.script_flush()
    assert pool.enqueue_many([spec("two")])[0].seq == 2
    assert enqueue(pool, "three").seq == 3


def test_threads_enqueue_at_once_each_on_its_own_connection(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    out: dict[int, list[Job]] = {}
    clients: dict[int, int] = {}

    def work(n: int) -> None:
        out[n] = [enqueue(pool, f"t{n}", str(i)) for i in range(20)]
        clients[n] = id(pool.store.thread_clients.get(pool.store.client))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(clients.values())) == 4
    ids = [j.id for jobs in out.values() for j in jobs]
    assert sorted(queued_ids(pool)) == sorted(ids) and len(set(ids)) == 80
    seqs = sorted(j.seq for jobs in out.values() for j in jobs)
    assert seqs == list(range(1, 81))
    for jobs in out.values():  # each thread's jobs in its own order
        assert [j.seq for j in jobs] == sorted(j.seq for j in jobs)


def test_a_closed_pool_enqueues_again(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    enqueue(pool, "one")
    pool.close()
    assert enqueue(pool, "two").seq == 2


@pytest.mark.parametrize("packer", ["hiredis", "redis-py"])
def test_the_held_connection_answers_as_execute_command_does(backend: Backend, packer: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The enqueue's call is sent on the held connection by jobpool/store/runner.py (`_held_call`), packed by
    hiredis (or by the connection, without hiredis): a reply, an error reply (the connection kept) and an
    argument no packer can send (DataError, as redis-py raises it; nothing sent) come back as
    `execute_command` gives them."""
    if packer == "redis-py":
        monkeypatch.setattr(runner, "_hiredis_pack", None)
    pool = backend.pool(max_concurrent_jobs=0)
    client = pool.store.thread_clients.get(pool.store.client)
    client.ping()
    conn = client.connection
    assert _held_call(conn, ("ECHO", "héllo")) == client.execute_command("ECHO", "héllo") == "héllo"
    assert _held_call(conn, ("INCRBY", "n", 2)) == 2
    with pytest.raises(redis.ResponseError) as held:
        _held_call(conn, ("INCRBY", "n", "x"))
    with pytest.raises(redis.ResponseError) as plain:
        client.execute_command("INCRBY", "n", "x")
    assert str(held.value) == str(plain.value)
    with pytest.raises(redis.DataError):
        client.execute_command("ECHO", None)
    with pytest.raises(redis.DataError):
        _held_call(conn, ("ECHO", None))
    assert client.connection is conn and _held_call(conn, ("PING",)) == "PONG"  # no response callback
    assert enqueue(pool, "after").seq == 1


# ---- the client's work between batches, done while the server runs one -----------------------------------


def test_a_failed_batch_stops_the_rest_and_leaves_those_before(backend: Backend,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The third batch's first id is an existing job's, so the script refuses that batch whole: the two
    batches before it stand, in order, and nothing after it was sent, though its arguments were made while
    the second ran."""
    pool = backend.pool(max_concurrent_jobs=0)
    old = enqueue(pool, "old")
    ids = iter([f"{i:032x}" for i in range(4)] + [old.id] + [f"{i:032x}" for i in range(5, 9)])
    monkeypatch.setattr("jobpool.submit.os.urandom", lambda n: bytes.fromhex(next(ids)))
    with pytest.raises(errors.AlreadyExists,
                       match=r"\(the first 4 of the 9 jobs were enqueued before it\)") as caught:
        pool.enqueue_many([spec("echo", str(i)) for i in range(9)], batch_size=2)
    assert (caught.value.enqueued, caught.value.unknown) == (4, ()), "a refused batch wrote nothing"
    assert queued_ids(pool) == [old.id] + [f"{i:032x}" for i in range(4)]
    assert [pool.get(f"{i:032x}").spec.command for i in range(4)] == [("echo", str(i)) for i in range(4)]


def test_the_callers_work_runs_once_while_the_script_runs(backend: Backend) -> None:
    """`Scripts.run`'s `meanwhile`: run once, also when the call is sent again after NOSCRIPT; a meanwhile
    that raises drops the held connection (its reply unread), and the next call reads its own reply."""
    pool = backend.pool(max_concurrent_jobs=0)
    client = pool.store.thread_clients.get(pool.store.client)
    ran: list[int] = []
    backend.raw.script_flush()
    pool.store.scripts.run("set_slots", pool.store.pool_keys("set_slots"), [3, "t"], client=client,
                           meanwhile=lambda: ran.append(1))
    assert ran == [1] and pool.slots()[1] == 3

    def fails() -> None:
        raise RuntimeError("the caller's own work failed")
    with pytest.raises(RuntimeError, match="own work failed"):
        pool.store.scripts.run("set_slots", pool.store.pool_keys("set_slots"), [4, "t"], client=client,
                               meanwhile=fails)
    client = pool.store.thread_clients.get(pool.store.client)
    assert enqueue(pool, "next").seq == 1  # its own reply, not set_slots'
    assert pool.slots()[1] in (3, 4)  # the call's outcome is unknown, as for a lost reply


@pytest.mark.parametrize("gone_before_read", [False, True])
def test_a_coalesced_job_is_read_back_after_its_batch(backend: Backend, monkeypatch: pytest.MonkeyPatch,
                                                       gone_before_read: bool) -> None:
    """The queued job a coalesced job matched is read while the next batch runs, not after the last: a row
    that goes later does not fail the call. If it went before it was read, the error says how many of the
    jobs were enqueued, and no batch is sent after it."""
    pool = backend.pool(max_concurrent_jobs=0)
    twin = pool.enqueue("busybox", ["twin"], coalesce_key="k")
    real = submit._call_args
    gone_at = 1 if gone_before_read else 2  # while batch 0 runs (before its twin is read), or batch 1

    def call_args(p: Pool, batch: list[submit.Prepared]) -> Any:
        if batch[0].spec.command == (f"job{gone_at}",):
            backend.raw.delete(pool.keys.job(twin.id))
        return real(p, batch)
    monkeypatch.setattr(submit, "_call_args", call_args)
    items = [spec("job0", coalesce_key="k"), spec("job1"), spec("job2")]
    if not gone_before_read:
        jobs = pool.enqueue_many(items, batch_size=1)
        assert jobs[0].id == twin.id and jobs[0].coalesced and jobs[0].state is JobState.QUEUED
        assert [j.spec.command for j in jobs[1:]] == [("job1",), ("job2",)]
        return
    with pytest.raises(errors.NotFound,
                       match=r"\(the first 2 of the 3 jobs were enqueued before it\)") as caught:
        pool.enqueue_many(items, batch_size=1)
    assert caught.value.enqueued == 2
    commands = [pool.get(i).spec.command for i in queued_ids(pool) if i != twin.id]
    assert commands == [("job1",)], "job2's batch was not sent"


# ---- what an error says stands (jobpool/submit.py, `_settled`; lost replies: test_lost_replies.py) ---------


def test_a_failed_promotion_after_a_batch_counts_the_batch(backend: Backend,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The promotion a batch's script left undone (`Store.finish_promotion`) fails after the batch was
    applied: the batch is counted, and nothing after it is sent."""
    pool = backend.pool(max_concurrent_jobs=0)
    calls: list[Any] = []

    def finish_promotion(reply: Any, actor: str) -> None:
        calls.append(reply)
        if len(calls) == 2:
            raise errors.RedisUnavailable("redis unreachable: gone while promoting")
    monkeypatch.setattr(pool.store, "finish_promotion", finish_promotion)
    with pytest.raises(errors.RedisUnavailable,
                       match=r"\(the first 4 of the 5 jobs were enqueued before it\)") as caught:
        pool.enqueue_many([spec("echo", str(i)) for i in range(5)], batch_size=2)
    assert (caught.value.enqueued, caught.value.unknown) == (4, ())
    assert [pool.get(i).spec.command for i in queued_ids(pool)] == [("echo", str(i)) for i in range(4)]


def test_a_batch_never_sent_is_counted_without_asking() -> None:
    """No Redis at all: the first batch's call fails before it is sent (its connection cannot be opened), so
    nothing was written and the count is exact (0), not unknown."""
    dead = redis.Redis(host="127.0.0.1", port=free_port(), decode_responses=True, socket_connect_timeout=2)
    pool = Pool(dead, Settings(max_concurrent_jobs=0))
    with pytest.raises(errors.RedisUnavailable) as caught:
        pool.enqueue_many([spec("echo", str(i)) for i in range(3)], batch_size=2)
    assert (caught.value.enqueued, caught.value.unknown) == (0, ())
    assert "unknown" not in str(caught.value) and "enqueued" not in str(caught.value)


def test_bad_input_is_refused_before_any_batch_is_sent(backend: Backend) -> None:
    """A refused spec raises before any batch is sent: no count at all, the message as ever, and nothing
    written."""
    pool = backend.pool(max_concurrent_jobs=0)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidSpec) as caught:
        pool.enqueue_many([spec("ok"), spec("x", image="")])
    assert (caught.value.enqueued, caught.value.unknown) == (None, ())
    assert str(caught.value) == f"spec 1: {caught.value.reason}" and "enqueued" not in str(caught.value)
    assert backend.keyspace() == before


def test_a_batch_the_replicas_did_not_acknowledge_is_unknown(redis_url: str) -> None:
    """With JOBPOOL_REDIS_WAIT_REPLICAS and no replica, every call is applied on the primary and raised as
    `NotReplicated` (a failover could still lose it): the rows are found, yet the batch is not counted as
    enqueued but as unknown, and the message says how to settle it."""
    pool = Pool(connect(redis_url), Settings(max_concurrent_jobs=0, redis_wait_replicas=1,
                                             redis_wait_timeout_secs=0.01))
    with pytest.raises(errors.NotReplicated) as caught:
        pool.enqueue_many([spec("echo", str(i)) for i in range(3)], batch_size=2)
    exc = caught.value
    assert exc.enqueued == 0 and len(exc.unknown) == 2, str(exc)
    assert [pool.get(i).spec.command for i in exc.unknown] == [("echo", "0"), ("echo", "1")]
    assert queued_ids(pool) == list(exc.unknown), "nothing after it was sent"
    assert f"if job {exc.unknown[0]} exists" in str(exc) and "on too few replicas" in str(exc)
