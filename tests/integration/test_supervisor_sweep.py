"""The supervisor's sweep against a real redis-server and a real dockerd (docs/architecture.md, "Evidence
and verdicts").

Rows are driven without real workers: a job is enqueued, claimed by a boot that then "dies" (a short lease
that is never renewed), and given a real labelled busybox container, or none. The sweep must then reach
the verdict the design table gives, from ground truth only.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import docker
import pytest
import redis
from rq import Queue
from rq.job import Job as RQJob
from rq.job import JobStatus
from rq.serializers import JSONSerializer

from jobpool import Pool
from jobpool.contract import RQ_QUEUE_PREFIX
from jobpool.exporter import PoolCollector
from jobpool.metrics import read_counters
from jobpool.status import read_status
from jobpool.store.keys import worker_name
from jobpool.supervisor import ContainerProber, Kind, Supervisor, reconcile, run_supervisor, stop_orphan
from jobpool.workers.attempt import Attempt
from tests.support.attempts import claim
from tests.support.constants import FAST_SETTINGS, IMAGE
from tests.support.polling import eventually
from tests.support.proxies import DockerLaunchHold
from tests.support.servers import DockerDaemon

DEAD = "dead-boot"
ROOT = Path(__file__).resolve().parents[2]

@pytest.fixture
def make_pool(redis_url: str) -> Iterator[Callable[..., Pool]]:
    made: list[Pool] = []

    def make(name: str = "sv", **settings: Any) -> Pool:
        made.append(Pool.from_url(redis_url, name, **{**FAST_SETTINGS, **settings}))
        return made[-1]

    yield make
    for p in made:
        p.store.client.close()


@pytest.fixture
def supervisors() -> Iterator[Callable[[Pool], Supervisor]]:
    made: list[Supervisor] = []

    def make(pool: Pool) -> Supervisor:
        made.append(Supervisor(pool.store))
        return made[-1]

    yield make
    for s in made:
        s.close()


def lease_gone(pool: Pool, job_id: str) -> None:
    eventually(lambda: not pool.store.client.exists(pool.keys.lease(job_id)), timeout=10,
               message=f"lease of {job_id} expiring")


def run_container(dclient: docker.DockerClient, pool: Pool, job_id: str, attempt: int,
                  command: list[str], boot: str = DEAD, start: bool = True) -> Any:
    labels = {"jobpool.pool": pool.keys.pool, "jobpool.job_id": job_id, "jobpool.attempt": str(attempt),
              "jobpool.boot_id": boot}
    if start:
        return dclient.containers.run(IMAGE, command, detach=True, network_mode="none", labels=labels)
    return dclient.containers.create(IMAGE, command, network_mode="none", labels=labels)


def orphan(pool: Pool, dclient: docker.DockerClient | None, command: list[str] | None = None,
           record: bool = True, start: bool = True, wait_lease: bool = True) -> tuple[str, int, Any]:
    """A running row claimed by a boot that died: its lease expires; optionally with a container."""
    job = pool.enqueue(image=IMAGE, command=["sleep", "300"])
    job = pool.get(job.id)
    assert job.state.value == "running", job
    att = claim(pool, job.id, DEAD, os.environ["DOCKER_HOST"])  # records this daemon's identity
    identity = pool.get(job.id).daemon_id
    container = None
    if command is not None:
        assert dclient is not None
        container = run_container(dclient, pool, job.id, job.attempt, command, start=start)
        if record:
            att.set_container(container.id, identity)
    if wait_lease:
        lease_gone(pool, job.id)
    return job.id, job.attempt, container


def transitions(pool: Pool, job_id: str) -> list[tuple[str, str, str]]:
    return [(e["from"], e["to"], e["reason"]) for e in pool.events(job_id)]


def container_exists(dclient: docker.DockerClient, cid: str) -> bool:
    try:
        dclient.containers.get(cid)
        return True
    except docker.errors.NotFound:
        return False


# ---- the recorded wedge ------------------------------------------------------------------------------


def test_wedge_dead_owner_no_container_fails_and_next_job_runs(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient,
        supervisors: Callable[[Pool], Supervisor]) -> None:
    """slots=1: A's owner died and its container is gone; B waits. One sweep fails A and runs B."""
    pool = make_pool(recovery_budget=0)
    a, _, _ = orphan(pool, dclient, command=None)
    b = pool.enqueue(image=IMAGE, command=["true"])
    assert pool.get(b.id).state.value == "queued"

    report = supervisors(pool).sweep()

    job_a = pool.get(a)
    assert (job_a.state.value, job_a.error_reason) == ("failed", "orphan_reconciled_no_container")
    assert pool.get(b.id).state.value == "running"
    assert report.verdicts == {"absent": 1}
    ev = [e for e in pool.events(a) if e["to"] == "failed"]
    assert len(ev) == 1 and "lease of owner dead-boot attempt 1 gone" in ev[0]["evidence"]


