"""The standby horse (jobpool/workers/horses.py): a worker keeps one horse forked ahead of its next job, the
job runs in it, the next one is forked once the job runs (not while it is launched); a standby never
outlives its worker (stopped or SIGKILLed), and one that died is replaced by RQ's own fork. And RQ's record
of an ended delivery goes, while RQ's record of the worker stays right (idle, no current job, its counts).
A standby or a horse that is stopped (SIGSTOP) does not wedge its worker: the job is handed on, the horse
killed, and `status` says so meanwhile."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import docker
import pytest
from rq.suspension import resume, suspend

from jobpool import JobState, Pool
from jobpool.status import StatusReport
from jobpool.store.luatext import script_text
from jobpool.workers.standby import HANDOFF_ACK_SECS
from tests.support.constants import IMAGE, SUB
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess, children, state_of
from tests.support.proxies import DockerLaunchHold, RedisReplyDropper
from tests.support.servers import RedisServer


def exited(pid: int) -> bool:
    """Gone, or a zombie left to whichever process adopted it."""
    return state_of(pid) in ("", "Z")


def program(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def one_standby(worker_pid: int) -> int:
    """The worker's only child once it is idle: its standby horse, a fork of the worker (its program), never
    another program the worker ran."""
    own = program(worker_pid)
    kids = eventually(lambda: (len(kids := children(worker_pid)) == 1 and program(kids[0]) == own and kids),
                      timeout=20, message="the idle worker has one child, its standby horse")
    return kids[0]


def gated(pool: Pool, tmp_path: Path) -> tuple[str, Path]:
    """A job that runs until `go` exists: its id and that path."""
    go = tmp_path / "go"
    job = pool.enqueue("ignored", ["sh", "-c", f"while [ ! -f {go} ]; do sleep 0.05; done; echo done"])
    return job.id, go


def test_the_job_runs_in_the_standby_and_the_next_standby_is_forked_meanwhile(
        sub_pool: Pool, spawn: Callable[..., JobpoolProcess], tmp_path: Path) -> None:
    worker = spawn(**SUB)
    standby = one_standby(worker.pid)
    job_id, go = gated(sub_pool, tmp_path)

    eventually(lambda: sub_pool.get(job_id).identity, timeout=20, message="the job was launched")
    # The job's process is a child of the horse that was waiting before the job was enqueued.
    eventually(lambda: children(standby), timeout=10, message="the job's process runs under the standby")
    kids = eventually(lambda: len(children(worker.pid)) == 2 and children(worker.pid), timeout=10,
                      message="a new standby forked while the job runs")
    assert standby in kids
    (nxt,) = [k for k in kids if k != standby]
    assert not children(nxt), "the new standby waits, running nothing"

    go.touch()
    assert sub_pool.wait(job_id, timeout=30).state is JobState.SUCCEEDED
    eventually(lambda: children(worker.pid) == [nxt], timeout=10,
               message="the horse that ran the job exited and was reaped; the new standby waits")
    assert exited(standby)


def test_the_next_standby_is_forked_only_once_the_job_runs(
        pool: Pool, spawn: Callable[..., JobpoolProcess], proxy: DockerLaunchHold,
        dclient: docker.DockerClient) -> None:
    """Forking it (and removing the last container) while the horse claims and creates would take CPU from
    that launch: the horse says when its job runs, and only then is the next standby forked."""
    worker = spawn(DOCKER_HOST=proxy.host)
    standby = one_standby(worker.pid)
    proxy.hold("start")
    job = pool.enqueue(IMAGE, ["sh", "-c", "sleep 1"])
    try:
        eventually(proxy.held.is_set, timeout=30, message="the job's start is held at the daemon")
        assert [c.status for c in dclient.containers.list(
            all=True, filters={"label": f"jobpool.job_id={job.id}"})] == ["created"]
        assert children(worker.pid) == [standby], "no standby forked while the job is not running yet"
    finally:
        proxy.release()
    kids = eventually(lambda: len(children(worker.pid)) == 2 and children(worker.pid), timeout=20,
                      message="the next standby forked once the job runs")
    assert standby in kids
    assert pool.wait(job.id, timeout=30).state is JobState.SUCCEEDED


def test_rqs_record_of_the_worker_after_jobs_whose_horses_said_done_early(
        sub_pool: Pool, spawn: Callable[..., JobpoolProcess]) -> None:
    """A horse whose job ended tells its worker before it deletes RQ's record of the delivery, and leaves the
    worker's current-job field to the worker: cleared as it goes idle, counted all the same."""
    worker = spawn(**SUB)
    one_standby(worker.pid)
    for _ in range(3):
        assert sub_pool.wait(sub_pool.enqueue("ignored", ["true"]).id, timeout=30).state is JobState.SUCCEEDED
    workers = f"rq:workers:{sub_pool.keys.rq_queue_name}"
    (key,) = [cast(str, k) for k in sub_pool.store.client.smembers(workers)]

    def books() -> dict[str, str]:
        return cast("dict[str, str]",
                    sub_pool.store.client.hgetall(f"rq:worker:{key.removeprefix('rq:worker:')}"))

    record = eventually(lambda: (b := books()).get("successful_job_count") == "3" and b, timeout=10,
                        message="RQ counted the three deliveries")
    assert record["state"] == "idle"
    assert "current_job" not in record, record


