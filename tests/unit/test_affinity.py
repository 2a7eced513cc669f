"""Checkpoint affinity in the scripts, on fakeredis[lua] and a real server: a job handed back resumable by its
own exit names the daemon that holds its checkpoint (finish.lua), `Pool.get` and `jobpool show` say it, a
crash or a terminal state do not set it, and `resume --anywhere` releases it (resume_job.lua)."""

from __future__ import annotations

import pytest

from jobpool import Pool, errors
from jobpool.contract import EXIT_TEMPFAIL, REASON_RESTART_LOST_EXIT
from jobpool.models import Job
from jobpool.workers.attempt import Attempt
from tests.support.attempts import claim
from tests.support.pool_helpers import (
    Backend,
    enqueue,
    events_of,
    reconcile,
    row,
    rq_hash,
    rq_list,
    state_of,
)


def running_on(backend: Backend, daemon: str = "daemon-1") -> tuple[Pool, str, Attempt]:
    pool = backend.pool(max_concurrent_jobs=1, recovery_budget=1)
    job = enqueue(pool)
    att = claim(pool, job.id)
    att.set_container("c-1", daemon)
    return pool, job.id, att


def test_an_interrupted_handback_names_the_daemon_holding_its_checkpoint(backend: Backend) -> None:
    pool, job_id, att = running_on(backend, "daemon-1")
    pool.pause(None)  # so it stays queued where we can see it
    assert att.finish("interrupted", EXIT_TEMPFAIL) == "queued"
    assert pool.get(job_id).affinity == "daemon-1"
    assert pool.get(job_id).to_dict()["affinity"] == "daemon-1"


def test_a_paused_job_names_the_daemon_holding_its_checkpoint(backend: Backend) -> None:
    pool, job_id, att = running_on(backend, "daemon-2")
    pool.pause(job_id)
    assert att.finish("interrupted", EXIT_TEMPFAIL) == "paused"
    assert pool.get(job_id).affinity == "daemon-2"


def test_a_crash_or_a_job_that_never_ran_on_a_daemon_gets_no_affinity(backend: Backend) -> None:
    pool, job_id, att = running_on(backend)
    pool.pause(None)
    assert att.finish("crashed", 255, reason=REASON_RESTART_LOST_EXIT) == "queued"
    assert pool.get(job_id).affinity == ""
    pool2 = backend.pool(pool="other", max_concurrent_jobs=1)
    job = enqueue(pool2)
    att2 = claim(pool2, job.id)  # claimed with no daemon identity (nothing recorded)
    pool2.pause(None)
    assert att2.finish("interrupted", EXIT_TEMPFAIL) == "queued"
    assert pool2.get(job.id).affinity == ""


def test_a_terminal_state_drops_the_affinity(backend: Backend) -> None:
    pool, job_id, att = running_on(backend)
    assert att.finish("interrupted", EXIT_TEMPFAIL) == "queued"  # promoted again at once (slot free)
    assert "affinity" in row(pool, job_id)
    att2 = claim(pool, job_id, "boot-b")
    assert att2.finish("exit", 0) == "succeeded"
    assert "affinity" not in row(pool, job_id)
    assert pool.get(job_id).affinity == ""


def test_resume_anywhere_releases_a_paused_jobs_affinity_and_resumes_it(backend: Backend) -> None:
    pool, job_id, att = running_on(backend, "daemon-1")
    pool.pause(job_id)
    att.finish("interrupted", EXIT_TEMPFAIL)
    job = pool.resume(job_id, anywhere=True)
    assert job is not None and job.affinity == "" and job.state.value == "running"
    reasons = [(e["from"], e["to"], e["reason"], e["evidence"]) for e in events_of(pool, job_id)]
    assert ("paused", "paused", "affinity_released", "daemon=daemon-1") in reasons
    assert reasons.index(("paused", "paused", "affinity_released", "daemon=daemon-1")) < \
        [r[2] for r in reasons].index("resume")


def test_resume_anywhere_releases_a_queued_jobs_affinity(backend: Backend) -> None:
    pool, job_id, att = running_on(backend, "daemon-1")
    pool.pause(None)
    att.finish("interrupted", EXIT_TEMPFAIL)
    job = pool.resume(job_id, anywhere=True)
    assert job is not None and (job.state.value, job.affinity) == ("queued", "")
    assert events_of(pool, job_id)[-1]["reason"] == "affinity_released"


def test_a_plain_resume_keeps_the_affinity(backend: Backend) -> None:
    pool, job_id, att = running_on(backend, "daemon-1")
    pool.pause(job_id)
    att.finish("interrupted", EXIT_TEMPFAIL)
    pool.pause(None)
    job = pool.resume(job_id)
    assert job is not None and (job.state.value, job.affinity) == ("queued", "daemon-1")


