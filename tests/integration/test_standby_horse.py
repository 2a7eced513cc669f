"""The standby horse (jobpool/workers/horses.py): a worker keeps one horse forked ahead of its next job, the
job runs in it, the next one is forked once the job runs (not while it is launched); a standby never
outlives its worker (stopped or SIGKILLed), and one that died is replaced by RQ's own fork. And RQ's record
of an ended delivery goes, while RQ's record of the worker stays right (idle, no current job, its counts)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from constants import IMAGE, SUB
from polling import eventually
from procs import children, state_of
from proxies import DockerLaunchHold
from rq.suspension import resume, suspend

from jobpool import JobState, Pool


def exited(pid: int) -> bool:
    """Gone, or a zombie left to whichever process adopted it."""
    return state_of(pid) in ("", "Z")


def one_standby(worker_pid: int) -> int:
    """The worker's only child once it is idle: its standby horse."""
    kids = eventually(lambda: len(children(worker_pid)) == 1 and children(worker_pid), timeout=20,
                      message="the idle worker has one child, its standby horse")
    return kids[0]


def gated(pool: Pool, tmp_path: Path) -> tuple[str, Path]:
    """A job that runs until `go` exists: its id and that path."""
    go = tmp_path / "go"
    job = pool.enqueue("ignored", ["sh", "-c", f"while [ ! -f {go} ]; do sleep 0.05; done; echo done"])
    return job.id, go


def test_the_job_runs_in_the_standby_and_the_next_standby_is_forked_meanwhile(
        sub_pool: Pool, spawn, tmp_path: Path) -> None:
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


def test_the_next_standby_is_forked_only_once_the_job_runs(pool: Pool, spawn, proxy: DockerLaunchHold,
                                                             dclient) -> None:
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


def test_rqs_record_of_the_worker_after_jobs_whose_horses_said_done_early(sub_pool: Pool, spawn) -> None:
    """A horse whose job ended tells its worker before it deletes RQ's record of the delivery, and leaves the
    worker's current-job field to the worker: cleared as it goes idle, counted all the same."""
    worker = spawn(**SUB)
    one_standby(worker.pid)
    for _ in range(3):
        assert sub_pool.wait(sub_pool.enqueue("ignored", ["true"]).id, timeout=30).state is JobState.SUCCEEDED
    (key,) = [k for k in sub_pool.client.smembers(f"rq:workers:{sub_pool.keys.rq_queue_name}")]

    def books() -> dict[str, str]:
        return sub_pool.client.hgetall(f"rq:worker:{key.removeprefix('rq:worker:')}")

    record = eventually(lambda: (b := books()).get("successful_job_count") == "3" and b, timeout=10,
                        message="RQ counted the three deliveries")
    assert record["state"] == "idle"
    assert "current_job" not in record, record


def test_a_suspended_worker_takes_no_job_until_resumed(sub_pool: Pool, spawn, tmp_path: Path) -> None:
    """RQ's suspension (`rq suspend`) is checked between two jobs, in the round trip that sets the worker
    idle: the worker that finished a job takes no other until RQ's workers are resumed."""
    sub_pool.set_slots(2)
    worker = spawn(**SUB)
    first, go = gated(sub_pool, tmp_path)
    eventually(lambda: sub_pool.get(first).identity, timeout=20, message="the first job runs")
    suspend(sub_pool.client)
    try:
        second = sub_pool.enqueue("ignored", ["true"])
        go.touch()
        assert sub_pool.wait(first, timeout=30).state is JobState.SUCCEEDED
        workers = f"rq:workers:{sub_pool.keys.rq_queue_name}"
        eventually(lambda: [k for k in sub_pool.client.smembers(workers)
                            if sub_pool.client.hget(k, "state") == "suspended"],
                   timeout=20, message="the worker saw the suspension")
        assert sub_pool.get(second.id).state is not JobState.SUCCEEDED
        assert not sub_pool.get(second.id).owner_boot, "not claimed while suspended"
    finally:
        resume(sub_pool.client)
    assert sub_pool.wait(second.id, timeout=30).state is JobState.SUCCEEDED
    assert worker.proc.poll() is None


def test_rqs_record_of_an_ended_delivery_is_deleted(sub_pool: Pool, spawn) -> None:
    job = sub_pool.enqueue("ignored", ["true"])
    spawn(**SUB)
    assert sub_pool.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    c = sub_pool.client
    started = f"rq:wip:{sub_pool.keys.rq_queue_name}"

    def gone() -> bool:
        return (not c.exists(sub_pool.keys.rq_job(job.id), f"rq:executions:{job.id}")
                and not list(c.scan_iter(match=f"rq:execution:{job.id}:*"))
                and not [m for m in c.zrange(started, 0, -1) if m.startswith(job.id)])

    eventually(gone, timeout=10, message="RQ's job hash, executions and started entry deleted")


def test_a_stopped_worker_leaves_no_standby(sub_pool: Pool, spawn) -> None:
    worker = spawn(**SUB)
    standby = one_standby(worker.pid)
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    assert state_of(standby) == "", "the worker waited for its standby (reaped, not left a zombie)"


def test_a_sigkilled_workers_standby_exits_by_itself(sub_pool: Pool, spawn) -> None:
    worker = spawn(**SUB)
    standby = one_standby(worker.pid)
    worker.signal(signal.SIGKILL)
    worker.wait(10)
    eventually(lambda: exited(standby), timeout=10, message="the standby read the end of its pipe and exited")


def test_a_dead_standby_is_replaced_by_rqs_fork(sub_pool: Pool, spawn, tmp_path: Path) -> None:
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
        sub_pool: Pool, spawn, tmp_path: Path) -> None:
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
