"""A Redis outage across the end of a job: the worker keeps the exit code until Redis takes it.

A subprocess job's exit code lives only in the worker that waited for it. A worker that gave up recording it
after a fixed window left the supervisor a dead pid and no code, so a job that succeeded was run again (or
failed, with no budget left). The worker now retries until the write is answered: recorded, or refused
(the row moved on, proof that it was superseded). Redis being away proves nothing.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from jobpool import JobState, Pool
from tests.support.constants import SUB
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess, children
from tests.support.servers import RedisServer

#: How long a worker used to keep an exit code through an outage before dropping it (the fixed window in
#: jobpool/workers/watch.py that this test outlasts).
OLD_WINDOW_SECS = 20.0


def test_an_exit_during_a_long_redis_outage_is_recorded_when_redis_returns(
        redis_server_factory: Callable[[], RedisServer], pool_env: dict[str, str],
        spawn: Callable[..., JobpoolProcess], tmp_path: Path) -> None:
    server = redis_server_factory()
    server.start(appendonly=True)  # the outage is a restart: what was written before it must survive it
    env = {**pool_env, **SUB, "JOBPOOL_REDIS_URL": server.url}
    pool = Pool.from_env(env=env)
    runs, go, ended = tmp_path / "runs", tmp_path / "go", tmp_path / "ended"
    job = pool.enqueue("ignored", ["sh", "-c", f'echo "$JOBPOOL_ATTEMPT" >> {runs}; '
                                               f"while [ ! -f {go} ]; do sleep 0.05; done; touch {ended}"])
    worker = spawn(**env)
    eventually(lambda: runs.exists() and pool.get(job.id).identity, timeout=30, message="job launched")
    pool.store.client.close()

    server.stop()
    go.touch()  # the job ends while Redis is away
    eventually(ended.exists, timeout=10, message="job ended")
    time.sleep(OLD_WINDOW_SECS + 5)  # the fault itself: Redis stays away this long after the job ended
    server.start(appendonly=True)

    pool = Pool.from_env(env=env)
    try:
        done = pool.wait(job.id, timeout=15)
        assert (done.state, done.attempt, done.exit_code) == (JobState.SUCCEEDED, 1, 0), worker.log()[-3000:]
        assert runs.read_text().split() == ["1"], "the job ran once"
        assert pool.slots()[0] == 0
    finally:
        pool.store.client.close()


def test_a_supervisor_does_not_judge_leases_that_lapsed_in_the_outage(
        redis_server_factory: Callable[[], RedisServer], pool_env: dict[str, str],
        spawn: Callable[..., JobpoolProcess], tmp_path: Path) -> None:
    """Every lease lapses while Redis is away; a supervisor sweeping the moment it is back would find the
    job's pid gone and re-run a job whose worker is about to record its success. For one lease it waits."""
    server = redis_server_factory()
    server.start(appendonly=True)
    env = {**pool_env, **SUB, "JOBPOOL_REDIS_URL": server.url, "JOBPOOL_RECOVERY_BUDGET": "3",
           "JOBPOOL_LEASE_SECS": "4"}
    pool = Pool.from_env(env=env)
    runs, go, ended = tmp_path / "runs", tmp_path / "go", tmp_path / "ended"
    job = pool.enqueue("ignored", ["sh", "-c", f'echo "$JOBPOOL_ATTEMPT" >> {runs}; '
                                               f"while [ ! -f {go} ]; do sleep 0.05; done; touch {ended}"])
    worker = spawn(**env)
    supervisor = spawn(module="jobpool.cli", args=("supervisor",), **env)
    eventually(lambda: runs.exists() and pool.get(job.id).identity, timeout=30, message="job launched")
    pool.store.client.close()

    server.stop()
    go.touch()
    eventually(ended.exists, timeout=10, message="job ended")
    # The worker (and its horse, holding the exit code) is slower to reconnect than the supervisor.
    stalled = [worker.pid, *children(worker.pid)]
    for pid in stalled:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(5)  # the fault itself: an outage longer than the lease
        swept = supervisor.log().count("sweep pool=")
        server.start(appendonly=True)
        eventually(lambda: supervisor.log().count("sweep pool=") >= swept + 2, timeout=10,
                   message="the supervisor sweeping while the worker has not reported yet")
    finally:
        for pid in stalled:
            os.kill(pid, signal.SIGCONT)

    pool = Pool.from_env(env=env)
    try:
        done = pool.wait(job.id, timeout=15)
        assert (done.state, done.attempt) == (JobState.SUCCEEDED, 1), (worker.log()[-2000:],
                                                                       supervisor.log()[-2000:])
        assert runs.read_text().split() == ["1"], "the job ran once"
        assert "redis_recovering" in supervisor.log()
    finally:
        pool.store.client.close()
