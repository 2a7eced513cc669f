"""Faults of the container infrastructure under running jobs are not the jobs' failures (jobpool/exits.py).

Real dockerd processes, SIGKILLed and restarted under a job; a containerd-shim SIGKILLed while its daemon is
down (its container's exit is then lost: Docker records 255); a daemon without live-restore, which stops its
containers when it restarts; a container the kernel's OOM killer ends. Worker tests run no supervisor: what
ends the job is the worker's own finish (its boot is the event's actor).

Jobs wait at a gate (a file in a bind-mounted directory) so the test decides when they end, even while their
daemon is down.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from jobpool import JobState, Pool
from jobpool.contract import EXIT_UNKNOWN, REASON_OOM_KILLED, REASON_RESTART_LOST_EXIT, REASON_RESTART_STOPPED
from jobpool.exits import OOM_EVENT_GRACE_SECS, oom_event
from jobpool.supervisor import Supervisor
from tests.support.constants import IMAGE
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess, children, state_of
from tests.support.servers import DockerDaemon


def gated(then: str) -> list[str]:
    """A job that says it started, waits until the test opens its gate, then runs `then`."""
    return ["sh", "-c", f"echo started; while [ ! -f /gate/open ]; do sleep 0.05; done; {then}"]


#: Runs once: the first attempt marks its checkpoint directory and waits at the gate, a second one succeeds.
ONCE = ('if [ -f "$JOBPOOL_CHECKPOINT_DIR/ran" ]; then echo again; exit 0; fi; '
        'touch "$JOBPOOL_CHECKPOINT_DIR/ran"; ')
#: Doubles a string until the memory limit is reached: the kernel's OOM killer ends it.
ALLOCATE = 's=a; while :; do s="$s$s"; done'


@pytest.fixture
def gpool(pool_env: dict[str, str], gate: Path, docker_host: str) -> Iterator[Pool]:
    """The test pool, allowed to bind-mount the gate; its workers use the session's dockerd."""
    p = Pool.from_env(env={**pool_env, "JOBPOOL_BIND_ROOTS": str(gate)})
    yield p
    p.close()


def enqueue(pool: Pool, gate: Path, command: list[str], **spec: Any) -> str:
    return pool.enqueue(IMAGE, command, mounts=[f"{gate}:/gate"], **spec).id


def container_of(client: docker.DockerClient, job_id: str) -> docker.models.containers.Container:
    found = client.containers.list(all=True, filters={"label": f"jobpool.job_id={job_id}"})
    assert len(found) == 1, found
    return found[0]


def started(host: str, job_id: str) -> bool:
    with contextlib.closing(docker.DockerClient(base_url=host, timeout=10)) as client:
        found = client.containers.list(filters={"label": f"jobpool.job_id={job_id}"})
        return any(b"started" in c.logs() for c in found)


