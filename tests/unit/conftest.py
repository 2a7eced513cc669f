"""Unit fixtures: a `Pool` over fakeredis[lua], and the very same tests again over a real redis-server.

fakeredis runs the scripts in its own Lua 5.1; the real server is the one production uses. Running one suite
on both catches a script that only works on one of them (a command fakeredis lacks, a reply it shapes
differently). The real half needs `redis_url` (tests/conftest.py), so it skips, or fails under CI, exactly
as the integration tests do when redis-server is missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import redis

from jobpool.api import Pool
from jobpool.store.redisurl import connect
from tests.support.pool_helpers import Backend, fake_backend


@pytest.fixture(params=["fakeredis", "real"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The backend under test: fakeredis[lua], or an emptied database on the shared real redis-server."""
    if request.param == "fakeredis":
        b = fake_backend()
    else:
        url = request.getfixturevalue("redis_url")
        b = Backend("real", connect(url), redis.Redis.from_url(url))
    yield b
    for client in (b.client, b.raw):
        with contextlib.suppress(Exception):
            client.close()


@pytest.fixture
def pool(backend: Backend) -> Pool:
    """A pool named ``default`` with the default settings (one slot) on each backend."""
    return backend.pool()
