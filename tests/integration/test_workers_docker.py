"""Real workers running real containers: slot limit, outcomes, drain, crash, cancel/pause, fencing."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import docker
import pytest

from jobpool import JobState, Pool
from jobpool.contract import REASON_CONTAINER_REMOVED
from tests.support.constants import CHECKPOINTING, IMAGE
from tests.support.job_containers import containers
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.servers import DockerDaemon

IGNORES_TERM = "trap '' TERM; echo started; while true; do sleep 0.1; done"


def job_containers(client: docker.DockerClient, job_id: str, running_only: bool = True) -> list[Any]:
    found: list[Any] = client.containers.list(all=not running_only, sparse=True,
                                              filters={"label": f"jobpool.job_id={job_id}"})
    return found


def started(client: docker.DockerClient, job_id: str) -> bool:
    return any(b"started" in c.logs() for c in job_containers(client, job_id))


@pytest.fixture
def client(docker_host: str) -> docker.DockerClient:
    c = docker.DockerClient(base_url=docker_host)
    yield c
    c.close()


def test_slot_limit_holds_across_three_workers(pool: Pool, spawn: Callable[..., JobpoolProcess],
                                               client: docker.DockerClient) -> None:
    pool.set_slots(2)
    jobs = [pool.enqueue(IMAGE, ["sh", "-c", f"echo job {i}; sleep 0.3"]) for i in range(8)]
    failing = pool.enqueue(IMAGE, ["sh", "-c", "echo about to fail; echo oops >&2; exit 7"])
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            n = len(client.containers.list(sparse=True,
                                           filters={"label": "jobpool.pool=it", "status": "running"}))
            peak = max(peak, n)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    for _ in range(3):
        spawn()
    try:
        for job in jobs:
            assert pool.wait(job.id, timeout=90).state == JobState.SUCCEEDED
        done = pool.wait(failing.id, timeout=60)
    finally:
        stop.set()
        t.join(10)
    assert 1 <= peak <= 2, f"{peak} job containers ran at once with 2 slots"
    assert done.state == JobState.FAILED and done.exit_code == 7 and done.error_reason == "exit_code_7"
    assert "about to fail" in pool.logs(failing.id) and "oops" in pool.logs(failing.id)
    assert pool.logs(jobs[0].id).strip() == "job 0"
    # Containers are removed once their outcome is recorded.
    eventually(lambda: not client.containers.list(all=True, sparse=True,
                                                  filters={"label": "jobpool.pool=it"}),
               message="finished containers are removed")


def test_labels_env_and_checkpoint_volume(pool: Pool, spawn: Callable[..., JobpoolProcess],
                                          client: docker.DockerClient, docker_host: str) -> None:
    job = pool.enqueue(IMAGE, ["sh", "-c", 'echo "$JOBPOOL_JOB_ID $JOBPOOL_ATTEMPT $JOBPOOL_CHECKPOINT_DIR"; '
                                           "echo started; sleep 30"])
    spawn()
    eventually(lambda: started(client, job.id), timeout=30, message="job container started")
    out = subprocess.run(["docker", "-H", docker_host, "ps", "-q",
                          "--filter", f"label=jobpool.job_id={job.id}",
                          "--filter", "label=jobpool.pool=it", "--filter", "label=jobpool.attempt=1"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert len(out) == 1
    c = client.containers.get(out[0])
    assert c.labels["jobpool.boot_id"] == pool.get(job.id).owner_boot
    assert c.attrs["HostConfig"]["NetworkMode"] == "none"
    assert c.attrs["HostConfig"]["AutoRemove"] is False
    assert f"{job.id} 1 /jobpool/checkpoint" in c.logs().decode()
    assert pool.get(job.id).container_id == c.id
    pool.cancel(job.id)
    assert pool.wait(job.id, timeout=30).state == JobState.CANCELLED
    eventually(lambda: not [v for v in client.volumes.list() if job.id in v.name],
               message="checkpoint volume removed once the job is terminal")


def test_drain_hands_back_with_checkpoint(pool: Pool, spawn: Callable[..., JobpoolProcess],
                                          client: docker.DockerClient) -> None:
    job = pool.enqueue(IMAGE, ["sh", "-c", CHECKPOINTING])
    w = spawn()
    eventually(lambda: started(client, job.id), timeout=30, message="job started")
    t0 = time.monotonic()
    w.signal(signal.SIGTERM)
    eventually(lambda: pool.get(job.id).attempt == 2 or pool.get(job.id).state == JobState.QUEUED,
               timeout=3 + 2, message="handed back within the drain timeout")
    assert w.wait(15) == 0
    assert time.monotonic() - t0 < 3 + 5
    handed = [e for e in pool.events(job.id) if e["to"] == "queued" and e["from"] == "running"]
    assert handed and handed[0]["reason"] == "shutdown_handback"
    spawn()
    done = pool.wait(job.id, timeout=60)
    assert done.state == JobState.SUCCEEDED and done.attempt == 2 and done.recovery_attempts == 0
    assert "resumed with step" in pool.logs(job.id)
    assert "0 jobs left running" in w.log()


def test_pause_during_drain_wins(pool: Pool, spawn: Callable[..., JobpoolProcess],
                                 client: docker.DockerClient) -> None:
    # The job stops slowly, so the pause lands while the drain is in flight.
    slow = CHECKPOINTING.replace("exit 75' TERM", "sleep 1; exit 75' TERM")
    job = pool.enqueue(IMAGE, ["sh", "-c", slow])
    w = spawn()
    eventually(lambda: started(client, job.id), timeout=30, message="job started")
    w.signal(signal.SIGTERM)
    eventually(lambda: "asking it to checkpoint" in w.log(), timeout=5, message="drain begun")
    pool.pause(job.id)
    assert w.wait(15) == 0
    assert pool.get(job.id).state == JobState.PAUSED
    resumed = pool.resume(job.id)
    assert resumed is not None
    assert resumed.state in (JobState.QUEUED, JobState.RUNNING)
    spawn()
    done = pool.wait(job.id, timeout=60)
    assert done.state == JobState.SUCCEEDED and "resumed with step" in pool.logs(job.id)


def test_job_ignoring_term_is_left_running_at_the_deadline(pool: Pool, spawn: Callable[..., JobpoolProcess],
                                                           client: docker.DockerClient) -> None:
    job = pool.enqueue(IMAGE, ["sh", "-c", IGNORES_TERM])
    w = spawn()
    eventually(lambda: started(client, job.id), timeout=30, message="job started")
    t0 = time.monotonic()
    w.signal(signal.SIGTERM)
    assert w.wait(3 + 10) == 0
    assert time.monotonic() - t0 < 3 + 6, "the drain is bounded"
    assert "1 job left running" in w.log()
    row = pool.get(job.id)
    assert row.state == JobState.RUNNING and row.owner_boot
    assert len(job_containers(client, job.id)) == 1, "its container keeps running"


def test_sigkill_mid_job_leaves_container_and_row_running(pool: Pool, spawn: Callable[..., JobpoolProcess],
                                                          client: docker.DockerClient) -> None:
    job = pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 60"])
    w = spawn()
    eventually(lambda: started(client, job.id), timeout=30, message="job started")
    w.kill_with_children()
    row = pool.get(job.id)
    assert row.state == JobState.RUNNING
    assert len(job_containers(client, job.id)) == 1
    # Its lease lapses (nothing renews it) but nothing here frees the slot: that is the supervisor's call.
    eventually(lambda: not pool.store.client.exists(pool.keys.lease(job.id)), timeout=5,
               message="lease expired")
    assert pool.get(job.id).state == JobState.RUNNING and pool.slots()[0] == 1


@pytest.mark.parametrize("action", ["cancel", "pause"])
def test_cancel_and_pause_of_a_running_job(pool: Pool, spawn: Callable[..., JobpoolProcess],
                                           client: docker.DockerClient, action: str) -> None:
    job = pool.enqueue(IMAGE, ["sh", "-c", IGNORES_TERM])  # forces the SIGKILL after the grace period
    nxt = pool.enqueue(IMAGE, ["sh", "-c", "echo next"])
    spawn()
    eventually(lambda: started(client, job.id), timeout=30, message="job started")
    getattr(pool, action)(job.id)
    expected = JobState.CANCELLED if action == "cancel" else JobState.PAUSED
    assert pool.wait(job.id, timeout=20, states=[expected]).state == expected
    # Removed once the stop is recorded, by the worker's main process after the horse's finish.
    eventually(lambda: not job_containers(client, job.id), timeout=10, message="its container removed")
    assert pool.wait(nxt.id, timeout=30).state == JobState.SUCCEEDED
    if action == "pause":
        assert any(v for v in client.volumes.list() if job.id in v.name), "a paused job keeps its checkpoint"


def test_fenced_after_operator_eviction(pool: Pool, spawn: Callable[..., JobpoolProcess],
                                        client: docker.DockerClient) -> None:
    job = pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 60"])
    w = spawn()
    eventually(lambda: started(client, job.id), timeout=30, message="job started")
    row = pool.get(job.id)
    evicted = pool.evict(job.id, row.attempt, reason="operator_test")
    assert evicted.state == JobState.FAILED
    before = pool.store.client.hgetall(pool.keys.job(job.id))
    n_events = len(pool.events(job.id))
    eventually(lambda: "no longer ours" in w.log(), timeout=10, message="watcher noticed the fence")
    eventually(lambda: not job_containers(client, job.id), timeout=10,
               message="old watcher stopped its container")
    after = pool.store.client.hgetall(pool.keys.job(job.id))
    assert after == before and len(pool.events(job.id)) == n_events, "the old watcher wrote nothing"


def test_log_tail_reads_what_the_sdk_reads(client: docker.DockerClient) -> None:
    """The watcher reads a log tail with one request (executors/dockerlogs.py `read_logs`, no inspect for the
    TTY): the same bytes as the SDK's `logs`, stdout and stderr interleaved in order, frames of any size."""
    from jobpool.workers.executors.dockerlogs import read_logs

    script = ("echo out-1; echo err-1 >&2; seq 1 20000; echo err-2 >&2; "
              "printf 'no newline at the end'")
    c = client.containers.create(IMAGE, ["sh", "-c", script], network_mode="none")
    try:
        c.start()
        assert c.wait(timeout=60)["StatusCode"] == 0
        for tail in (4000, 3):
            ours = read_logs(client.api, c.id, tail=tail)
            assert ours == client.api.logs(c.id, stdout=True, stderr=True, tail=tail)
            assert ours.endswith(b"no newline at the end")
        whole = read_logs(client.api, c.id, tail=30000)
        assert whole == client.api.logs(c.id, stdout=True, stderr=True, tail=30000)
        assert all(x in whole for x in (b"out-1\n", b"err-1\n", b"\n1\n2\n", b"err-2\n")), whole[:200]
        assert len(whole) > 100_000  # many frames
    finally:
        c.remove(force=True)