def test_resume_anywhere_without_an_affinity_on_a_queued_job_is_invalid_state_and_writes_nothing(
        backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    pool.pause(None)
    job = enqueue(pool)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidState):
        pool.resume(job.id, anywhere=True)
    assert backend.keyspace() == before
    assert state_of(pool, job.id) == "queued"


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_resume_anywhere_refuses_a_non_bool_or_no_job_and_writes_nothing(backend: Backend,
                                                                       bad: object) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument):
        pool.resume(job.id, anywhere=bad)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidArgument):
        pool.resume(None, anywhere=True)
    assert backend.keyspace() == before


def test_a_row_without_the_field_reads_as_no_affinity() -> None:
    base = {"id": "j", "state": "queued", "spec": '{"image": "busybox", "command": ["true"]}', "seq": "1",
            "created_at": "1"}
    assert Job.from_row(base).affinity == ""
    assert Job.from_row({**base, "affinity": "d"}).affinity == "d"


# ---- promotion routes an affinity to its daemon's queue ----------------------------------------------------


def handed_back(backend: Backend, daemon: str = "daemon-1") -> tuple[Pool, str]:
    """A job handed back by `daemon`, queued with promotion paused (so nothing is promoted yet)."""
    pool, job_id, att = running_on(backend, daemon)
    pool.pause(None)
    assert att.finish("interrupted", EXIT_TEMPFAIL) == "queued"
    return pool, job_id


def test_promotion_pushes_a_job_with_an_affinity_on_its_daemons_queue(backend: Backend) -> None:
    pool, job_id = handed_back(backend, "daemon-1")
    dq = pool.keys.daemon_queue("daemon-1")
    assert row(pool, job_id)["affinity_queue"] == dq
    pool.resume(None)
    assert state_of(pool, job_id) == "running" and pool.get(job_id).attempt == 2
    assert backend.client.lrange(dq, 0, -1) == [job_id]
    assert job_id not in rq_list(pool), "not on the pool's queue: a worker on another daemon must not take it"
    assert rq_hash(backend, pool, job_id)[b"origin"] == pool.keys.daemon_queue_name("daemon-1").encode()
    assert backend.client.sismember("rq:queues", dq)
    assert pool.get(job_id).affinity == "daemon-1", "kept while it runs: a second handback names it again"


def test_a_job_released_anywhere_is_pushed_on_the_pools_queue_again(backend: Backend) -> None:
    pool, job_id = handed_back(backend, "daemon-1")
    pool.resume(job_id, anywhere=True)
    assert "affinity_queue" not in row(pool, job_id)
    pool.resume(None)
    assert rq_list(pool) == [job_id]
    assert backend.client.llen(pool.keys.daemon_queue("daemon-1")) == 0
    assert rq_hash(backend, pool, job_id)[b"origin"] == pool.keys.rq_queue_name.encode()


@pytest.mark.parametrize("affinity", [True, False])
def test_a_candidate_naming_another_list_than_its_rows_is_stale_and_writes_nothing(backend: Backend,
                                                                                  affinity: bool) -> None:
    pool, job_id = handed_back(backend, "daemon-1")
    if not affinity:
        pool.resume(job_id, anywhere=True)
    backend.client.delete(pool.keys.paused)  # unpause without promoting
    wrong = pool.keys.rq_queue if affinity else pool.keys.daemon_queue("daemon-1")
    before = backend.keyspace()
    keys = [pool.keys.job(job_id), pool.keys.rq_job(job_id), wrong]
    assert pool.store.run("promote", keys, ["t"]) == [0, "", 0, "stale"]
    assert backend.keyspace() == before
    # read again: routed right
    assert pool.store.run("promote", pool.store.candidates(4), ["t"]) == [0, "", 1, "empty"]


