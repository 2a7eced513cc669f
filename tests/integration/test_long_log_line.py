"""A job that prints one very long line: its log tail is read as it streams, keeping only the bytes
recorded (jobpool/workers/executors/dockerlogs.py, `read_logs`), and the lease is renewed while it is read
(workers/watch.py, `_finish`). Before, the work horse read the whole line (the read alone held 192 MiB at its
peak for a 100 MB line) for seconds without renewing its lease: with a short lease the supervisor recorded the
exit first, and the log tail was lost. Real dockerd, real worker and supervisor processes."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import docker

from jobpool import JobState, Pool
from jobpool.logtail import LOG_TAIL_BYTES
from jobpool.workers.executors.docker import DockerHandle
from tests.support.constants import IMAGE
from tests.support.procs import JobpoolProcess

#: 100 MB of 'x' without a newline, then a marker: the tail must end with the marker.
LONG_LINE = "head -c 100000000 /dev/zero | tr '\\0' x; echo; echo the-end-of-the-job"


def test_a_job_that_prints_a_100_mb_line_keeps_its_log_tail(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    worker = spawn()
    spawn("jobpool.cli", ("supervisor",))
    job = pool.enqueue(IMAGE, ["sh", "-c", LONG_LINE])
    done = pool.wait(job.id, timeout=120)
    assert done.state is JobState.SUCCEEDED, (done.state, done.error_reason, worker.log()[-2000:])
    last = pool.events(job.id)[-1]
    assert (last["reason"], last["actor"].startswith("supervisor")) == ("exit_0", False), last  # its worker's
    tail = pool.logs(job.id)
    assert tail.rstrip().endswith("the-end-of-the-job"), tail[-200:]
    assert 0 < len(tail) <= 70_000, len(tail)


def test_reading_the_tail_of_a_100_mb_line_costs_only_the_bytes_kept(
        dclient: docker.DockerClient) -> None:
    """The memory of the read itself, measured with tracemalloc around `DockerHandle.log_tail` on the real
    daemon's log of a real container: bounded by the bytes kept, not by the line (it was the whole line)."""
    container = dclient.containers.run(IMAGE, ["sh", "-c", LONG_LINE], detach=True)
    try:
        assert container.wait(timeout=120)["StatusCode"] == 0
        handle = DockerHandle(dclient, str(container.id), "")
        tracemalloc.start()
        try:
            tail = handle.log_tail(LOG_TAIL_BYTES)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert tail.rstrip().endswith(b"the-end-of-the-job") and len(tail) == LOG_TAIL_BYTES
        assert peak < 8 * LOG_TAIL_BYTES + (1 << 20), f"the read held {peak / 2**20:.1f} MiB at its peak"
    finally:
        container.remove(force=True)