def kill_shim(container_id: str) -> None:
    """SIGKILL the containerd-shim that runs `container_id` (found by the `-id` in its command line), as a
    host or containerd crash takes it: the container's exit can then no longer be read."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            shim = Path(os.fsdecode(argv[0])).name.startswith("containerd-shim")
            if shim and container_id.encode() in argv:
                pids.append(int(entry.name))
    assert len(pids) == 1, f"shims of {container_id[:12]}: {pids}"
    os.kill(pids[0], signal.SIGKILL)
    eventually(lambda: not Path(f"/proc/{pids[0]}").exists() or "Z" in _proc_state(pids[0]),
               message="the shim is dead")


def _proc_state(pid: int) -> str:
    return state_of(pid) or "Z"  # gone counts as dead


def holds_through(check: Callable[[], bool], secs: float, message: str) -> None:
    """`check` stays true, asked every 50 ms, for `secs` seconds (the opposite of `eventually`)."""
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        assert check(), message
        time.sleep(0.05)


def keeps_its_job(pool: Pool, job_id: str, owner: str, worker: JobpoolProcess, horse: list[int]) -> None:
    """For three leases, the worker keeps the job its daemon went away under: the lease renewed, the job
    running, its work horse alive (a horse that died on the daemon's error would leave the job to a
    supervisor, after a lease and a sweep)."""
    holds_through(lambda: pool.store.client.get(pool.keys.lease(job_id)) == f"{owner}:1"
                  and pool.get(job_id).state is JobState.RUNNING and children(worker.pid) == horse,
                  3 * pool.settings.lease_secs, "the worker kept its job, its lease and its work horse")


def outage_noticed(worker: JobpoolProcess) -> bool:
    return "its docker daemon did not answer" in worker.log()


def last_transition(pool: Pool, job_id: str, to: str) -> dict[str, str]:
    return [e for e in pool.events(job_id) if e["from"] == "running" and e["to"] == to][-1]


# ---- the worker keeps its job through a daemon restart ---------------------------------------------------


@pytest.mark.parametrize("ends", ["after the daemon is back", "while the daemon is down"])
def test_worker_keeps_watching_through_a_dockerd_sigkill_and_reads_the_real_exit(
        gpool: Pool, gate: Path, spawn: Callable[..., JobpoolProcess], docker_daemon: DockerDaemon,
        dclient: docker.DockerClient, ends: str) -> None:
    job_id = enqueue(gpool, gate, gated("exit 3"))
    worker = spawn(JOBPOOL_BIND_ROOTS=str(gate))
    eventually(lambda: started(docker_daemon.host, job_id), timeout=30, message="the job started")
    owner, cid = gpool.get(job_id).owner_boot, container_of(dclient, job_id).id
    horse = children(worker.pid)

    docker_daemon.stop(signal.SIGKILL)  # the container lives on (live-restore); the worker's wait breaks
    # For several leases, the worker keeps its job: lease renewed, work horse alive, nothing written.
    keeps_its_job(gpool, job_id, owner, worker, horse)
    assert outage_noticed(worker)
    if ends == "while the daemon is down":
        (gate / "open").touch()  # its shim keeps the exit code for the daemon to read when it is back
        eventually(lambda: not in_cgroup(cid), timeout=10, message="the job's processes exited")
    docker_daemon.start()
    eventually(lambda: "answers again" in worker.log(), timeout=20, message="the worker found its daemon")
    if ends == "after the daemon is back":
        assert gpool.get(job_id).state is JobState.RUNNING
        (gate / "open").touch()

    done = gpool.wait(job_id, timeout=30)
    assert (done.state, done.exit_code, done.error_reason) == (JobState.FAILED, 3, "exit_code_3")
    assert (done.attempt, done.recovery_attempts) == (1, 0)
    assert last_transition(gpool, job_id, "failed")["actor"] == owner, "finished by the worker itself"
    assert worker.proc.poll() is None


def in_cgroup(container_id: str) -> bool:
    """Whether any process still runs in the container's cgroup (asked of /proc: its daemon may be down)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if container_id in (entry / "cgroup").read_text() and _proc_state(int(entry.name)) != "Z":
                    return True
    return False


# ---- containers their infrastructure ended: crashes, not failures -------------------------------------


def test_an_exit_a_daemon_restart_lost_is_recovered_as_a_crash_and_runs_again(
        gpool: Pool, gate: Path, spawn: Callable[..., JobpoolProcess], docker_daemon: DockerDaemon,
        dclient: docker.DockerClient) -> None:
    """dockerd and its containerd SIGKILLed, then the container's shim (a host or containerd crash): the
    restarted daemon cannot read the exit and records 255, after the worker last found it gone."""
    job_id = enqueue(gpool, gate, ["sh", "-c", ONCE + "echo started; sleep 1000"])
    worker = spawn(JOBPOOL_BIND_ROOTS=str(gate))
    eventually(lambda: started(docker_daemon.host, job_id), timeout=30, message="the job started")
    owner, cid = gpool.get(job_id).owner_boot, container_of(dclient, job_id).id
    horse = children(worker.pid)

    docker_daemon.stop(signal.SIGKILL)
    keeps_its_job(gpool, job_id, owner, worker, horse)
    assert outage_noticed(worker)
    kill_shim(cid)
    docker_daemon.start()

    done = gpool.wait(job_id, timeout=60)
    assert (done.state, done.attempt, done.recovery_attempts) == (JobState.SUCCEEDED, 2, 1)
    crash = last_transition(gpool, job_id, "queued")
    assert (crash["reason"], crash["actor"]) == (REASON_RESTART_LOST_EXIT, owner), "recovered by the worker"
    assert crash["evidence"].startswith(f"exit_code={EXIT_UNKNOWN}; exit {EXIT_UNKNOWN} recorded at ")
    assert "again" in gpool.logs(job_id)


