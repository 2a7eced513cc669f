"""A job that keeps no checkpoint (`JobSpec.checkpoint` False): its container gets no
`JOBPOOL_CHECKPOINT_DIR` and no volume, and its handback is not tied to the daemon that ran it (no
checkpoint affinity); a job with the default, run beside it, gets all three. Under the subprocess executor
it runs in an empty directory of its attempt's own, removed once its exit is recorded."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import docker
import pytest

from jobpool import JobState, Pool
from tests.support.constants import IMAGE, SUB
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess

SAYS_DIR = 'echo "dir=${JOBPOOL_CHECKPOINT_DIR:-none}"; echo started; while true; do sleep 0.1; done'


def container(dclient: docker.DockerClient, job_id: str) -> docker.models.containers.Container:
    label = {"label": f"jobpool.job_id={job_id}"}
    return eventually(lambda: [c for c in dclient.containers.list(filters=label) if b"started" in c.logs()],
                      timeout=30, message="the job's container runs")[0]


def volumes_of(dclient: docker.DockerClient, job_id: str) -> list[str]:
    return [v.name for v in dclient.volumes.list() if job_id in (v.name or "")]


def test_no_variable_no_volume_and_no_affinity(pool: Pool, spawn: Callable[..., JobpoolProcess],
                                               dclient: docker.DockerClient) -> None:
    pool.set_slots(2)
    bare = pool.enqueue(IMAGE, ["sh", "-c", SAYS_DIR], checkpoint=False)
    kept = pool.enqueue(IMAGE, ["sh", "-c", SAYS_DIR])
    spawn()
    spawn()
    for job, says, mounts in ((bare, "dir=none", 0), (kept, "dir=/jobpool/checkpoint", 1)):
        c = container(dclient, job.id)
        assert says in c.logs().decode()
        assert len(c.attrs["Mounts"]) == mounts
    assert volumes_of(dclient, bare.id) == []
    assert volumes_of(dclient, kept.id), "the default job's checkpoint volume"
    for job in (bare, kept):
        pool.pause(job.id)
    for job in (bare, kept):
        eventually(lambda j=job: pool.get(j.id).state is JobState.PAUSED, timeout=30, message="paused")
    assert pool.get(bare.id).affinity == "", "nothing of it is on the daemon that ran it"
    assert pool.get(kept.id).affinity, "its checkpoint is on the daemon that ran it"
    for job in (bare, kept):
        pool.cancel(job.id)


@pytest.mark.parametrize(('flags', 'checkpoint'), [((), True), (("--no-checkpoint",), False)])
def test_the_cli_enqueues_with_a_checkpoint_unless_told_not_to(
        pool: Pool, pool_env: dict[str, str], flags: tuple[str, ...], checkpoint: bool) -> None:
    enq = subprocess.run([sys.executable, "-m", "jobpool.cli", "enqueue", *flags, IMAGE, "--", "true"],
                         env={**os.environ, **pool_env}, capture_output=True, text=True, timeout=30,
                         check=False)
    assert enq.returncode == 0, enq.stderr
    assert pool.get(enq.stdout.strip()).spec.checkpoint is checkpoint


def test_a_subprocess_job_without_one_runs_in_a_scratch_directory_of_its_own(
        sub_pool: Pool, spawn: Callable[..., JobpoolProcess], tmp_path: Path) -> None:
    state = tmp_path / "state"
    spawn(**{**SUB, "JOBPOOL_STATE_DIR": str(state)})
    says = 'echo "dir=${JOBPOOL_CHECKPOINT_DIR:-none} cwd=$(pwd) files=$(ls -A | wc -l)"'
    job = sub_pool.enqueue("ignored", ["sh", "-c", says], checkpoint=False)
    assert sub_pool.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    scratch = state / "scratch" / sub_pool.keys.pool / f"{job.id}-a1"
    assert sub_pool.logs(job.id).split() == ["dir=none", f"cwd={scratch}", "files=0"]
    eventually(lambda: not scratch.exists(), timeout=10, message="the scratch directory removed")
    assert not (state / "checkpoints" / sub_pool.keys.pool / job.id).exists()
