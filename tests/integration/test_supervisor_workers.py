"""The supervisor with real workers killed mid-job (SIGKILL of the worker and its work horse).

The wedge, and its cure: a job whose worker died without finishing keeps its slot until a
sweep judges it from ground truth: its container gone (the row ends, the next job runs) or still running
(a live worker adopts it and finishes it from the container's real exit code, and only then does the
next job run).
"""

from __future__ import annotations

from collections.abc import Callable

import docker

from jobpool import JobState, Pool
from jobpool.supervisor import Supervisor
from tests.support.constants import IMAGE
from tests.support.job_containers import containers, started
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess


def test_killed_worker_container_gone_fails_the_job_and_the_next_runs(
        pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess], dclient: docker.DockerClient) -> None:
    pool = Pool.from_env(env={**pool_env, "JOBPOOL_RECOVERY_BUDGET": "0"})
    sup = Supervisor(pool.store)
    try:
        a = pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 60"])
        b = pool.enqueue(IMAGE, ["sh", "-c", "exit 0"])
        w = spawn()
        eventually(lambda: started(dclient, a.id), timeout=30, message="A started")
        w.kill_with_children()
        for c in containers(dclient, a.id):
            c.remove(force=True)
        eventually(lambda: not pool.store.client.exists(pool.keys.lease(a.id)), timeout=10,
                   message="lease lapsed")
        assert pool.get(b.id).state is JobState.QUEUED, "the wedge: B waits behind a dead job"

        sup.sweep()

        job_a = pool.get(a.id)
        assert (job_a.state, job_a.error_reason) == (JobState.FAILED, "orphan_reconciled_no_container")
        assert pool.get(b.id).state is JobState.RUNNING
        spawn()
        assert pool.wait(b.id, timeout=60).state is JobState.SUCCEEDED
    finally:
        sup.close()
        pool.store.client.close()


def test_killed_worker_live_container_is_adopted_and_finished_from_its_exit_code(
        pool: Pool, spawn: Callable[..., JobpoolProcess], dclient: docker.DockerClient,
        sup: Supervisor) -> None:
    a = pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 8; exit 0"])
    b = pool.enqueue(IMAGE, ["sh", "-c", "exit 0"])
    w = spawn()
    eventually(lambda: started(dclient, a.id), timeout=30, message="A started")
    first_owner = pool.get(a.id).owner_boot
    w.kill_with_children()
    eventually(lambda: not pool.store.client.exists(pool.keys.lease(a.id)), timeout=10,
               message="lease lapsed")

    for _ in range(3):  # no live worker yet: the slot is kept, adoption asked once
        report = sup.sweep()
        assert report.verdicts == {"adopt": 1}
        assert pool.get(a.id).state is JobState.RUNNING and pool.get(b.id).state is JobState.QUEUED
    assert [c.status for c in containers(dclient, a.id)] == ["running"]

    spawn()
    eventually(lambda: pool.get(a.id).owner_boot not in ("", first_owner), timeout=30, message="adopted")
    assert sup.sweep().verdicts == {"keep": 1}  # its new owner holds the lease
    assert pool.get(b.id).state is JobState.QUEUED

    done = pool.wait(a.id, timeout=60)
    assert (done.state, done.exit_code) == (JobState.SUCCEEDED, 0)
    assert "adopted" in [e["reason"] for e in pool.events(a.id)]
    assert pool.wait(b.id, timeout=60).state is JobState.SUCCEEDED