def test_a_daemon_without_live_restore_that_stops_a_job_as_it_restarts_is_a_crash(
        pool_env: dict[str, str], gate: Path, spawn: Callable[..., JobpoolProcess]) -> None:
    with DockerDaemon(live_restore=False) as daemon, \
            contextlib.closing(Pool.from_env(env={**pool_env, "JOBPOOL_BIND_ROOTS": str(gate)})) as pool:
        daemon.start()
        daemon.import_busybox_image()
        job_id = enqueue(pool, gate, ["sh", "-c", ONCE + "echo started; sleep 1000"])
        worker = spawn(JOBPOOL_BIND_ROOTS=str(gate), DOCKER_HOST=daemon.host)
        eventually(lambda: started(daemon.host, job_id), timeout=30, message="the job started")
        owner, horse = pool.get(job_id).owner_boot, children(worker.pid)

        daemon.stop(signal.SIGKILL)  # its container lives on, until the daemon starts again and stops it
        keeps_its_job(pool, job_id, owner, worker, horse)
        assert outage_noticed(worker)
        daemon.start()

        done = pool.wait(job_id, timeout=60)
        assert (done.state, done.attempt, done.recovery_attempts) == (JobState.SUCCEEDED, 2, 1)
        crash = last_transition(pool, job_id, "queued")
        assert (crash["reason"], crash["actor"]) == (REASON_RESTART_STOPPED, owner)
        assert crash["evidence"].startswith("exit_code=143; ")  # the daemon's stop signal, through tini


def test_an_oom_killed_job_fails_oom_killed(gpool: Pool, gate: Path,
                                            spawn: Callable[..., JobpoolProcess]) -> None:
    job_id = enqueue(gpool, gate, gated(ALLOCATE), memory="16m")
    spawn(JOBPOOL_BIND_ROOTS=str(gate))
    (gate / "open").touch()
    done = gpool.wait(job_id, timeout=60)
    assert (done.state, done.error_reason, done.exit_code) == (JobState.FAILED, REASON_OOM_KILLED, 137)
    assert done.recovery_attempts == 0


def test_a_jobs_own_exit_255_is_its_failure(gpool: Pool, gate: Path,
                                            spawn: Callable[..., JobpoolProcess]) -> None:
    job_id = enqueue(gpool, gate, gated(f"exit {EXIT_UNKNOWN}"))
    spawn(JOBPOOL_BIND_ROOTS=str(gate))
    (gate / "open").touch()
    done = gpool.wait(job_id, timeout=60)
    assert (done.state, done.error_reason, done.recovery_attempts) == (JobState.FAILED, "exit_code_255", 0)


# ---- the supervisor judges an orphan's container by the same rule ---------------------------------------


@pytest.fixture
def orphaned(gpool: Pool, gate: Path, spawn: Callable[..., JobpoolProcess], dclient: docker.DockerClient,
             docker_host: str) -> Callable[..., tuple[str, str]]:
    """Start a job on a worker, then SIGKILL the worker and its work horse: (job id, container id) of a
    job whose container runs on with nobody watching; its lease has lapsed."""

    def make(command: list[str], **spec: object) -> tuple[str, str]:
        job_id = enqueue(gpool, gate, command, **spec)
        worker = spawn(JOBPOOL_BIND_ROOTS=str(gate))
        eventually(lambda: started(docker_host, job_id), timeout=30, message="the job started")
        worker.kill_with_children()
        eventually(lambda: not gpool.store.client.exists(gpool.keys.lease(job_id)), timeout=10,
                   message="its lease lapsed")
        return job_id, container_of(dclient, job_id).id

    return make


def judged(sup: Supervisor, pool: Pool, job_id: str) -> bool:
    """One sweep; whether it ended the job's running attempt."""
    sup.sweep()
    return pool.get(job_id).state is not JobState.RUNNING


