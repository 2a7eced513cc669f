"""A user's pause, then a resume before the job has stopped, with a real worker and real containers.

The watcher has already sent SIGTERM for the pause when the resume withdraws the request
(jobpool/scripts/resume_job.lua). The job must never end failed for it: a job that checkpoints and exits 75
is handed back to its place in the queue (checkpoint kept) and runs on from it; a job that does not stop on
SIGTERM is not SIGKILLed at the stop grace and runs to its own end.

Each job waits inside the container for a file the test creates with `docker exec`, so the resume always
lands after the SIGTERM and before the exit, whatever the machine's speed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import cast

import docker
import pytest

from jobpool import Job, JobState, Pool
from tests.support.constants import IMAGE
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess

#: The workers' stop grace here (the tests' default is 2 s): the resume must reach the watcher before the
#: grace ends, through a heartbeat, which a loaded host can delay by more than 2 s.
STOP_GRACE_SECS = 5.0

#: Checkpoints on SIGTERM and exits 75 once /tmp/go exists; a run that finds the checkpoint exits 0.
CHECKPOINTS_ON_GO = r"""
ck="$JOBPOOL_CHECKPOINT_DIR/ck"
trap 'echo step > "$ck"; echo stopping; while [ ! -f /tmp/go ]; do sleep 0.05; done; exit 75' TERM
if [ -f "$ck" ]; then echo "resumed with $(cat "$ck")"; exit 0; fi
echo started; while true; do sleep 0.1; done
"""
#: Notes SIGTERM and carries on; ends (exit 0) once /tmp/go exists.
CARRIES_ON = r"""
trap 'echo term-ignored' TERM
echo started; while [ ! -f /tmp/go ]; do sleep 0.1; done; echo finished
"""


@pytest.fixture
def client(docker_host: str) -> Iterator[docker.DockerClient]:
    c = docker.DockerClient(base_url=docker_host)
    yield c
    c.close()


def live_container(client: docker.DockerClient, pool: Pool, job_id: str,
                   text: bytes) -> docker.models.containers.Container:
    """The job's recorded container once its output holds `text`."""
    def ready() -> docker.models.containers.Container | None:
        cid = pool.get(job_id).container_id
        if not cid:
            return None
        c = client.containers.get(cid)
        return c if text in c.logs() else None
    return eventually(ready, timeout=30, ignoring=(docker.errors.NotFound,),
                      message=f"container printed {text!r}")


def failed_events(pool: Pool, job_id: str) -> list[dict[str, str]]:
    return [e for e in pool.events(job_id) if e["to"] == "failed"]


def test_checkpointing_job_paused_then_resumed_before_it_exits_is_handed_back(
        pool: Pool, spawn: Callable[..., JobpoolProcess], client: docker.DockerClient) -> None:
    job = pool.enqueue(IMAGE, ["sh", "-c", CHECKPOINTS_ON_GO])
    spawn(JOBPOOL_STOP_GRACE_SECS=str(STOP_GRACE_SECS))
    first = live_container(client, pool, job.id, b"started")
    pool.pause(job.id)
    live_container(client, pool, job.id, b"stopping")  # the watcher's SIGTERM arrived; it checkpointed
    resumed = pool.resume(job.id)
    assert resumed is not None
    assert resumed.state == JobState.RUNNING and not resumed.pause_requested  # withdrawn, not yet stopped
    first.exec_run(["touch", "/tmp/go"])  # now it exits 75
    done = pool.wait(job.id, timeout=60)
    assert not failed_events(pool, job.id), failed_events(pool, job.id)
    handed = [e for e in pool.events(job.id) if (e["from"], e["to"]) == ("running", "queued")]
    assert [e["reason"] for e in handed] == ["pause_withdrawn_handback"]
    assert (done.state, done.attempt, done.recovery_attempts) == (JobState.SUCCEEDED, 2, 0)
    assert "resumed with step" in pool.logs(job.id), "the checkpoint was kept for the next attempt"


def test_job_carrying_on_after_sigterm_is_not_killed_once_the_pause_is_withdrawn(
        pool: Pool, spawn: Callable[..., JobpoolProcess], client: docker.DockerClient) -> None:
    job = pool.enqueue(IMAGE, ["sh", "-c", CARRIES_ON])
    spawn(JOBPOOL_STOP_GRACE_SECS=str(STOP_GRACE_SECS))
    container = live_container(client, pool, job.id, b"started")
    pool.pause(job.id)
    live_container(client, pool, job.id, b"term-ignored")  # the SIGTERM arrived; the SIGKILL is pending
    signalled = time.monotonic()
    assert cast(Job, pool.resume(job.id)).state == JobState.RUNNING
    # Through the stop grace and well past it, the container keeps running: the SIGKILL was called off.
    while time.monotonic() < signalled + STOP_GRACE_SECS + 2.0:
        container.reload()
        assert container.status == "running", (container.status, container.attrs["State"].get("ExitCode"))
        time.sleep(0.1)
    container.exec_run(["touch", "/tmp/go"])
    done = pool.wait(job.id, timeout=30)
    assert not failed_events(pool, job.id), failed_events(pool, job.id)
    assert (done.state, done.exit_code, done.attempt) == (JobState.SUCCEEDED, 0, 1)
    assert "finished" in pool.logs(job.id)
