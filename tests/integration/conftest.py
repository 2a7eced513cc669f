"""Fixtures for tests that run real jobpool workers against the real redis-server and dockerd."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from procs import JobpoolProcess

from jobpool import Pool

IMAGE = "jobpool-test:busybox"

#: Fast timings so fault tests finish in seconds; the same code paths as the defaults.
FAST = {
    "JOBPOOL_HEARTBEAT_SECS": "0.2",
    "JOBPOOL_LEASE_SECS": "1",
    "JOBPOOL_DRAIN_TIMEOUT_SECS": "3",
    "JOBPOOL_STOP_GRACE_SECS": "2",
    "JOBPOOL_SWEEP_INTERVAL_SECS": "0.5",
    "JOBPOOL_CLAIM_GRACE_SECS": "5",
    "JOBPOOL_PROBE_TIMEOUT_SECS": "3",
}


@pytest.fixture
def pool_env(redis_url: str, tmp_path: Path) -> dict[str, str]:
    return {**FAST, "JOBPOOL_REDIS_URL": redis_url, "JOBPOOL_POOL": "it", "JOBPOOL_STATE_DIR": str(tmp_path / "state")}


@pytest.fixture
def pool(pool_env: dict[str, str]) -> Pool:
    return Pool.from_env(env=pool_env)


@pytest.fixture
def spawn(tmp_path: Path, pool_env: dict[str, str]) -> Iterator[Callable[..., JobpoolProcess]]:
    """Start real processes (`python -m jobpool.workers` by default); all stopped after the test."""
    started: list[JobpoolProcess] = []

    def start(module: str = "jobpool.workers", args: tuple[str, ...] = (), **env: str) -> JobpoolProcess:
        log = tmp_path / f"{module.rsplit('.', 1)[-1]}-{len(started)}.log"
        p = JobpoolProcess(module, {**pool_env, **env}, log, args)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()