@pytest.fixture
def sup(gpool: Pool, docker_host: str) -> Iterator[Supervisor]:
    s = Supervisor(gpool.store, actor="test-supervisor")
    yield s
    s.close()


def test_supervisor_recovers_an_orphan_whose_exit_a_restart_it_saw_lost(
        gpool: Pool, orphaned: Callable[..., tuple[str, str]], sup: Supervisor,
        docker_daemon: DockerDaemon) -> None:
    job_id, cid = orphaned(gated("exit 0"))
    assert sup.sweep().verdicts == {"adopt": 1}  # running, nobody to adopt it: the slot is kept
    docker_daemon.stop(signal.SIGKILL)
    assert sup.sweep().verdicts == {"warn": 1}  # the daemon does not answer: unknown, the slot kept
    kill_shim(cid)
    docker_daemon.start()

    assert sup.sweep().verdicts == {"crashed": 1}
    crash = last_transition(gpool, job_id, "queued")
    assert (crash["reason"], crash["actor"]) == (REASON_RESTART_LOST_EXIT, "test-supervisor")
    assert "exited with 255 (exit 255 recorded at " in crash["evidence"]
    job = gpool.get(job_id)  # back at its place, promoted again at once (the slot was free), 255 recorded
    assert (job.state, job.attempt, job.recovery_attempts, job.exit_code) == (JobState.RUNNING, 2, 1, 255)


def test_supervisor_fails_an_orphans_own_exit_255_after_an_outage_it_survived(
        gpool: Pool, gate: Path, orphaned: Callable[..., tuple[str, str]], sup: Supervisor,
        docker_daemon: DockerDaemon) -> None:
    """An outage the container ran through is no evidence about an exit after it."""
    job_id, _ = orphaned(gated(f"exit {EXIT_UNKNOWN}"))
    docker_daemon.stop(signal.SIGKILL)
    assert sup.sweep().verdicts == {"warn": 1}
    docker_daemon.start()
    assert sup.sweep().verdicts == {"adopt": 1}  # still running: the outage is over
    (gate / "open").touch()
    eventually(lambda: judged(sup, gpool, job_id), timeout=10, interval=0.2, message="its end judged")
    job = gpool.get(job_id)
    assert (job.state, job.error_reason, job.recovery_attempts) == (JobState.FAILED, "exit_code_255", 0)


def test_supervisor_fails_an_orphan_the_oom_killer_ended(
        gpool: Pool, gate: Path, orphaned: Callable[..., tuple[str, str]], sup: Supervisor) -> None:
    job_id, _ = orphaned(gated(ALLOCATE), memory="16m")
    (gate / "open").touch()
    eventually(lambda: judged(sup, gpool, job_id), timeout=10, interval=0.2, message="its end judged")
    job = gpool.get(job_id)
    assert (job.state, job.error_reason, job.exit_code) == (JobState.FAILED, REASON_OOM_KILLED, 137)


def test_the_daemons_event_log_tells_an_oom_kill_from_a_sigkill(dclient: docker.DockerClient) -> None:
    # What `exits.oom_event` reads when an exit 137 came without State.OOMKilled (the daemon heard of the
    # exit before the OOM kill, on a loaded host): both containers exit 137, only one was the OOM killer's.
    oomed = dclient.containers.run(IMAGE, ["sh", "-c", ALLOCATE], detach=True, mem_limit="16m",
                                   network_mode="none")
    killed = dclient.containers.run(IMAGE, ["sleep", "1000"], detach=True, network_mode="none")
    try:
        assert oomed.wait(timeout=60)["StatusCode"] == 137
        killed.kill()
        assert killed.wait(timeout=60)["StatusCode"] == 137
        for container, was_oom in ((oomed, True), (killed, False)):
            state = dclient.api.inspect_container(container.id)["State"]
            # With the grace a watcher gives it: on a loaded host the event can come after the exit.
            assert oom_event(dclient.api, container.id, state, OOM_EVENT_GRACE_SECS) is was_oom
            assert oom_event(dclient.api, container.id, state) is was_oom  # logged by now: no grace needed
    finally:
        for container in (oomed, killed):
            container.remove(force=True)
