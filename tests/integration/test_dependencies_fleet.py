"""Time and dependencies (docs/architecture.md, "Time and dependencies") with real processes: a real
redis-server, the session's dockerd, real workers and a real supervisor, whose timer thread is the only
thing that releases a waiting job. What ran is read from the daemon (its event log), not only from Redis.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable
from typing import Any

import docker

from jobpool import JobState, Pool
from jobpool.contract import LABEL_JOB, LABEL_POOL
from tests.support.constants import FAST_ENV, IMAGE
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.servers import RedisServer


def started(host: str, pool: Pool, since: float) -> list[tuple[str, int]]:
    """(job id, when in ns) of each container of the pool the daemon started since `since`, in order."""
    with contextlib.closing(docker.DockerClient(base_url=host, timeout=10)) as client:
        events = list(client.api.events(since=int(since), until=int(time.time()) + 1, decode=True, filters={
            "type": "container", "event": "start", "label": f"{LABEL_POOL}={pool.keys.pool}"}))
    return sorted(((e["Actor"]["Attributes"][LABEL_JOB], int(e["timeNano"])) for e in events),
                  key=lambda s: s[1])


def ended(host: str, pool: Pool, since: float) -> dict[str, int]:
    """Job id -> when (ns) the daemon saw its container die, since `since`."""
    with contextlib.closing(docker.DockerClient(base_url=host, timeout=10)) as client:
        events = list(client.api.events(since=int(since), until=int(time.time()) + 1, decode=True, filters={
            "type": "container", "event": "die", "label": f"{LABEL_POOL}={pool.keys.pool}"}))
    return {e["Actor"]["Attributes"][LABEL_JOB]: int(e["timeNano"]) for e in events}


def test_a_pipeline_runs_in_order_and_a_failed_link_cancels_the_rest(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    """Two chains in one call: in the first, every dependent starts only after its dependency's container
    ended; in the second, whose first job exits 3, the chain of three after it never starts and ends
    cancelled, each `dependency_failed` naming the link before."""
    pool.set_slots(4)
    since = time.time() - 1
    spawn("jobpool.cli", ("supervisor",))
    for _ in range(2):
        spawn()
    items: list[dict[str, Any]] = [{"image": IMAGE, "command": ["sh", "-c", "sleep 0.3"]},
             {"image": IMAGE, "command": ["sh", "-c", "sleep 0.3"], "after_index": [0]},
             {"image": IMAGE, "command": ["true"], "after_index": [1]},
             {"image": IMAGE, "command": ["sh", "-c", "exit 3"]},
             {"image": IMAGE, "command": ["true"], "after_index": [3]},
             {"image": IMAGE, "command": ["true"], "after_index": [4]},
             {"image": IMAGE, "command": ["true"], "after_index": [5]}]
    jobs = pool.enqueue_many(items)
    ok, bad = jobs[:3], jobs[3:]
    for job in jobs:
        pool.wait(job.id, timeout=60)
    assert [pool.get(j.id).state for j in ok] == [JobState.SUCCEEDED] * 3
    first, *chain = (pool.get(j.id) for j in bad)
    assert (first.state, first.error_reason) == (JobState.FAILED, "exit_code_3")
    for job, dep in zip(chain, [first, *chain], strict=False):
        assert (job.state, job.error_reason) == (JobState.CANCELLED, "dependency_failed")
        assert pool.events(job.id)[-1]["evidence"].startswith(f"job {dep.id} ")
        assert job.attempt == 0
    mine = {j.id for j in jobs}  # a container of an earlier test may have started within `since`'s second
    starts = {job_id: at for job_id, at in started(docker_host, pool, since) if job_id in mine}
    deaths = ended(docker_host, pool, since)
    assert set(starts) == {*(j.id for j in ok), first.id}, "a cancelled dependent's container started"
    for before, after in itertools.pairwise(ok):
        assert deaths[before.id] < starts[after.id], "a dependent started before its dependency ended"


def test_a_delayed_job_is_released_by_the_supervisor_and_holds_no_slot_meanwhile(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    pool.set_slots(1)
    since = time.time() - 1
    spawn("jobpool.cli", ("supervisor",))
    spawn()
    at = time.time() + 2
    delayed = pool.enqueue(IMAGE, ["true"], not_before=at)
    other = pool.enqueue(IMAGE, ["true"])
    assert delayed.state is JobState.WAITING
    pool.wait(other.id, timeout=30)  # the one slot was free for it
    pool.wait(delayed.id, timeout=30)
    assert pool.get(delayed.id).state is JobState.SUCCEEDED
    starts = dict(started(docker_host, pool, since))
    assert starts[delayed.id] / 1e9 >= at - 0.05, "started before its time"


def test_a_dependency_chain_survives_a_redis_crash_from_its_aof(
        private_redis: RedisServer, spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    """A waiting chain is all in Redis: after a SIGKILL of redis-server and a restart from its AOF, the
    supervisor and worker carry it through."""
    private_redis.stop()
    private_redis.start(appendonly=True)  # with an AOF, fsync always
    env = {**FAST_ENV, "JOBPOOL_REDIS_URL": private_redis.url, "JOBPOOL_POOL": "aof"}
    pool = Pool.from_env(env=env)
    try:
        pool.set_slots(2)
        gate = pool.enqueue(IMAGE, ["true"], not_before=time.time() + 4)
        chain = pool.enqueue_many([{"image": IMAGE, "command": ["true"], "after": [gate.id]},
                                   {"image": IMAGE, "command": ["true"], "after_index": [0]},
                                   {"image": IMAGE, "command": ["true"], "after_index": [1]}])
        private_redis.kill()
        private_redis.start(appendonly=True)
        assert [pool.get(j.id).state for j in [gate, *chain]] == [JobState.WAITING] * 4
        spawn("jobpool.cli", ("supervisor",), JOBPOOL_REDIS_URL=private_redis.url, JOBPOOL_POOL="aof")
        spawn(JOBPOOL_REDIS_URL=private_redis.url, JOBPOOL_POOL="aof")
        for job in chain:
            assert pool.wait(job.id, timeout=60).state is JobState.SUCCEEDED
        eventually(lambda: not pool.store.client.zcard(pool.keys.dependents), timeout=10,
                   message="the chain's dependency entries were not dropped")
    finally:
        pool.close()