def test_wedge_with_recovery_budget_requeues_in_place(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient,
        supervisors: Callable[[Pool], Supervisor]) -> None:
    pool = make_pool(recovery_budget=1)
    a, _, _ = orphan(pool, dclient, command=None)
    b = pool.enqueue(image=IMAGE, command=["true"])

    supervisors(pool).sweep()

    job_a = pool.get(a)
    # Handed back with its original place: it is the head again, so it is the one promoted.
    assert (job_a.state.value, job_a.recovery_attempts, job_a.attempt) == ("running", 1, 2)
    assert ("running", "queued", "orphan_reconciled_no_container") in transitions(pool, a)
    assert pool.get(b.id).state.value == "queued"


def test_rows_left_by_a_previous_run_are_judged_by_the_first_sweep(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient, redis_url: str) -> None:
    """run_supervisor sweeps at start-up: a stale row from before the restart is decided at once."""
    pool = make_pool()
    a, _, _ = orphan(pool, dclient, command=None)
    b = pool.enqueue(image=IMAGE, command=["true"])
    report = run_supervisor(pool.settings, once=True)
    assert report is not None and report.verdicts == {"absent": 1}
    assert pool.get(a).state.value == "failed" and pool.get(b.id).state.value == "running"
    assert json.loads(cast(str, pool.store.client.get(pool.keys.last_sweep)))["verdicts"] == {"absent": 1}


# ---- ground truth: the labelled container --------------------------------------------------------------


@pytest.mark.parametrize(("code", "state", "reason"), [(0, "succeeded", ""), (3, "failed", "exit_code_3")])
def test_exited_container_finishes_from_its_exit_code(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient,
        supervisors: Callable[[Pool], Supervisor], code: int, state: str, reason: str) -> None:
    pool = make_pool()
    job_id, _, container = orphan(pool, dclient, command=["sh", "-c", f"exit {code}"])
    assert container.wait(timeout=30)["StatusCode"] == code

    supervisors(pool).sweep()

    job = pool.get(job_id)
    assert (job.state.value, job.exit_code, job.error_reason) == (state, code, reason)
    assert not container_exists(dclient, container.id), "an ended container is removed once its code is kept"


def test_container_recorded_nowhere_is_still_found_by_label(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient,
        supervisors: Callable[[Pool], Supervisor]) -> None:
    """The worker died between launching and recording: the label is enough."""
    pool = make_pool()
    job_id, _, container = orphan(pool, dclient, command=["sh", "-c", "exit 4"], record=False)
    container.wait(timeout=30)
    supervisors(pool).sweep()
    assert pool.get(job_id).exit_code == 4


def test_container_of_an_older_attempt_is_not_evidence(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient,
        supervisors: Callable[[Pool], Supervisor]) -> None:
    pool = make_pool()
    job_id, attempt, _ = orphan(pool, dclient, command=None)
    older = run_container(dclient, pool, job_id, attempt + 7, ["sleep", "300"])
    report = supervisors(pool).sweep()
    assert report.verdicts == {"absent": 1}
    assert pool.get(job_id).error_reason == "orphan_reconciled_no_container"
    older.remove(force=True)


def test_created_but_never_started_container_is_no_work(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient,
        supervisors: Callable[[Pool], Supervisor]) -> None:
    """A created container's inspect says ExitCode 0; it must not be read as success."""
    pool = make_pool()
    job_id, _, container = orphan(pool, dclient, command=["sleep", "300"], start=False)
    supervisors(pool).sweep()
    job = pool.get(job_id)
    assert (job.state.value, job.error_reason) == ("failed", "orphan_reconciled_never_started")
    assert not container_exists(dclient, container.id)


def adoption_queue(pool: Pool, job_id: str) -> str:
    """The queue only the workers on the job's daemon listen on: where its adoption requests go."""
    return pool.keys.daemon_queue_name(pool.get(job_id).daemon_id)


