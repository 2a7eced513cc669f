"""Two real dockerd daemons that report the same Docker ID, as daemons reading one /etc/docker/key.json (or
VMs cloned from one image) do. Evidence from a daemon speaks for an attempt only when that daemon is the one
the attempt was recorded on (jobpool/fleet/daemonid.py): "not found on the daemon I asked" is otherwise
unknown.

Workers and the supervisor are real processes; both daemons are sampled throughout, and a job must never
have two live containers across them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import cast

import docker
import pytest
from rq import Queue
from rq.serializers import JSONSerializer

from jobpool import Job, JobState, Pool
from jobpool.fleet import daemonid
from jobpool.supervisor import ContainerProber, Supervisor, stop_orphan
from jobpool.supervisor.adoption import ADOPT_ENTRY_POINT
from tests.support.constants import IMAGE
from tests.support.job_containers import Sampler, live_on, start_on
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.servers import DockerDaemon, daemon_identity


@pytest.fixture
def pool_env(pool_env: dict[str, str]) -> dict[str, str]:
    """Inventories off: these tests are about what a supervisor may conclude from the daemon it asks alone
    (a fleet without inventories must stay as safe); tests/integration/test_many_hosts.py has them on."""
    return {**pool_env, "JOBPOOL_INVENTORY_SECS": "0"}


@pytest.fixture
def two_daemons(docker_host: str, second_daemon: DockerDaemon) -> tuple[str, str]:
    second_daemon.ensure_running()
    second_daemon.remove_containers()
    second_daemon.remove_volumes(prefix="jobpool-ckpt")
    return docker_host, second_daemon.host


def test_two_daemons_report_one_docker_id_but_have_two_identities(two_daemons: tuple[str, str]) -> None:
    d1, d2 = two_daemons
    ids = []
    for host in (d1, d2):
        with contextlib.closing(docker.DockerClient(base_url=host, timeout=10)) as client:
            ids.append(client.info()["ID"])
    assert ids[0] == ids[1], "precondition: the two private daemons share /etc/docker/key.json"
    first, second = daemon_identity(d1), daemon_identity(d2)
    assert first != second
    assert daemon_identity(d1) == first, "the identity is stable: kept on the daemon"


def test_a_job_on_a_daemon_sharing_the_supervisors_docker_id_keeps_its_slot(
        two_daemons: tuple[str, str], pool: Pool, spawn: Callable[..., JobpoolProcess]) -> None:
    """The incident: the supervisor asks daemon 1 about a job recorded on daemon 2 (same Docker ID), finds
    nothing and must not call it absent. The job keeps attempt 1 and its slot; nothing runs it twice."""
    d1, d2 = two_daemons
    pool.set_slots(2)
    command = ["sh", "-c", "echo started; sleep 8"]
    with Sampler((d1, d2)) as sampler:
        supervisor = spawn(module="jobpool.cli", args=("supervisor",), DOCKER_HOST=d1)
        w2, on_d2 = start_on(spawn, pool, d2, command)
        start_on(spawn, pool, d1, command)
        w2.kill_with_children()  # the container keeps running on daemon 2
        spawn(DOCKER_HOST=d2)  # restarted by a service manager: a live worker on daemon 2 could run attempt 2
        # Until well after its container has ended (and long after its lease lapsed): sweeps go on, the job is
        # never judged absent from daemon 1 and never re-run.
        eventually(lambda: not live_on(d2, on_d2), timeout=30, message="the job's container exiting")
        seen = supervisor.log().count("sweep pool=")
        eventually(lambda: supervisor.log().count("sweep pool=") >= seen + 4, timeout=20,
                   message="four more sweeps")
    assert sampler.rounds > 50
    assert sampler.most_live[on_d2] == 1, "two live containers of one job"
    assert sampler.attempts[on_d2] == {"1"}, "a second attempt was launched"
    job = pool.get(on_d2)
    assert (job.state, job.attempt) == (JobState.RUNNING, 1)
    assert pool.store.client.zscore(pool.keys.running, on_d2) is not None
    assert f"job {on_d2} (attempt 1) kept: probe_unknown" in supervisor.log()
    assert "attempt recorded on daemon jpd1:" in supervisor.log()


def test_the_supervisor_on_the_right_daemon_judges_present_exited_and_absent(
        two_daemons: tuple[str, str], pool: Pool, spawn: Callable[..., JobpoolProcess]) -> None:
    d1, d2 = two_daemons
    pool.set_slots(3)
    sup = Supervisor(pool.store, ContainerProber(d2, timeout=5))
    wrong = Supervisor(pool.store, ContainerProber(d1, timeout=5))
    try:
        workers = [spawn(DOCKER_HOST=d2) for _ in range(3)]  # a worker runs one job at a time
        running = pool.enqueue(IMAGE, ["sh", "-c", "sleep 60"]).id
        exiting = pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 2; exit 3"]).id
        gone = pool.enqueue(IMAGE, ["sh", "-c", "sleep 60"]).id
        eventually(lambda: all(live_on(d2, j) for j in (running, exiting, gone)), timeout=30,
                   message="three jobs on d2")
        for w in workers:
            w.kill_with_children()
        with contextlib.closing(docker.DockerClient(base_url=d2, timeout=10)) as client:
            for c in client.containers.list(sparse=True, filters={"label": f"jobpool.job_id={gone}"}):
                c.remove(force=True)
        eventually(lambda: not live_on(d2, exiting), timeout=20, message="the exiting job's container ended")
        ids = (running, exiting, gone)
        eventually(lambda: not any(pool.store.client.exists(pool.keys.lease(j)) for j in ids), timeout=10,
                   message="the dead worker's leases lapsing")

        # From the other daemon (same Docker ID): unknown for all three, nothing changes; no cancel either.
        report = wrong.sweep(job_ids=ids, dry_run=True)
        assert {d.verdict.kind.value for d in report.decisions} == {"warn"} and report.unknown == 3
        pool.cancel(gone)
        stop = stop_orphan(pool.store, gone, wrong.prober)
        assert stop.action == "unknown" and "this process is on daemon jpd1:" in stop.detail
        assert pool.get(gone).state is JobState.RUNNING

        report = sup.sweep(job_ids=ids)
        verdicts = {d.job_id: d.verdict.kind.value for d in report.decisions}
        assert verdicts == {running: "adopt", exiting: "exited", gone: "absent"}
        assert (pool.get(exiting).state, pool.get(exiting).exit_code) == (JobState.FAILED, 3)
        assert pool.get(gone).state is JobState.CANCELLED
        assert pool.get(running).state is JobState.RUNNING
    finally:
        sup.close()
        wrong.close()


def test_a_worker_on_another_daemon_refuses_to_adopt(
        two_daemons: tuple[str, str], pool: Pool, spawn: Callable[..., JobpoolProcess]) -> None:
    """Adoption requests go to the queue only the workers on the attempt's daemon listen on, so a worker on
    another daemon never takes one; one that finds a request anyway (on the pool's queue, where a request for
    a row with no identity goes) refuses to re-attach (the adopt script compares identities too)."""
    d1, d2 = two_daemons
    pool.set_slots(1)
    w2, job_id = start_on(spawn, pool, d2, ["sh", "-c", "echo started; sleep 6; exit 0"])
    w2.kill_with_children()
    w1 = spawn(DOCKER_HOST=d1)
    sup = Supervisor(pool.store, ContainerProber(d2, timeout=5))
    try:
        eventually(lambda: not pool.store.client.exists(pool.keys.lease(job_id)), timeout=10,
                   message="lease lapsed")
        assert sup.sweep(job_ids=[job_id]).decisions[0].outcome == "adoption requested"
        routed = "rq:queue:" + pool.keys.daemon_queue_name(daemon_identity(d2))
        assert pool.store.client.llen(routed) == 1, "the request waits on daemon 2's own queue"
        eventually(lambda: "Listening on" in w1.log() or "jobpool-it" in w1.log(), timeout=20,
                   message="the d1 worker up")
        row = sup.evidence.read([job_id]).rows[0]
        Queue(pool.keys.rq_queue_name, connection=sup.adoptions.rq_client(),
              serializer=JSONSerializer).enqueue_call(ADOPT_ENTRY_POINT, args=[job_id, row.owner_boot, 1])
        eventually(lambda: "not adopted here" in w1.log(), timeout=20, message="the d1 worker refusing")
        assert pool.store.client.llen(routed) == 1, "no worker on daemon 1 took daemon 2's request"
        assert pool.get(job_id).owner_boot not in ("",) and pool.get(job_id).state is JobState.RUNNING
        assert not any(e["reason"] == "adopted" for e in pool.events(job_id))
        # A worker on daemon 2 then takes it over and finishes it from the container's real exit code.
        spawn(DOCKER_HOST=d2)
        done = cast(Job, eventually(lambda: ((j := pool.get(job_id)).state is not JobState.RUNNING and j)
                                    or (sup.sweep(job_ids=[job_id]) and None), timeout=40, interval=0.5,
                                    message="the job finished by an adopter on daemon 2"))
        assert (done.state, done.attempt) == (JobState.SUCCEEDED, 1)
    finally:
        sup.close()


def test_processes_racing_to_make_the_identity_agree_on_one(two_daemons: tuple[str, str]) -> None:
    """The first to ask creates the identity volume; a racing create of the same name returns the same
    volume, and every process reads the label back from the daemon."""
    _, d2 = two_daemons
    with (contextlib.closing(docker.DockerClient(base_url=d2, timeout=10)) as client,
          contextlib.suppress(docker.errors.NotFound)):
        client.api.remove_volume(daemonid.VOLUME)
    seen: list[str] = []

    def establish() -> None:
        with contextlib.closing(docker.DockerClient(base_url=d2, timeout=10)) as client:
            seen.append(daemonid.establish(client, d2))

    threads = [threading.Thread(target=establish) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(seen) == 8 and len(set(seen)) == 1, seen