def test_set_container_records_only_a_daemon_queue_of_this_pool(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    att = claim(pool, job.id)
    pool.store.run("set_container", [pool.keys.job(att.job_id), pool.keys.lease(att.job_id)],
                   [att.boot_id, att.attempt, "c-1", "daemon-1", "", 60_000, "rq:queue:somewhere-else"])
    assert row(pool, job.id)["daemon_queue"] == ""
    pool.pause(None)
    assert att.finish("interrupted", EXIT_TEMPFAIL) == "queued"
    assert "affinity" not in row(pool, job.id), "no queue to route to: no affinity"


def test_a_second_handback_on_another_daemon_moves_the_affinity(backend: Backend) -> None:
    pool, job_id = handed_back(backend, "daemon-1")
    pool.resume(job_id, anywhere=True)
    pool.resume(None)
    att = claim(pool, job_id, "boot-b")
    att.set_container("c-2", "daemon-2")
    pool.pause(None)
    assert att.finish("interrupted", EXIT_TEMPFAIL) == "queued"
    r = row(pool, job_id)
    assert (r["affinity"], r["affinity_queue"]) == ("daemon-2", pool.keys.daemon_queue("daemon-2"))


# ---- the supervisor: reconcile_apply.lua ---------------------------------------------------------------


def waiting_on_daemon(backend: Backend, daemon: str = "daemon-1") -> tuple[Pool, str]:
    """A job with an affinity, promoted onto its daemon's queue and not claimed."""
    pool, job_id = handed_back(backend, daemon)
    pool.resume(None)
    assert state_of(pool, job_id) == "running" and pool.get(job_id).owner_boot == ""
    return pool, job_id


def test_a_lost_dispatch_is_redispatched_on_the_list_its_row_routes_to(backend: Backend) -> None:
    pool, job_id = waiting_on_daemon(backend)
    dq = pool.keys.daemon_queue("daemon-1")
    backend.client.delete(dq)  # lost (a Redis rollback, a worker that died before its claim)
    assert reconcile(pool, job_id, "redispatch") == [0, "running", 0, "none"]
    assert backend.client.lrange(dq, 0, -1) == [job_id] and rq_list(pool) == []
    assert pool.get(job_id).attempt == 3
    assert rq_hash(backend, pool, job_id)[b"origin"] == pool.keys.daemon_queue_name("daemon-1").encode()


def test_a_redispatch_naming_another_list_is_refused_and_writes_nothing(backend: Backend) -> None:
    pool, job_id = waiting_on_daemon(backend)
    before = backend.keyspace()
    with pytest.raises(errors.Conflict):
        reconcile(pool, job_id, "redispatch", route=pool.keys.rq_queue)
    assert backend.keyspace() == before


def test_released_while_waiting_on_its_daemon_it_is_redispatched_on_the_pools_queue(backend: Backend) -> None:
    pool, job_id = waiting_on_daemon(backend)
    job = pool.resume(job_id, anywhere=True)
    assert job is not None and (job.state.value, job.affinity) == ("running", "")
    assert reconcile(pool, job_id, "redispatch") == [0, "running", 0, "none"]
    assert rq_list(pool) == [job_id]
    assert rq_hash(backend, pool, job_id)[b"origin"] == pool.keys.rq_queue_name.encode()


def test_an_exit_75_the_supervisor_hands_back_names_the_daemon(backend: Backend) -> None:
    pool, job_id, _att = running_on(backend, "daemon-1")
    backend.client.delete(pool.keys.lease(job_id))  # its worker died
    pool.pause(None)
    assert reconcile(pool, job_id, "exited", code=str(EXIT_TEMPFAIL))[1] == "queued"
    assert pool.get(job_id).affinity == "daemon-1"


def test_a_sweep_releases_an_affinity_to_a_daemon_declared_gone_and_dispatches_it_anywhere(
        backend: Backend) -> None:
    """A job waiting on the queue of a daemon an operator declared gone would hold its slot for ever: the
    sweep releases its affinity (compare-and-set on it) and, past the claim grace, dispatches it again on the
    pool's queue."""
    from jobpool import forget_daemon
    from jobpool.fleet.inventory import FORGET_MS
    from jobpool.supervisor import ContainerProber, Supervisor

    gone = "jpd1:" + "c" * 32 + "@boot-1"
    pool, job_id = waiting_on_daemon(backend, gone)
    k = pool.keys
    pool.store.run("inventory_lead", [k.inventory_lead(gone)], [gone, "pub", 300_000])
    pool.store.run("publish_inventory", [k.inventory(gone), k.inventory_lead(gone), k.inventories,
                                         k.gone_daemons, k.returned_daemons],
                   [gone, "pub", "boot-1", 300_000, 600_000, "1", "[]", FORGET_MS, pool.now_ms() - 120_000])
    backend.client.delete(k.inventory_lead(gone))
    sup = Supervisor(pool.store, ContainerProber("unix:///nonexistent/jobpool.sock", timeout=1))
    try:
        sup.sweep(job_ids=[job_id])
        assert pool.get(job_id).affinity == gone, "not declared gone: kept"
        forget_daemon(pool, gone)
        with pytest.raises(errors.Conflict):  # the compare-and-set on the affinity
            pool.store.run("resume_job", [k.job(job_id)],
                           [job_id, "supervisor", "1", "jpd1:" + "d" * 32 + "@b"])
        sup.sweep(job_ids=[job_id])
        job = pool.get(job_id)
        assert (job.state.value, job.affinity, job.attempt) == ("running", "", 2), "released, nothing else"
        released = [e for e in events_of(pool, job_id) if e["reason"] == "affinity_released"]
        assert released and gone in released[0]["evidence"] and released[0]["actor"].startswith("supervisor")
        backend.client.hset(k.job(job_id), "promoted_at", pool.now_ms() - 600_000)  # past the claim grace
        sup.sweep(job_ids=[job_id])
        assert rq_list(pool) == [job_id] and pool.get(job_id).attempt == 3
    finally:
        sup.close()