def adoption_requests(raw: Any, pool: Pool, job_id: str) -> list[str]:
    assert not [x for x in raw.lrange(pool.keys.rq_queue, 0, -1) if x.startswith(b"jobpool-adopt-")], \
        "an adoption request on the pool's queue, where a worker on any daemon may take it"
    return [x.decode() for x in raw.lrange(RQ_QUEUE_PREFIX + adoption_queue(pool, job_id), 0, -1)
            if x.startswith(b"jobpool-adopt-")]


def test_live_orphan_keeps_its_slot_and_adoption_is_requested_once(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient,
        supervisors: Callable[[Pool], Supervisor]) -> None:
    pool = make_pool()
    job_id, attempt, container = orphan(pool, dclient, command=["sleep", "300"])
    b = pool.enqueue(image=IMAGE, command=["true"])
    sup = supervisors(pool)
    for _ in range(3):
        report = sup.sweep()
        assert report.verdicts == {"adopt": 1}
    assert pool.get(job_id).state.value == "running" and pool.get(b.id).state.value == "queued"
    raw = sup.adoptions.rq_client()
    rq_id = cast(bytes, raw.get(pool.keys.adoption(job_id))).decode()
    assert adoption_requests(raw, pool, job_id) == [rq_id]
    rq_job = RQJob.fetch(rq_id, connection=raw, serializer=JSONSerializer)
    assert (rq_job.func_name, rq_job.args, rq_job.get_status()) == (
        "jobpool.workers.entry.adopt_job", [job_id, DEAD, attempt], "queued")
    assert report.decisions[0].outcome == "adoption pending"

    # The request ran and failed (say no worker could attach): the next sweep asks again, with a new id.
    raw.lrem(RQ_QUEUE_PREFIX + adoption_queue(pool, job_id), 0, rq_id)
    rq_job.set_status(JobStatus.FAILED)
    assert sup.sweep().decisions[0].outcome == "adoption requested"
    again = cast(bytes, raw.get(pool.keys.adoption(job_id))).decode()
    assert again != rq_id and adoption_requests(raw, pool, job_id) == [again]
    request = cast(RQJob, Queue(adoption_queue(pool, job_id), connection=raw).fetch_job(again))
    assert request.get_status() == "queued"
    assert not raw.exists(RQJob.key_for(rq_id)), "the ended request could still be run late"
    container.remove(force=True)


def test_a_killed_adopter_is_replaced_at_the_next_sweep(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient,
        supervisors: Callable[[Pool], Supervisor]) -> None:
    """A worker that took the adoption request and died before re-attaching leaves it "started" for good
    (RQ's own worker key outlives it by minutes): pending only while that worker's boot record lives."""
    pool = make_pool()
    job_id, _, container = orphan(pool, dclient, command=["sleep", "300"])
    sup = supervisors(pool)
    assert sup.sweep().decisions[0].outcome == "adoption requested"
    raw = sup.adoptions.rq_client()
    first = cast(bytes, raw.get(pool.keys.adoption(job_id))).decode()
    # What RQ leaves when a worker takes the request: status "started", the worker's name on the job.
    boot = "b" * 32
    raw.lrem(RQ_QUEUE_PREFIX + adoption_queue(pool, job_id), 0, first)
    raw.hset(RQJob.key_for(first), mapping={"status": "started", "worker_name": worker_name("sv", boot)})
    pool.store.client.zadd(pool.keys.boots, {boot: 1})
    pool.store.client.hset(pool.keys.boot(boot), "pid", 1)
    assert sup.sweep().decisions[0].outcome == "adoption pending", "its worker lives: it is at it"
    pool.store.client.delete(pool.keys.boot(boot))  # the worker was SIGKILLed: its record expired
    assert sup.sweep().decisions[0].outcome == "adoption requested"
    again = cast(bytes, raw.get(pool.keys.adoption(job_id))).decode()
    assert again != first and adoption_requests(raw, pool, job_id) == [again]
    container.remove(force=True)


# ---- unknown keeps the slot ------------------------------------------------------------------------------