def test_rqs_records_of_a_running_job_are_renewed_at_rqs_period_not_at_each_wake(
        sub_pool: Pool, spawn: Callable[..., JobpoolProcess], tmp_path: Path) -> None:
    """RQ's monitor wakes every second (the drain bound), and used to renew RQ's records at each wake: a
    transaction per running job per second. They are renewed every `RQ_RENEW_SECS` now (RQ's working time
    with them), and stay alive meanwhile: the worker's hash, and the delivery in RQ's started registry."""
    worker = spawn(**SUB, JOBPOOL_HEARTBEAT_SECS="0.5")
    one_standby(worker.pid)
    job_id, go = gated(sub_pool, tmp_path)
    eventually(lambda: sub_pool.get(job_id).identity, timeout=20, message="the job was launched")
    client = sub_pool.store.client
    (key,) = [cast(str, k) for k in client.smembers(f"rq:workers:{sub_pool.keys.rq_queue_name}")]
    beats: set[str] = set()

    def beat_seen() -> bool:  # jobpool's own lease renewal, every 0.5 s: a clock the worker keeps
        beats.add(cast(str, client.hget(sub_pool.keys.job(job_id), "heartbeat_at")))
        return len(beats) >= 6

    eventually(beat_seen, timeout=30, message="six of the job's own heartbeats: its horse ran 2.5 s or more")
    assert float(cast(str, client.hget(key, "current_job_working_time")) or 0) == 0, \
        "RQ's working time not written at each of the monitor's wakes"
    assert client.ttl(key) > 0, "the worker's hash lives on"
    started = f"rq:wip:{sub_pool.keys.rq_queue_name}"
    assert any(m.startswith(job_id) for m in cast("list[str]", client.zrange(started, 0, -1))), \
        "the delivery is in RQ's started registry"
    assert min(cast("list[tuple[str, float]]", client.zrange(started, 0, -1, withscores=True)),
               key=lambda m: m[1])[1] > time.time(), "and not expired there"
    go.touch()
    assert sub_pool.wait(job_id, timeout=30).state is JobState.SUCCEEDED


