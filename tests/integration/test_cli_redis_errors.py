"""Redis errors reach a CLI user one way: the API's mapping (jobpool/store/runner.py `wrap_redis_error`), one
line on stderr, exit 1, whichever command met them and whether or not it went through `Pool`."""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from jobpool import Pool
from jobpool.cli import main

POOL = "clierr"


@pytest.fixture
def pool(redis_url: str) -> Iterator[Pool]:
    p = Pool.from_url(redis_url, name=POOL)
    yield p
    p.store.client.close()


def run(redis_url: str, *args: str) -> Result:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("JOBPOOL_")}
    env.update({"JOBPOOL_REDIS_URL": redis_url, "JOBPOOL_POOL": POOL})
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False, prog_name="jobpool")


def one_line(result: Result, code: int = 1) -> str:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def test_status_on_a_pool_key_of_the_wrong_type_is_the_apis_corrupt_data_error(redis_url: str,
                                                                             pool: Pool) -> None:
    """The boots index overwritten by another program: `status` says the data is bad, not "redis: ..."."""
    with contextlib.closing(redis.Redis.from_url(redis_url)) as raw:
        raw.set(pool.keys.boots, "not a sorted set")
        line = one_line(run(redis_url, "status"))
    assert "redis refused it on the stored data" in line and "WRONGTYPE" in line


def _raising(exc: Exception) -> Any:
    def fn(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return fn


@pytest.mark.parametrize(("exc", "message"), [
    (redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."),
     "Error: redis unreachable: Error 111 connecting"),
    (redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
     "Error: reconcile: redis refused it on the stored data: WRONGTYPE"),
    (redis.ResponseError("LOADING Redis is loading the dataset in memory"),
     "Error: redis refused reconcile: LOADING"),
])
def test_a_redis_error_a_process_command_lets_through_is_mapped_like_the_apis(
        redis_url: str, monkeypatch: pytest.MonkeyPatch, exc: Exception, message: str) -> None:
    """The process commands run code that is not `Pool` (the supervisor's reads): a redis-py error from
    there is worded by the same mapping as the API's, naming the command."""
    fake = types.ModuleType("jobpool.supervisor")
    fake.reconcile = _raising(exc)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jobpool.supervisor", fake)
    assert one_line(run(redis_url, "reconcile")).startswith(message)
