"""A spec the Docker daemon refuses is the job's own error: it fails at once as
`launch_failed: <the daemon's words>`, on its first attempt, with no recovery budget spent, no slot held past
it and no checkpoint volume left; not a crash re-run on the recovery budget.

The daemon answers some of these with statuses that also mean its own faults: a network it does not have is
a 404 at start (as a container removed before its start is), a working directory that is a file a 500 at
create (as a daemon shutting down answers). jobpool/workers/executors/docker.py tells them apart. Real
dockerd, real worker processes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import docker
import pytest

from jobpool import JobState, Pool
from jobpool.workers.executors.docker import checkpoint_volume
from tests.support.constants import IMAGE
from tests.support.procs import JobpoolProcess


@pytest.mark.parametrize(("spec", "words"), [
    ({"network": "jobpool-no-such-network"}, "jobpool-no-such-network"),
    ({"workdir": "/bin/sh"}, "/bin/sh"),
    ({"user": "jobpool-no-such-user"}, "jobpool-no-such-user"),
], ids=["unknown-network", "workdir-is-a-file", "unknown-user"])
def test_a_spec_the_daemon_refuses_fails_at_once_as_the_jobs_own_error(
        pool: Pool, spawn: Callable[..., JobpoolProcess], dclient: docker.DockerClient,
        spec: dict[str, Any], words: str) -> None:
    spawn()
    job = pool.enqueue(IMAGE, ["true"], **spec)
    done = pool.wait(job.id, timeout=60)
    assert done.state == JobState.FAILED, (done.state, done.error_reason)
    assert done.error_reason.startswith("launch_failed: ") and words in done.error_reason, done.error_reason
    assert (done.attempt, done.recovery_attempts) == (1, 0), "re-run as a crash"
    assert not dclient.containers.list(all=True, filters={"label": f"jobpool.job_id={job.id}"})
    assert checkpoint_volume(pool.keys.pool, job.id) not in [v.name for v in dclient.volumes.list()]
    # The slot went at once: the next job runs.
    assert pool.wait(pool.enqueue(IMAGE, ["true"]).id, timeout=60).state == JobState.SUCCEEDED
