"""A job that prints one very long line (issue #29, item 4): its log tail is read as it streams, keeping
only the bytes recorded (jobpool/workers/executors/docker.py, `read_logs`), and the lease is renewed while it
is read (workers/watch.py, `_finish`). Before, the work horse read the whole line (64 MB and more, +190 MB of
memory) for seconds without renewing its lease: with a short lease the supervisor recorded the exit first,
and the log tail was lost. Real dockerd, real worker and supervisor processes."""

from __future__ import annotations

from collections.abc import Callable

from constants import IMAGE
from procs import JobpoolProcess

from jobpool import JobState, Pool

#: 100 MB of 'x' without a newline, then a marker: the tail must end with the marker.
LONG_LINE = "head -c 100000000 /dev/zero | tr '\\0' x; echo; echo the-end-of-the-job"


def test_a_job_that_prints_a_100_mb_line_keeps_its_log_tail(
        pool: Pool, spawn: Callable[..., JobpoolProcess]) -> None:
    worker = spawn()
    spawn("jobpool.supervisor")
    job = pool.enqueue(IMAGE, ["sh", "-c", LONG_LINE])
    done = pool.wait(job.id, timeout=240)
    assert done.state is JobState.SUCCEEDED, (done.state, done.error_reason, worker.log()[-2000:])
    last = pool.events(job.id)[-1]
    assert (last["reason"], last["actor"].startswith("supervisor")) == ("exit_0", False), last  # its worker's
    tail = pool.logs(job.id)
    assert tail.rstrip().endswith("the-end-of-the-job"), tail[-200:]
    assert 0 < len(tail) <= 70_000, len(tail)