def test_a_suspended_worker_takes_no_job_until_resumed(sub_pool: Pool, spawn: Callable[..., JobpoolProcess],
                                                       tmp_path: Path) -> None:
    """RQ's suspension (`rq suspend`) is checked between two jobs, in the round trip that sets the worker
    idle: the worker that finished a job takes no other until RQ's workers are resumed."""
    sub_pool.set_slots(2)
    worker = spawn(**SUB)
    first, go = gated(sub_pool, tmp_path)
    eventually(lambda: sub_pool.get(first).identity, timeout=20, message="the first job runs")
    suspend(sub_pool.store.client)
    try:
        second = sub_pool.enqueue("ignored", ["true"])
        go.touch()
        assert sub_pool.wait(first, timeout=30).state is JobState.SUCCEEDED
        workers = f"rq:workers:{sub_pool.keys.rq_queue_name}"
        eventually(lambda: [k for k in sub_pool.store.client.smembers(workers)
                            if sub_pool.store.client.hget(k, "state") == "suspended"],
                   timeout=20, message="the worker saw the suspension")
        assert sub_pool.get(second.id).state is not JobState.SUCCEEDED
        assert not sub_pool.get(second.id).owner_boot, "not claimed while suspended"
    finally:
        resume(sub_pool.store.client)
    assert sub_pool.wait(second.id, timeout=30).state is JobState.SUCCEEDED
    assert worker.proc.poll() is None


def test_rqs_record_of_an_ended_delivery_is_deleted(sub_pool: Pool,
                                                    spawn: Callable[..., JobpoolProcess]) -> None:
    job = sub_pool.enqueue("ignored", ["true"])
    spawn(**SUB)
    assert sub_pool.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    c = sub_pool.store.client
    started = f"rq:wip:{sub_pool.keys.rq_queue_name}"

    def gone() -> bool:
        return (not c.exists(sub_pool.keys.rq_job(job.id), f"rq:executions:{job.id}")
                and not list(c.scan_iter(match=f"rq:execution:{job.id}:*"))
                and not [m for m in cast("list[str]", c.zrange(started, 0, -1)) if m.startswith(job.id)])

    eventually(gone, timeout=10, message="RQ's job hash, executions and started entry deleted")


def test_a_stopped_worker_leaves_no_standby(sub_pool: Pool, spawn: Callable[..., JobpoolProcess]) -> None:
    worker = spawn(**SUB)
    standby = one_standby(worker.pid)
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    assert state_of(standby) == "", "the worker waited for its standby (reaped, not left a zombie)"


def test_a_sigkilled_workers_standby_exits_by_itself(sub_pool: Pool,
                                                     spawn: Callable[..., JobpoolProcess]) -> None:
    worker = spawn(**SUB)
    standby = one_standby(worker.pid)
    worker.signal(signal.SIGKILL)
    worker.wait(10)
    eventually(lambda: exited(standby), timeout=10, message="the standby read the end of its pipe and exited")


def test_a_dead_standby_is_replaced_by_rqs_fork(sub_pool: Pool, spawn: Callable[..., JobpoolProcess],
                                                tmp_path: Path) -> None:
    worker = spawn(**SUB)
    standby = one_standby(worker.pid)
    os.kill(standby, signal.SIGKILL)
    eventually(lambda: state_of(standby) == "Z", timeout=10, message="the standby died")
    job_id, go = gated(sub_pool, tmp_path)
    go.touch()
    assert sub_pool.wait(job_id, timeout=30).state is JobState.SUCCEEDED
    eventually(lambda: state_of(standby) == "", timeout=10, message="the dead standby was reaped")
    fresh = one_standby(worker.pid)
    assert fresh != standby
    assert worker.proc.poll() is None


def test_a_horse_killed_mid_job_is_read_from_its_exit_and_the_worker_goes_on(
        sub_pool: Pool, spawn: Callable[..., JobpoolProcess], tmp_path: Path) -> None:
    sub_pool.set_slots(2)
    worker = spawn(**SUB)
    horse = one_standby(worker.pid)
    job_id, go = gated(sub_pool, tmp_path)
    job = eventually(lambda: children(horse), timeout=20, message="the job runs under the standby")
    try:
        # It never says it is done: the worker waits for its exit, and reaps it.
        os.kill(horse, signal.SIGKILL)
        eventually(lambda: state_of(horse) == "", timeout=10, message="the killed horse was reaped")
        nxt = sub_pool.enqueue("ignored", ["true"])
        assert sub_pool.wait(nxt.id, timeout=30).state is JobState.SUCCEEDED
        assert worker.proc.poll() is None
        assert sub_pool.get(job_id).state is JobState.RUNNING, "the killed job's slot: the supervisor's"
    finally:
        go.touch()  # the job's own process outlived its horse: let it end
    eventually(lambda: all(exited(pid) for pid in job), timeout=10, message="the orphaned job process ended")


