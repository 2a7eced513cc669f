"""An error of the worker's own host before a job starts is not the job's (docs/architecture.md,
"Workers", "Host faults").

`JOBPOOL_CHECKPOINT_ROOT` turns read-only (NFS and CephFS remount so on errors): here a directory really
bound onto itself and remounted `ro`, under a real worker process on the real test dockerd, with a real
supervisor sweeping. The worker's makedirs of the job's directory fails EROFS before anything is sent to the
daemon, so the job goes back to the queue at its place with its recovery budget intact; the worker holds its
claims while the root is unusable and its boot record says why (`jobpool status`); once the root is
writable again it claims, and the job runs and succeeds. Before this, the error escaped the work horse: the
row stayed claimed with no container, and the sweep spent the job's recovery budget on it, then failed it
`orphan_reconciled_no_container`.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from jobpool import JobState, Pool
from jobpool.status import Worker
from tests.support.constants import IMAGE
from tests.support.mounts import bound
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.servers import DockerDaemon

#: Writes its checkpoint, so it succeeds only where its checkpoint directory is writable.
WRITES_ITS_CHECKPOINT = 'echo done > "$JOBPOOL_CHECKPOINT_DIR/step" && echo wrote its checkpoint'
#: How long the held worker is watched not claiming (several of its probes: workers/hostcheck.py).
HELD_SECS = 3.0


def claims(pool: Pool, job_id: str) -> list[dict[str, str]]:
    return [e for e in pool.events(job_id) if e["reason"] == "claimed"]


def handbacks(pool: Pool, job_id: str) -> list[dict[str, str]]:
    return [e for e in pool.events(job_id) if (e["from"], e["to"]) == ("running", "queued")]


def held_by(pool: Pool, boot_id: str) -> str:
    """Why the worker holds its claims, as `status` shows it ('' when it does not)."""
    return next((w.cannot_claim for w in boots_of(pool) if w.id == boot_id), "")


def boots_of(pool: Pool) -> tuple[Worker, ...]:
    workers = pool.status().workers
    assert workers is not None, "a pool's status counts its workers"
    return workers.boots


def test_a_read_only_checkpoint_root_hands_the_job_back_and_holds_the_worker_until_it_is_writable(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str, tmp_path: Path) -> None:
    pool.set_slots(1)
    with bound(tmp_path / "checkpoints") as root:
        # Probed at boot, then not again while it passes: the root turns read-only between two probes.
        worker = spawn(JOBPOOL_CHECKPOINT_ROOT=str(root.path), JOBPOOL_RECOVERY_BUDGET="1",
                       JOBPOOL_HOST_CHECK_SECS="3600")
        spawn(module="jobpool.cli", args=("supervisor",), JOBPOOL_RECOVERY_BUDGET="1")
        first = pool.enqueue(IMAGE, ["sh", "-c", WRITES_ITS_CHECKPOINT])
        assert pool.wait(first.id, timeout=60).state is JobState.SUCCEEDED, worker.log()[-3000:]
        boot_id = claims(pool, first.id)[0]["actor"]

        root.read_only()
        job = pool.enqueue(IMAGE, ["sh", "-c", WRITES_ITS_CHECKPOINT])
        try:
            (back, *more) = eventually(lambda: handbacks(pool, job.id), timeout=30,
                                       message="handed back after the host fault")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nrow: {pool.get(job.id)}\nevents: {pool.events(job.id)}\n"
                                 f"worker: {worker.log()[-3000:]}") from None
        assert not more and back["reason"] == "host_fault: checkpoint root", pool.events(job.id)
        assert "Read-only file system" in back["evidence"], back
        assert pool.get(job.id).recovery_attempts == 0
        assert "Read-only file system" in worker.log() and "handing the job back" in worker.log()

        problem = eventually(lambda: held_by(pool, boot_id), timeout=15, message="status says it holds")
        assert str(root.path) in problem and "Read-only file system" in problem, problem
        health = pool.health()
        assert not health.healthy and any("not claiming" in r for r in health.reasons), health
        assert any(boot_id in w and "Read-only file system" in w for w in health.warnings), health

        # Held: the job, promoted again at its place, waits unclaimed while the root stays read-only.
        until = time.monotonic() + HELD_SECS
        while time.monotonic() < until:
            row = pool.get(job.id)
            assert len(claims(pool, job.id)) == 1 and row.owner_boot == "", (row, pool.events(job.id))
            assert row.recovery_attempts == 0 and row.state in (JobState.QUEUED, JobState.RUNNING), row
            time.sleep(0.1)

        root.writable()
        done = pool.wait(job.id, timeout=60)
        assert done.state is JobState.SUCCEEDED, (done, pool.events(job.id), worker.log()[-3000:])
        assert done.recovery_attempts == 0 and len(claims(pool, job.id)) == 2
        assert "wrote its checkpoint" in pool.logs(job.id)
        eventually(lambda: not held_by(pool, boot_id), timeout=15, message="status says it claims again")
        assert "host check: passes again; claiming" in worker.log()


def test_a_worker_booted_on_a_read_only_checkpoint_root_claims_nothing_until_it_is_writable(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str, tmp_path: Path) -> None:
    """Found by the probe before any job meets it: no claim, no handback, and `status` says why."""
    pool.set_slots(1)
    with bound(tmp_path / "checkpoints") as root:
        root.read_only()
        worker = spawn(JOBPOOL_CHECKPOINT_ROOT=str(root.path))
        job = pool.enqueue(IMAGE, ["sh", "-c", WRITES_ITS_CHECKPOINT])
        boots = eventually(lambda: [w for w in boots_of(pool) if w.cannot_claim], timeout=15,
                           message="status says the worker holds its claims")
        assert "Read-only file system" in boots[0].cannot_claim, boots
        until = time.monotonic() + HELD_SECS
        while time.monotonic() < until:
            assert not claims(pool, job.id), pool.events(job.id)
            time.sleep(0.1)
        worker.signal(signal.SIGTERM)  # a held worker stops as an idle one does
        assert worker.wait(10) == 0, worker.log()[-3000:]
        root.writable()
        spawn(JOBPOOL_CHECKPOINT_ROOT=str(root.path))
        done = pool.wait(job.id, timeout=60)
        assert done.state is JobState.SUCCEEDED and done.attempt == 1, (done, worker.log()[-3000:])


def test_a_docker_daemon_that_refuses_the_create_hands_the_job_back_and_holds_the_worker_until_it_answers(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_daemon: DockerDaemon,
        docker_host: str) -> None:
    """No connection could be made for the create, so nothing of the job exists: handed back, budget intact,
    and the worker pings its daemon before it claims again."""
    pool.set_slots(1)
    worker = spawn(JOBPOOL_RECOVERY_BUDGET="1")
    first = pool.enqueue(IMAGE, ["true"])
    assert pool.wait(first.id, timeout=60).state is JobState.SUCCEEDED, worker.log()[-3000:]
    boot_id = claims(pool, first.id)[0]["actor"]
    docker_daemon.stop()
    try:
        job = pool.enqueue(IMAGE, ["sh", "-c", "echo ran"])
        back = eventually(lambda: handbacks(pool, job.id), timeout=30, message="handed back")
        assert back[0]["reason"] == "host_fault: docker daemon", back
        assert pool.get(job.id).recovery_attempts == 0
        problem = eventually(lambda: held_by(pool, boot_id), timeout=15, message="status says it holds")
        assert "docker daemon" in problem, problem
        until = time.monotonic() + HELD_SECS
        while time.monotonic() < until:
            assert len(claims(pool, job.id)) == 1, pool.events(job.id)
            time.sleep(0.1)
    finally:
        docker_daemon.ensure_running()
    done = pool.wait(job.id, timeout=60)
    assert done.state is JobState.SUCCEEDED and done.recovery_attempts == 0, (done, worker.log()[-3000:])
    assert "ran" in pool.logs(job.id)
    eventually(lambda: not held_by(pool, boot_id), timeout=15, message="status says it claims again")


def test_a_worker_whose_docker_daemon_does_not_answer_takes_no_job_until_it_does(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str, tmp_path: Path) -> None:
    """A worker that cannot establish its daemon's identity (its DOCKER_HOST names a socket
    nothing serves) leaves every delivery where it is, instead of taking it only to drop it before its claim
    (each one then held its slot a claim grace, and a pool of that worker alone wedged while `status` said
    healthy); `status` says why and counts it not ready; once the daemon answers, the job runs."""
    pool.set_slots(1)
    link = tmp_path / "docker.sock"  # nothing there yet: the connection is refused
    spawn(DOCKER_HOST=f"unix://{link}")
    job = pool.enqueue(IMAGE, ["echo", "ran"])
    boots = eventually(lambda: [w for w in boots_of(pool) if w.cannot_claim], timeout=30,
                       message="status says the worker holds its claims")
    assert "identity" in boots[0].cannot_claim, boots
    report = pool.status()
    assert not report.healthy and any("fewer live workers than slots: 0 ready" in r
                                      for r in report.health.reasons), report.health
    until = time.monotonic() + HELD_SECS
    while time.monotonic() < until:  # the delivery stays on RQ's queue: nothing took it
        assert pool.store.client.lrange(pool.keys.rq_queue, 0, -1) == [job.id]
        assert not claims(pool, job.id), pool.events(job.id)
        time.sleep(0.1)
    link.symlink_to(docker_host.removeprefix("unix://"))  # the daemon answers there now
    done = pool.wait(job.id, timeout=60)
    assert (done.state, done.attempt, done.recovery_attempts) == (JobState.SUCCEEDED, 1, 0), done
    assert "ran" in pool.logs(job.id)
    eventually(lambda: not [w for w in boots_of(pool) if w.cannot_claim], timeout=15,
               message="status says it claims again")