def test_daemon_unreachable_keeps_slots_and_warns_then_decides(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient,
        supervisors: Callable[[Pool], Supervisor], docker_daemon: DockerDaemon,
        caplog: pytest.LogCaptureFixture) -> None:
    pool = make_pool()
    job_id, _, container = orphan(pool, dclient, command=["sleep", "300"])
    b = pool.enqueue(image=IMAGE, command=["true"])
    container.remove(force=True)  # gone; but while the daemon is away nobody can know that
    sup = supervisors(pool)
    caplog.set_level(logging.WARNING, logger="jobpool.supervisor")
    try:
        docker_daemon.stop()
        for _ in range(3):
            report = sup.sweep()
            assert (report.verdicts, report.unknown) == ({"warn": 1}, 1)
        assert pool.get(job_id).state.value == "running" and pool.get(b.id).state.value == "queued"
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 3
        assert all(job_id in w and "probe unknown" in w and "could not be asked" in w for w in warnings)
        # The last sweep's record names the job, why, and on what evidence (the status report, the dashboard).
        last_sweep = pool.status().last_sweep
        assert last_sweep is not None
        (held,) = last_sweep.unknown_jobs
        assert (held.job, held.reason) == (job_id, "probe_unknown") and "could not be asked" in held.evidence
    finally:
        docker_daemon.start()
    sup.sweep()
    assert pool.get(job_id).error_reason == "orphan_reconciled_no_container"
    assert pool.get(b.id).state.value == "running"


@pytest.mark.parametrize("recorded", ["jpd1:another-daemon@another-boot", "LVIU:3F7J:DOCKER:ID", ""])
def test_recorded_on_another_daemon_or_before_identities_is_unknown(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient,
        supervisors: Callable[[Pool], Supervisor], recorded: str) -> None:
    """Another daemon's identity, a bare Docker ID (rows recorded before identities; two daemons can share
    one), or nothing: "no container here" proves nothing, and neither does an exited one found here."""
    pool = make_pool()
    job_id, attempt, container = orphan(pool, dclient, command=["true"], wait_lease=False)
    Attempt(pool.store, job_id, DEAD, attempt).set_container(container.id, recorded)
    eventually(lambda: (container.reload(), container.status == "exited")[1], timeout=10,
               message="the container exiting")
    lease_gone(pool, job_id)
    report = supervisors(pool).sweep()
    assert report.verdicts == {"warn": 1} and report.unknown == 1
    evidence = report.decisions[0].verdict.evidence
    assert (recorded or "no daemon identity recorded") in evidence and "jpd1:" in evidence
    assert pool.get(job_id).state.value == "running"


# ---- stale: only a human evicts ---------------------------------------------------------------------------


def test_stale_live_job_only_warns_until_the_operator_evicts(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient,
        supervisors: Callable[[Pool], Supervisor], caplog: pytest.LogCaptureFixture) -> None:
    pool = make_pool(lease_secs=300, job_stale_seconds=1)
    job_id, attempt, container = orphan(pool, dclient, command=["sleep", "300"], wait_lease=False)
    b = pool.enqueue(image=IMAGE, command=["true"])
    sup = supervisors(pool)
    caplog.set_level(logging.WARNING, logger="jobpool.supervisor")
    report = eventually(lambda: (r := sup.sweep()).verdicts.get("warn") and r, timeout=10,
                        message="the live job turning stale")
    assert report.decisions[0].verdict.reason == "stale"
    sup.sweep()
    assert sum("stale" in r.getMessage() and job_id in r.getMessage() for r in caplog.records) >= 2
    container.reload()
    assert pool.get(job_id).state.value == "running" and container.status == "running"

    preview = reconcile(pool.store, evict_stale=True, dry_run=True)
    assert preview.decisions[0].verdict.kind is Kind.EVICT and pool.get(job_id).state.value == "running"

    done = reconcile(pool.store, evict_stale=True)
    job = pool.get(job_id)
    assert (job.state.value, job.error_reason) == ("failed", "stale_evicted")
    assert done.decisions[0].outcome == "failed"
    try:
        container.reload()
        assert container.status == "exited"
    except docker.errors.NotFound:
        pass  # stopped, then removed as the leftover of an ended attempt (supervisor/volumes.py)
    assert pool.get(b.id).state.value == "running"
    assert not pool.store.client.exists(pool.keys.lease(job_id)) and attempt == job.attempt


# ---- two supervisors --------------------------------------------------------------------------------------


