"""A host fault before the job started (finish.lua, kind 'handback'), on fakeredis[lua] and a real server:
back to the queue at its place with no recovery budget spent, as a drain's handback; a persisted cancel or
pause still wins; fenced like every finish. And what the executors call a host fault
(jobpool/workers/executors/base.py, HostFault)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import docker
import pytest

from jobpool.errors import InvalidArgument, NotOwner
from jobpool.metrics import read_counters
from jobpool.models import JobState
from jobpool.spec import JobSpec
from jobpool.workers.executors.base import CHECKPOINT_ROOT, DOCKER, STATE_DIR, HostFault, Launch
from jobpool.workers.executors.docker import DockerExecutor
from jobpool.workers.executors.subprocess import SubprocessExecutor
from jobpool.workers.hostcheck import FaultNote
from tests.support.attempts import claim
from tests.support.mounts import bound
from tests.support.pool_helpers import Backend, assert_event, enqueue, last_event, lease, queued_ids, rq_list

REASON = f"host_fault: {CHECKPOINT_ROOT}"


def test_a_host_fault_hands_the_job_back_to_its_place_without_spending_budget(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    first = enqueue(pool)
    later = enqueue(pool)
    att = claim(pool, first.id)
    pool.pause(None)  # keep promotion from taking it straight back
    assert att.finish("handback", reason=REASON, evidence="cannot make /x: [Errno 30] Read-only") == "queued"
    got = pool.get(first.id)
    assert (got.state, got.seq, got.recovery_attempts, got.owner_boot, got.error_reason) == \
        (JobState.QUEUED, first.seq, 0, "", REASON)
    assert queued_ids(pool) == [first.id, later.id] and lease(pool, first.id) is None and rq_list(pool) == []
    assert_event(last_event(pool, first.id), first.id, "running", "queued", REASON,
                 evidence="cannot make /x: [Errno 30] Read-only")
    assert dict(read_counters(pool.store).transitions).get(("queued", "host_fault")) == 1
    pool.resume(None)
    assert pool.get(first.id).attempt == 2 and pool.get(first.id).state is JobState.RUNNING


@pytest.mark.parametrize(("request_", "expected"), [("pause", "paused"), ("cancel", "cancelled")])
def test_a_persisted_request_wins_over_the_handback(backend: Backend, request_: str, expected: str) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    att = claim(pool, job.id)
    (pool.pause if request_ == "pause" else pool.cancel)(job.id)
    assert att.finish("handback", reason=REASON) == expected
    assert pool.get(job.id).recovery_attempts == 0


def test_a_handback_is_fenced_and_needs_a_reason(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    att = claim(pool, job.id)
    with pytest.raises(InvalidArgument):
        att.finish("handback")
    assert att.finish("handback", reason=REASON) == "queued"
    assert att.finish("handback", reason=REASON) == "queued"  # a lost reply sent again: the same answer
    pool.store.client.hset(pool.keys.job(job.id), "finished_by", "")
    with pytest.raises(NotOwner):
        att.finish("handback", reason=REASON)


def launch(checkpoint: bool = True) -> Launch:
    return Launch("p", "j1", 1, "b", JobSpec(image="img", command=("true",), checkpoint=checkpoint))


def test_a_checkpoint_root_that_cannot_be_written_is_a_host_fault_before_any_request(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.write_text("not a directory")  # makedirs fails as on a read-only file system: before any request
    executor = DockerExecutor(docker.DockerClient(base_url="unix:///nonexistent.sock", version="1.41"), "d",
                              checkpoint_root=str(root))
    with pytest.raises(HostFault) as caught:
        executor.launch(launch())
    assert caught.value.what == CHECKPOINT_ROOT and str(root) in caught.value.cause


def test_an_existing_job_directory_on_a_read_only_root_is_a_host_fault(tmp_path: Path) -> None:
    """A later attempt finds its directory there (mkdir answers "exists", not "read-only"): still a fault."""
    with bound(tmp_path / "root") as root:
        (root.path / "p" / "j1").mkdir(parents=True)
        root.read_only()
        executor = DockerExecutor(docker.DockerClient(base_url="unix:///nonexistent.sock", version="1.41"),
                                  "d", checkpoint_root=str(root.path))
        with pytest.raises(HostFault, match="not writable"):
            executor.launch(launch())


def test_a_docker_socket_missing_or_refusing_is_a_host_fault(tmp_path: Path) -> None:
    """No connection could be made, so not a byte of the create reached a daemon: nothing exists."""
    dead = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(dead))  # a socket file nothing listens on: refused
    for url in (f"unix://{tmp_path}/missing.sock", f"unix://{dead}"):
        executor = DockerExecutor(docker.DockerClient(base_url=url, version="1.41"), "d")
        with pytest.raises(HostFault) as caught:
            executor.launch(launch(checkpoint=False))
        assert caught.value.what == DOCKER


def test_a_state_directory_that_cannot_be_written_is_a_host_fault(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("not a directory")
    with pytest.raises(HostFault) as caught:
        SubprocessExecutor(str(tmp_path / "state")).launch(launch())
    assert caught.value.what == STATE_DIR


def test_the_fault_note_is_shared_with_a_forked_child() -> None:
    note = FaultNote()
    assert note.take() is None
    pid = os.fork()
    if pid == 0:  # the horse
        note.write(HostFault(DOCKER, "no connection (refused)"))
        os._exit(0)
    os.waitpid(pid, 0)
    assert note.take() == (DOCKER, "no connection (refused)")
    assert note.take() is None