def test_containers_removed_under_live_workers_are_recovered_not_failed(
        pool: Pool, spawn: Callable[..., JobpoolProcess], client: docker.DockerClient) -> None:
    """`docker rm -f` kills, then destroys: a worker that reads the exit 137 in between must not record it as
    the job's own (it sees the `destroy` event and leaves the row to the supervisor, which finds the
    container absent and runs the job again)."""
    pool.set_slots(3)
    for _ in range(3):  # a lease long enough that each worker reads its container's end before it lapses
        spawn(JOBPOOL_LEASE_SECS="6")
    jobs = [pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 60"]) for _ in range(3)]
    running = eventually(lambda: len(found := client.containers.list(
        sparse=True, filters={"label": "jobpool.pool=it", "status": "running"})) == 3 and found,
        timeout=30, message="three containers running")
    spawn(module="jobpool.cli", args=("supervisor",))
    for c in running:  # rm -f's two steps, the second once the first is seen (its worker reads it as fast)
        client.api.kill(c.id)
        eventually(lambda c=c: client.api.inspect_container(c.id)["State"]["Status"] == "exited", timeout=10,
                   message="killed")
        c.remove(force=True)
    for job in jobs:
        again = eventually(lambda j=job: (r := pool.get(j.id)).attempt == 2 and r, timeout=30,
                           message=f"job {job.id} run again")
        assert again.recovery_attempts == 1 and again.state is not JobState.FAILED
        assert not [e for e in pool.events(job.id) if e["reason"] == "exit_code_137"]


#: Files a job writes into its own file system so that Docker takes seconds to delete it: far past the one
#: second a watcher waits for a late event (jobpool/exits.py, OOM_EVENT_GRACE_SECS), as on a loaded host.
SLOW_TO_REMOVE = 250_000


def test_a_container_slow_to_remove_under_its_live_worker_is_recovered_not_failed(
        pool: Pool, spawn: Callable[..., JobpoolProcess], client: docker.DockerClient) -> None:
    """One `docker rm -f` whose deletion takes seconds: the worker reads exit 137 long before the `destroy`
    event, and the supervisor may probe the container in between. Both read Docker's `removing` state, so
    neither records 137 as the job's exit: the job runs again once the container is gone."""
    pool.set_slots(1)
    spawn(module="jobpool.cli", args=("supervisor",))
    spawn()
    job = pool.enqueue(IMAGE, ["sh", "-c", f"mkdir /many && cd /many && seq 1 {SLOW_TO_REMOVE} | xargs touch "
                                           "&& echo started; sleep 600"])
    running = eventually(lambda: [c for c in containers(client, job.id) if b"started" in c.logs()],
                         timeout=300, message="the job's file system filled")  # 5 s idle; 90 s seen loaded
    seen: list[str] = []

    def removal_seen() -> bool:
        seen.append(status_of(client, running[0].id))
        return seen[-1] in ("removing", "gone")

    remover = threading.Thread(target=running[0].remove, kwargs={"force": True})
    remover.start()
    try:
        eventually(removal_seen, timeout=30, message="removal under way")
    finally:
        remover.join(60)
    again = eventually(lambda: ((r := pool.get(job.id)).attempt == 2 or r.state.terminal) and r,
                       timeout=60, message="run again, or failed")
    assert "removing" in seen, seen  # the removal was slow enough to be seen under way
    assert (again.attempt, again.recovery_attempts) == (2, 1) and again.state is not JobState.FAILED
    assert not [e for e in pool.events(job.id) if e["reason"] == "exit_code_137"], pool.events(job.id)


def test_a_container_left_dead_by_a_failed_removal_is_recovered_as_a_crash(
        pool: Pool, spawn: Callable[..., JobpoolProcess], client: docker.DockerClient,
        docker_daemon: DockerDaemon) -> None:
    """`docker rm -f` kills the container, then cannot delete a file of it (made immutable here, as a file
    system fault would leave it): Docker leaves the container `dead` for good. Its exit 137 was the
    removal's: the job runs again as a crash, `container_removed`, and is not failed with exit 137."""
    pool.set_slots(1)
    spawn(module="jobpool.cli", args=("supervisor",))
    spawn()
    job = pool.enqueue(IMAGE, ["sh", "-c", "mkdir /pin && touch /pin/immutable && echo started; sleep 600"])
    first = eventually(lambda: [c for c in containers(client, job.id) if b"started" in c.logs()],
                       timeout=60, message="the job running")[0]
    [pinned] = (docker_daemon.dir / "root" / "vfs" / "dir").glob("*/pin/immutable")  # its file system, vfs
    subprocess.run(["chattr", "+i", str(pinned)], check=True)
    try:
        with pytest.raises(docker.errors.APIError, match="failed to remove"):
            first.remove(force=True)
        assert status_of(client, first.id) == "dead"
        again = eventually(lambda: ((r := pool.get(job.id)).attempt == 2 or r.state.terminal) and r,
                           timeout=60, message="run again, or ended")
        reasons = [e["reason"] for e in pool.events(job.id)]
        assert (again.attempt, again.recovery_attempts) == (2, 1), reasons
        assert REASON_CONTAINER_REMOVED in reasons and "exit_code_137" not in reasons, reasons
    finally:
        subprocess.run(["chattr", "-i", str(pinned)], check=False)


def status_of(client: docker.DockerClient, container_id: str) -> str:
    try:
        return str(client.api.inspect_container(container_id)["State"]["Status"])
    except docker.errors.NotFound:
        return "gone"