def killed_if_left(pid: int) -> None:
    """Test cleanup: a process the test stopped, should the worker have left it (SIGKILL, by pid)."""
    if state_of(pid) not in ("", "Z"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def claims(pool: Pool, job_id: str) -> int:
    return [e["reason"] for e in pool.events(job_id)].count("claimed")


def test_a_stopped_idle_standby_is_killed_and_its_job_runs_once_in_a_fresh_horse(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    """A standby stopped while it waits never reads the job written to its pipe. The worker takes the hand-off
    only on the standby's word that it took the job: without one within the deadline, it kills and reaps the
    standby (which did nothing with the job: it says so first) and hands the same delivery to RQ's own fork at
    once. A one-worker pool used to wedge here, `status` saying healthy."""
    worker = spawn()
    standby = one_standby(worker.pid)
    os.kill(standby, signal.SIGSTOP)
    try:
        eventually(lambda: state_of(standby) == "T", timeout=10, message="the standby is stopped")
        job = pool.enqueue(IMAGE, ["true"])
        done = pool.wait(job.id, timeout=HANDOFF_ACK_SECS + 20)
        assert state_of(standby) == "", "the stopped standby was killed and reaped by its worker"
    finally:
        killed_if_left(standby)
    assert done.state is JobState.SUCCEEDED, worker.log()[-3000:]
    assert (done.attempt, done.recovery_attempts, claims(pool, job.id)) == (1, 0, 1), "one delivery, once"
    assert "did not take its job" in worker.log()
    fresh = one_standby(worker.pid)
    assert fresh != standby
    nxt = pool.enqueue(IMAGE, ["true"])
    assert pool.wait(nxt.id, timeout=30).state is JobState.SUCCEEDED
    assert worker.proc.poll() is None


def test_a_stopped_running_horse_makes_its_worker_stuck_until_killed_past_the_lease(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    """A horse stopped while its job runs renews its lease no more. Its worker is stuck meanwhile, and
    `status` counts it so (a one-worker pool: unhealthy). Once the horse has been stopped for the lease, the
    worker kills it and takes work again: first the supervisor's request to adopt that very job's container
    (still running), then the next job."""
    lease = {"JOBPOOL_LEASE_SECS": "4"}
    spawn(module="jobpool.cli", args=("supervisor",), **lease)
    worker = spawn(**lease)
    horse = one_standby(worker.pid)
    eventually(lambda: pool.status().healthy, timeout=30, message="a healthy one-worker pool")
    job = pool.enqueue(IMAGE, ["sh", "-c", "sleep 12"])
    eventually(lambda: len(children(worker.pid)) == 2, timeout=30,
               message="the job runs (its horse said so: the next standby is forked)")
    os.kill(horse, signal.SIGSTOP)
    try:
        def stuck() -> StatusReport | None:
            r = pool.status()
            return r if not r.healthy and r.workers is not None and r.workers.boots[0].stuck else None

        report = eventually(stuck, timeout=10, message="status: the worker stuck, the pool unhealthy")
        assert report.workers is not None and report.workers.boots[0].stuck == f"horse {horse} is stopped"
        assert ("fewer live workers than slots: 0 ready for 1 slot (1 stuck on its horse)"
                in report.health.reasons)
        eventually(lambda: state_of(horse) == "", timeout=4 + 10,
                   message="the worker killed its stopped horse past the lease, and reaped it")
    finally:
        killed_if_left(horse)
    assert pool.wait(job.id, timeout=40).state is JobState.SUCCEEDED, worker.log()[-3000:]
    eventually(lambda: pool.status().healthy, timeout=10, message="healthy again")
    nxt = pool.enqueue(IMAGE, ["true"])
    assert pool.wait(nxt.id, timeout=30).state is JobState.SUCCEEDED
    assert worker.proc.poll() is None


@pytest.fixture
def dropper(redis_server: RedisServer, redis_url: str) -> Iterator[RedisReplyDropper]:
    proxy = RedisReplyDropper(redis_server.port)
    yield proxy
    proxy.close()


def test_a_standby_stopped_after_taking_its_job_before_its_claim(
        sub_pool: Pool, spawn: Callable[..., JobpoolProcess], tmp_path: Path,
        dropper: RedisReplyDropper) -> None:
    """Stopped once it said it took the job, its claim sent but never run (a proxy in front of Redis keeps
    it): it is its worker's horse, killed once stopped for the lease as any horse. Nothing was claimed, so the
    supervisor dispatches the job again past the claim grace (a new attempt), and the same worker runs it,
    once."""
    marker = tmp_path / "ran"
    spawn(module="jobpool.cli", args=("supervisor",), **SUB)  # on Redis directly
    worker = spawn(JOBPOOL_REDIS_URL=dropper.url, **SUB)
    standby = one_standby(worker.pid)
    claim = hashlib.sha1(script_text("claim").encode()).hexdigest()
    dropper.swallow(claim, then=lambda: os.kill(standby, signal.SIGSTOP))
    job = sub_pool.enqueue("ignored", ["sh", "-c", f'echo "$JOBPOOL_ATTEMPT" >> {marker}'])
    try:
        done = sub_pool.wait(job.id, timeout=40)
        assert state_of(standby) == "", "the stopped horse was killed and reaped by its worker"
    finally:
        killed_if_left(standby)
    assert done.state is JobState.SUCCEEDED, worker.log()[-3000:]
    assert (done.attempt, claims(sub_pool, job.id)) == (2, 1), "dispatched again, claimed once"
    assert marker.read_text().split() == ["2"], "the job ran once"
    assert "redispatched" in [e["reason"] for e in sub_pool.events(job.id)]
    nxt = sub_pool.enqueue("ignored", ["true"])
    assert sub_pool.wait(nxt.id, timeout=20).state is JobState.SUCCEEDED
    assert worker.proc.poll() is None


def test_a_worker_whose_running_horse_is_stopped_still_drains_within_its_bound(
        sub_pool: Pool, spawn: Callable[..., JobpoolProcess], tmp_path: Path) -> None:
    """The drain's bound holds for a stopped horse (its lease long here, so the drain, not the stop, ends
    it): killed past the drain timeout and its margin, reaped, and the worker exits; the job is left
    running (its process, in a session of its own, outlives its horse)."""
    worker = spawn(JOBPOOL_LEASE_SECS="60", **SUB)
    horse = one_standby(worker.pid)
    job_id, go = gated(sub_pool, tmp_path)
    job = eventually(lambda: children(horse), timeout=20, message="the job runs under the standby")
    try:
        os.kill(horse, signal.SIGSTOP)
        eventually(lambda: state_of(horse) == "T", timeout=10, message="the horse is stopped")
        worker.signal(signal.SIGTERM)
        worker.wait(3 + 5 + 15)  # JOBPOOL_DRAIN_TIMEOUT_SECS (FAST_ENV), rqworker.HORSE_MARGIN_SECS, slack
        assert state_of(horse) == "", "the stopped horse was killed and reaped"
        assert sub_pool.get(job_id).state is JobState.RUNNING, "left running: the supervisor's"
    finally:
        killed_if_left(horse)
        go.touch()
    eventually(lambda: all(exited(pid) for pid in job), timeout=10, message="the orphaned job process ended")
