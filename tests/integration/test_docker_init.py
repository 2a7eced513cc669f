"""Job containers run with an init process (Docker's tini) as PID 1, so a job's command gets the stop signal
as it would outside a container: `sh -c 'sleep 30'` paused ends at once, of the SIGTERM. Without init the
command is PID 1, where the kernel drops a signal it has no handler for: only the SIGKILL after the stop
grace ends it. The CLI's `enqueue --no-init` asks for the latter."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import docker
import pytest

from jobpool import JobState, Pool
from tests.support.constants import IMAGE
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess

SLEEPER = ["sh", "-c", "sleep 30"]


@pytest.fixture
def client(docker_host: str) -> Iterator[docker.DockerClient]:
    c = docker.DockerClient(base_url=docker_host)
    yield c
    c.close()


def _running_container(client: docker.DockerClient, job_id: str) -> Any:
    def found() -> Any:
        running = client.containers.list(filters={"label": f"jobpool.job_id={job_id}", "status": "running"})
        return running[0] if running else None
    return eventually(found, timeout=30, message="the job's container runs")


def test_a_paused_job_stops_of_its_sigterm_within_the_stop_grace(
        pool: Pool, spawn: Callable[..., JobpoolProcess], client: docker.DockerClient) -> None:
    spawn(JOBPOOL_STOP_GRACE_SECS="60")  # a SIGKILL would come long after the job's own end
    job = pool.enqueue(IMAGE, SLEEPER)
    container = _running_container(client, job.id)
    assert container.attrs["HostConfig"]["Init"] is True
    asked = time.monotonic()
    pool.pause(job.id)
    done = pool.wait(job.id, timeout=20, states=[JobState.PAUSED, JobState.SUCCEEDED, JobState.FAILED])
    assert done.state == JobState.PAUSED, (done.state, done.exit_code, done.error_reason)
    assert done.exit_code == 128 + 15, "ended by the SIGTERM, not by a SIGKILL"
    assert time.monotonic() - asked < 20


def test_without_init_the_command_is_pid_1_and_ignores_sigterm(
        pool: Pool, spawn: Callable[..., JobpoolProcess], client: docker.DockerClient) -> None:
    spawn(JOBPOOL_STOP_GRACE_SECS="2")
    job = pool.enqueue(IMAGE, SLEEPER, init=False)
    container = _running_container(client, job.id)
    assert not container.attrs["HostConfig"].get("Init")
    asked = time.monotonic()
    pool.pause(job.id)
    done = pool.wait(job.id, timeout=20, states=[JobState.PAUSED, JobState.SUCCEEDED, JobState.FAILED])
    assert done.state == JobState.PAUSED, (done.state, done.exit_code, done.error_reason)
    assert done.exit_code == 128 + 9, "only the SIGKILL after the stop grace ended it"
    assert time.monotonic() - asked >= 2


@pytest.mark.parametrize(("flags", "init"), [((), True), (("--no-init",), False)])
def test_the_cli_enqueues_with_init_unless_told_not_to(pool: Pool, pool_env: dict[str, str],
                                                       flags: tuple[str, ...], init: bool) -> None:
    enq = subprocess.run([sys.executable, "-m", "jobpool.cli", "enqueue", *flags, IMAGE, "--", *SLEEPER],
                         env={**os.environ, **pool_env}, capture_output=True, text=True, timeout=30,
                         check=False)
    assert enq.returncode == 0, enq.stderr
    assert pool.get(enq.stdout.strip()).spec.init is init