def test_two_supervisors_sweeping_at_once_never_double_apply(make_pool: Callable[..., Pool],
                                                             dclient: docker.DockerClient) -> None:
    n = 12
    pool = make_pool(max_concurrent_jobs=n)
    orphans = [orphan(pool, dclient, command=None, wait_lease=False)[0] for _ in range(n // 2)]
    exited = [orphan(pool, dclient, command=["sh", "-c", "exit 5"], wait_lease=False) for _ in range(n // 2)]
    waiting = [pool.enqueue(image=IMAGE, command=["true"]).id for _ in range(n)]
    for job_id in orphans + [e[0] for e in exited]:
        lease_gone(pool, job_id)
    for _, _, c in exited:
        c.wait(timeout=30)

    barrier = threading.Barrier(2)
    failures: list[BaseException] = []

    def run(name: str) -> None:
        p = make_pool(max_concurrent_jobs=n)
        sup = Supervisor(p.store, actor=name)
        try:
            barrier.wait(10)
            for _ in range(5):
                sup.sweep()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)
        finally:
            sup.close()

    threads = [threading.Thread(target=run, args=(f"sup-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures
    for job_id in orphans + [e[0] for e in exited]:
        ends = [t for t in transitions(pool, job_id) if t[0] == "running" and t[1] != "running"]
        assert len(ends) == 1, (job_id, ends)
    for job_id in waiting:
        promotions = [t for t in transitions(pool, job_id) if t[:2] == ("queued", "running")]
        assert len(promotions) == 1, (job_id, promotions)
    assert pool.slots() == (n, n)


# ---- persisted intent -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ask", "state", "reason"), [("cancel", "cancelled", "cancel_requested"),
                                                      ("pause", "paused", "pause_requested")])
def test_persisted_request_is_honoured_when_the_owner_died(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient,
        supervisors: Callable[[Pool], Supervisor], ask: str, state: str, reason: str) -> None:
    pool = make_pool(recovery_budget=3)
    job_id, _, _ = orphan(pool, dclient, command=None, wait_lease=False)
    getattr(pool, ask)(job_id)  # the owner is still the dead boot: only a request is persisted
    assert pool.get(job_id).state.value == "running"
    lease_gone(pool, job_id)
    supervisors(pool).sweep()
    job = pool.get(job_id)
    assert (job.state.value, job.error_reason) == (state, reason)


def test_cancel_of_an_orphan_stops_its_container_by_label(make_pool: Callable[..., Pool],
                                                          dclient: docker.DockerClient) -> None:
    pool = make_pool()
    job_id, _, container = orphan(pool, dclient, command=["sleep", "300"], record=False)
    pool.cancel(job_id)
    assert pool.get(job_id).cancel_requested
    result = stop_orphan(pool.store, job_id)
    assert (result.action, result.containers, result.state) == ("stopped", (container.id,), "cancelled")
    assert pool.get(job_id).state.value == "cancelled"
    assert not container_exists(dclient, container.id)


def test_cancel_leaves_a_live_owner_to_honour_it(make_pool: Callable[..., Pool],
                                                 dclient: docker.DockerClient) -> None:
    pool = make_pool(lease_secs=300)
    job_id, _, container = orphan(pool, dclient, command=["sleep", "300"], wait_lease=False)
    pool.cancel(job_id)
    assert stop_orphan(pool.store, job_id).action == "owner_alive"
    container.reload()
    assert container.status == "running"
    container.remove(force=True)


# ---- promoted, never claimed ------------------------------------------------------------------------------


def test_unclaimed_rows_are_left_while_dispatched_and_redispatched_when_lost(
        make_pool: Callable[..., Pool], supervisors: Callable[[Pool], Supervisor]) -> None:
    pool = make_pool(claim_grace_secs=0.5)
    job = pool.enqueue(image=IMAGE, command=["true"])
    sup = supervisors(pool)
    c, k = pool.store.client, pool.keys
    assert c.lrange(k.rq_queue, 0, -1) == [job.id]
    # Still in RQ's queue (all workers busy): left however long it waits.
    eventually(lambda: c.time()[0] * 1000 - cast(int, pool.get(job.id).promoted_at) > 700,
               message="grace passing")
    assert sup.sweep().verdicts == {"keep": 1}
    # Taken by a worker into the intermediate list, or its started registry: left.
    c.lmove(k.rq_queue, k.rq_intermediate)
    assert sup.sweep().verdicts == {"keep": 1}
    c.lrem(k.rq_intermediate, 0, job.id)
    c.zadd(f"rq:wip:{k.rq_queue_name}", {f"{job.id}:exec1": c.time()[0] + 60})
    assert sup.sweep().verdicts == {"keep": 1}
    # The worker died before claiming; its started-registry entry expired: lost.
    c.zadd(f"rq:wip:{k.rq_queue_name}", {f"{job.id}:exec1": c.time()[0] - 1})
    report = sup.sweep()
    assert report.verdicts == {"redispatch": 1}
    after = pool.get(job.id)
    assert (after.state.value, after.attempt) == ("running", 2)
    assert c.lrange(k.rq_queue, 0, -1) == [job.id]
    assert ("running", "running", "redispatched") in transitions(pool, job.id)
    # Just re-dispatched: within grace again.
    assert sup.sweep().verdicts == {"keep": 1}


def test_a_job_waiting_on_its_affinitys_daemon_is_kept_until_released_then_redispatched(
        make_pool: Callable[..., Pool], supervisors: Callable[[Pool], Supervisor]) -> None:
    """A job with a checkpoint affinity waits, promoted, on its daemon's own queue: found there, it keeps its
    slot however long no worker of that daemon takes it; released (`resume --anywhere`), it is no longer
    where its row says, so past the claim grace it is dispatched again on the pool's queue."""
    pool = make_pool(claim_grace_secs=0.5)
    job = pool.enqueue(image=IMAGE, command=["true"])
    att = claim(pool, job.id)
    att.set_container("c-1", "daemon-gone")
    pool.pause(None)
    assert att.finish("interrupted", 75) == "queued"
    pool.resume(None)
    sup = supervisors(pool)
    c, k = pool.store.client, pool.keys
    dq = k.daemon_queue("daemon-gone")
    assert c.lrange(dq, 0, -1) == [job.id] and c.lrange(k.rq_queue, 0, -1) == []
    eventually(lambda: c.time()[0] * 1000 - cast(int, pool.get(job.id).promoted_at) > 700,
               message="grace passing")
    assert sup.sweep().verdicts == {"keep": 1}
    # Taken by a worker of that daemon (its started registry): kept too.
    c.lrem(dq, 0, job.id)
    c.zadd(f"rq:wip:{dq[len(RQ_QUEUE_PREFIX):]}", {f"{job.id}:exec1": c.time()[0] + 60})
    assert sup.sweep().verdicts == {"keep": 1}
    c.rpush(dq, job.id)
    c.delete(f"rq:wip:{dq[len(RQ_QUEUE_PREFIX):]}")
    pool.resume(job.id, anywhere=True)
    report = sup.sweep()
    assert report.verdicts == {"redispatch": 1}
    after = pool.get(job.id)
    assert (after.state.value, after.attempt, after.affinity) == ("running", 3, "")
    assert c.lrange(k.rq_queue, 0, -1) == [job.id]
    assert sup.sweep().verdicts == {"keep": 1}


def test_a_delivery_stuck_in_rqs_intermediate_list_is_dispatched_again(
        make_pool: Callable[..., Pool], supervisors: Callable[[Pool], Supervisor]) -> None:
    """What a Redis rollback (or a worker dying between BLMOVE and its horse) leaves: the delivery in RQ's
    intermediate list, no claim. RQ's maintenance frees it only minutes later; the sweep does not wait."""
    pool = make_pool(claim_grace_secs=0.5)
    job = pool.enqueue(image=IMAGE, command=["true"])
    sup = supervisors(pool)
    c, k = pool.store.client, pool.keys
    c.lmove(k.rq_queue, k.rq_intermediate)
    assert sup.sweep().verdicts == {"keep": 1}, "just taken: a worker claims within moments"
    report = eventually(lambda: (r := sup.sweep()).verdicts.get("redispatch") and r, timeout=10,
                        message="the stuck delivery dispatched again")
    assert "intermediate list" in report.decisions[0].verdict.evidence
    after = pool.get(job.id)
    assert (after.state.value, after.attempt, after.owner_boot) == ("running", 2, "")
    assert c.lrange(k.rq_queue, 0, -1) == [job.id]


def test_unclaimed_row_within_grace_is_left(make_pool: Callable[..., Pool],
                                            supervisors: Callable[[Pool], Supervisor]) -> None:
    pool = make_pool(claim_grace_secs=60)
    job = pool.enqueue(image=IMAGE, command=["true"])
    pool.store.client.delete(pool.keys.rq_queue)  # lost at once, but a worker may be claiming it right now
    assert supervisors(pool).sweep().verdicts == {"keep": 1}
    assert pool.get(job.id).attempt == 1


# ---- reporting, dry run, the loop -------------------------------------------------------------------------


def test_dry_run_decides_but_changes_nothing(make_pool: Callable[..., Pool],
                                             dclient: docker.DockerClient) -> None:
    pool = make_pool()
    job_id, _, _ = orphan(pool, dclient, command=None)
    before = pool.events()
    report = reconcile(pool.store, dry_run=True)
    decided = [(d.job_id, d.verdict.kind, d.expected) for d in report.decisions]
    assert decided == [(job_id, Kind.ABSENT, "failed")]
    assert pool.get(job_id).state.value == "running" and pool.events() == before
    assert not pool.store.client.exists(pool.keys.last_sweep)


def test_summary_line_and_last_sweep(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient,
        supervisors: Callable[[Pool], Supervisor], caplog: pytest.LogCaptureFixture) -> None:
    pool = make_pool(max_concurrent_jobs=3, lease_secs=300)
    orphan(pool, dclient, command=None, wait_lease=False)  # alive (lease held)
    caplog.set_level(logging.INFO, logger="jobpool.supervisor")
    supervisors(pool).sweep()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sweep pool=sv")]
    assert len(lines) == 1 and "rows=1" in lines[0] and "keep=1" in lines[0] and "unknown=0" in lines[0]
    last = json.loads(cast(str, pool.store.client.get(pool.keys.last_sweep)))
    assert last["rows"] == 1 and last["verdicts"] == {"keep": 1} and last["unknown"] == 0
    assert last["at"] > 0 and last["duration_ms"] >= 0


def test_run_supervisor_loops_until_stopped(make_pool: Callable[..., Pool],
                                            dclient: docker.DockerClient) -> None:
    pool = make_pool(sweep_interval_secs=0.1)
    stop = threading.Event()
    t = threading.Thread(target=run_supervisor, args=(pool.settings,), kwargs={"stop_event": stop})
    t.start()
    try:
        job_id, _, _ = orphan(pool, dclient, command=None, wait_lease=False)
        pool.wait(job_id, timeout=10)
        assert pool.get(job_id).error_reason == "orphan_reconciled_no_container"
        first = json.loads(cast(str, pool.store.client.get(pool.keys.last_sweep)))["at"]
        eventually(lambda: json.loads(cast(str, pool.store.client.get(pool.keys.last_sweep)))["at"] > first,
                   message="another sweep")
    finally:
        stop.set()
        t.join(10)
    assert not t.is_alive()


def test_a_sweep_longer_than_the_interval_says_so(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient, proxy: DockerLaunchHold,
        caplog: pytest.LogCaptureFixture) -> None:
    """The daemon holds the sweep's one container list for longer than the sweep interval: the sweep says
    so in its WARNING line, its record (what `status` reads) and the `sweep_overruns` counter."""
    pool = make_pool(sweep_interval_secs=0.2)
    orphan(pool, dclient, command=["sleep", "300"])  # a live orphan: its container is listed every sweep
    sup = Supervisor(pool.store, ContainerProber(proxy.host, timeout=30))
    try:
        assert not sup.sweep().overran  # adoption asked; the client knows its daemon now
        proxy.hold("list")
        caplog.set_level(logging.INFO, logger="jobpool.supervisor")
        reports: list[Any] = []
        t = threading.Thread(target=lambda: reports.append(sup.sweep()))
        t.start()
        eventually(lambda: proxy.held.is_set() and time.monotonic() - cast(float, proxy.held_at) > 0.5,
                   message="the list held past the interval")
        proxy.release()
        t.join(30)
        report = reports[0]
        assert report.overran and report.interval_ms == 200 and report.duration_ms > 500
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("longer than the sweep interval of 0.2 s" in m for m in warned), warned
        last = json.loads(cast(str, pool.store.client.get(pool.keys.last_sweep)))
        assert (last["overran"], last["interval_ms"]) == (True, 200)
        assert read_counters(pool.store).sweep_overruns == 1
        served = {m.name: m for m in PoolCollector(pool.store).collect()}  # what /metrics serves
        assert [s.value for s in served["jobpool_sweep_overruns"].samples] == [1]
        status = read_status(pool.store)  # `jobpool status` warns of it, text and --json
        assert status.last_sweep is not None and status.last_sweep.overran
        assert status.to_dict()["last_sweep"]["overran"] is True
        assert any("longer than its interval of 0.2 s" in w for w in status.health.warnings), status.health
        assert not sup.sweep().overran and read_counters(pool.store).sweep_overruns == 1
        assert not any("longer than its interval" in w for w in read_status(pool.store).health.warnings)
    finally:
        sup.close()


def test_the_loop_runs_no_sweep_beside_an_overrun_nor_a_backlog_after_it(
        make_pool: Callable[..., Pool], dclient: docker.DockerClient, proxy: DockerLaunchHold) -> None:
    """The start-up sweep is held on its container list for several intervals: no other sweep starts while
    it runs, the next starts once it ended, and the ticks it missed are not run one after another after it
    (each sweep lists the pool's containers once, so those list requests are the sweeps; the leftover pass
    lists the ended ones, by status)."""
    interval = 0.3
    pool = make_pool(sweep_interval_secs=interval)
    orphan(pool, dclient, command=["sleep", "300"])
    proxy.hold("list")

    def probes() -> list[float]:
        return [at for at, target in proxy.lists if "status" not in target]

    stop = threading.Event()
    t = threading.Thread(target=run_supervisor, args=(pool.settings,),
                         kwargs={"stop_event": stop, "prober": ContainerProber(proxy.host, timeout=30)})
    t.start()
    try:
        eventually(lambda: proxy.held.is_set() and time.monotonic() - cast(float, proxy.held_at)
                   > 4 * interval, timeout=30, message="the start-up sweep held for four intervals")
        released = time.monotonic()
        proxy.release()
        eventually(lambda: len(probes()) >= 6, timeout=30, message="five sweeps after the held one")
    finally:
        stop.set()
        t.join(30)
    assert not t.is_alive()
    lists = probes()
    assert all(at > released for at in lists[1:]), "a sweep started beside the held one"
    gaps = [b - a for a, b in itertools.pairwise(lists[1:])]
    assert min(gaps) > interval / 2, f"sweeps run back to back after the overrun (gaps {gaps})"
    assert read_counters(pool.store).sweep_overruns >= 1


def test_probe_is_one_list_call_per_sweep(make_pool: Callable[..., Pool],
                                          dclient: docker.DockerClient) -> None:
    pool = make_pool(max_concurrent_jobs=4)
    for cmd in (["sleep", "300"], ["sh", "-c", "exit 2"], None, ["sleep", "300"]):
        orphan(pool, dclient, command=cmd, wait_lease=False)
    for job_id in cast(list[str], pool.store.client.zrange(pool.keys.running, 0, -1)):
        lease_gone(pool, job_id)
    eventually(lambda: len(dclient.containers.list(all=True, filters={"status": "exited"})) == 1)
    prober = ContainerProber(None, timeout=5)
    sup = Supervisor(pool.store, prober)
    try:
        sup.sweep(dry_run=True)  # warms the client: version + info, once per client
        calls = prober.api_calls, prober.list_calls
        report = sup.sweep(dry_run=True)
        assert (prober.api_calls - calls[0], prober.list_calls - calls[1]) == (1, 1)
        assert sorted(report.verdicts.items()) == [("absent", 1), ("adopt", 2), ("exited", 1)]
    finally:
        sup.close()


def test_sigterm_stops_the_supervisor_process_cleanly(make_pool: Callable[..., Pool], redis_url: str,
                                                      tmp_path: Path) -> None:
    pool = make_pool(sweep_interval_secs=30)
    script = ("import logging, sys; from jobpool import Settings; "
              "from jobpool.supervisor import run_supervisor; logging.basicConfig(level=logging.INFO); "
              "run_supervisor(Settings.from_env({}, redis_url=sys.argv[1], pool='sv', "
              "sweep_interval_secs=30))")
    log = tmp_path / "supervisor.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", script, redis_url], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        eventually(lambda: pool.store.client.get(pool.keys.last_sweep), timeout=20,
                   message="the start-up sweep")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "supervisor for pool sv stopped" in log.read_text()


def test_the_sweep_reads_under_a_memory_limit(make_pool: Callable[..., Pool], dclient: docker.DockerClient,
                                              supervisors: Callable[[Pool], Supervisor]) -> None:
    """At its memory limit (noeviction) Redis refuses every command that may write, SORT included: the
    sweep's read must still work there (SORT_RO), so an operator's dry run can see what is held and why."""
    pool = make_pool()
    if int(str(pool.store.client.info("server")["redis_version"]).split(".")[0]) < 7:
        pytest.skip("SORT_RO came with Redis 7; on 6.2 the sweep reads with SORT, refused at the limit")
    job_id, _, _ = orphan(pool, dclient, command=["sleep", "300"])
    config = cast(dict[str, str], pool.store.client.config_get("maxmemory*"))
    pool.store.client.config_set("maxmemory-policy", "noeviction")
    pool.store.client.config_set("maxmemory", 1)
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            pool.store.client.set("jobpool-test-probe", "x")
        report = supervisors(pool).sweep(dry_run=True)
        assert [(d.job_id, d.verdict.kind.value) for d in report.decisions] == [(job_id, "adopt")]
    finally:
        pool.store.client.config_set("maxmemory", config["maxmemory"])
        pool.store.client.config_set("maxmemory-policy", config["maxmemory-policy"])
