"""Fixtures for tests that run real jobpool workers against the real redis-server and dockerd."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest
import redis

from jobpool import Pool
from jobpool.supervisor import Supervisor
from tests.support.bad_input import Jobs
from tests.support.constants import FAST_ENV, IMAGE, SUB
from tests.support.procs import JobpoolProcess
from tests.support.proxies import DockerLaunchHold
from tests.support.servers import DockerDaemon, RedisServer


@pytest.fixture
def pool_env(redis_url: str, tmp_path: Path) -> dict[str, str]:
    return {**FAST_ENV, "JOBPOOL_REDIS_URL": redis_url, "JOBPOOL_POOL": "it",
            "JOBPOOL_STATE_DIR": str(tmp_path / "state")}


@pytest.fixture
def pool(pool_env: dict[str, str]) -> Iterator[Pool]:
    p = Pool.from_env(env=pool_env)
    yield p
    p.close()


@pytest.fixture
def sup(pool: Pool, docker_host: str) -> Iterator[Supervisor]:
    """A supervisor of `pool`, in this process, judging by the test dockerd: a test calls its `sweep`."""
    s = Supervisor(pool.store)
    yield s
    s.close()


@pytest.fixture
def sub_pool(pool_env: dict[str, str]) -> Iterator[Pool]:
    """`pool` for workers that run jobs as local processes (no image, no daemon)."""
    p = Pool.from_env(env={**pool_env, **SUB})
    yield p
    p.close()


@pytest.fixture
def private_redis(redis_server_factory: Callable[[], RedisServer]) -> RedisServer:
    """A redis-server of the test's own, started, for faults that must not touch the shared one."""
    server = redis_server_factory()
    server.start()
    return server


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    """A directory a test's jobs bind-mount and wait on (a file appearing in it lets them go on)."""
    path = tmp_path / "gate"
    path.mkdir()
    return path


@pytest.fixture
def dclient(docker_host: str) -> Iterator[docker.DockerClient]:
    """An SDK client of the session's test dockerd."""
    with contextlib.closing(docker.DockerClient(base_url=docker_host, timeout=30)) as client:
        yield client


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A client that returns bytes: for keyspace snapshots (tests/support/snapshot.py) and for writing
    garbage."""
    with contextlib.closing(redis.Redis.from_url(redis_url)) as client:
        yield client


@pytest.fixture
def seeded(pool: Pool) -> Jobs:
    """One job in each of running (promoted, unclaimed), queued, paused and cancelled, so "nothing written"
    and "nothing lost" mean something."""
    pool.set_slots(1)
    jobs = {
        "running": pool.enqueue(IMAGE, ["sh", "-c", "sleep 1"]),
        "queued": pool.enqueue(IMAGE, ["true"], env={"TOKEN": "secret"}),
        "paused": pool.enqueue(IMAGE, ["true"], labels={"team": "a"}),
        "cancelled": pool.enqueue(IMAGE, ["false"]),
    }
    pool.pause(jobs["paused"].id)
    pool.cancel(jobs["cancelled"].id)
    return {name: pool.get(job.id) for name, job in jobs.items()}


@pytest.fixture
def spawn(tmp_path: Path, pool_env: dict[str, str]) -> Iterator[Callable[..., JobpoolProcess]]:
    """Start real processes (`python -m jobpool.workers` by default); all stopped after the test."""
    started: list[JobpoolProcess] = []

    def start(module: str = "jobpool.workers", args: tuple[str, ...] = (), prefix: tuple[str, ...] = (),
              **env: str) -> JobpoolProcess:
        log = tmp_path / f"{module.rsplit('.', 1)[-1]}-{len(started)}.log"
        p = JobpoolProcess(module, {**pool_env, **env}, log, args, prefix)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


@pytest.fixture
def proxy(docker_host: str) -> Iterator[DockerLaunchHold]:
    """A proxy in front of the test dockerd that can hold a launch's create or start
    (tests/support/proxies.py)."""
    p = DockerLaunchHold(docker_host)
    yield p
    p.close()


@pytest.fixture(scope="module")
def second_daemon() -> Iterator[DockerDaemon]:
    """A second private dockerd with its own socket, data root and exec root, started like the first (one per
    module that asks for it; it shares the first's Docker ID, as daemons reading one key file do)."""
    daemon = DockerDaemon()
    try:
        daemon.start()
        daemon.import_busybox_image()
        yield daemon
    finally:
        daemon.close()
