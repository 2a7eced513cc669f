"""`jobpool schedule` through click's runner against a real redis-server: the list, add (its options between
NAME and IMAGE, the command after IMAGE untouched), rm, pause and resume, in both output modes; bad input
exits 2 with nothing written."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator

import pytest
import redis
from click.testing import CliRunner, Result

from jobpool import Pool
from jobpool.cli import main
from tests.support.snapshot import keyspace

POOL = "clisched"
Run = Callable[..., Result]


@pytest.fixture
def run(redis_url: str) -> Run:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("JOBPOOL_")}
    env.update({"JOBPOOL_REDIS_URL": redis_url, "JOBPOOL_POOL": POOL})
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(main, list(args), env=env, catch_exceptions=False, prog_name="jobpool")

    return invoke


@pytest.fixture
def pool(redis_url: str) -> Iterator[Pool]:
    p = Pool.from_url(redis_url, name=POOL)
    yield p
    p.close()


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    with contextlib.closing(redis.Redis.from_url(redis_url)) as client:
        yield client


def test_add_list_pause_resume_and_remove(run: Run, pool: Pool) -> None:
    assert run("schedule").output == "no schedules\n"
    done = run("schedule", "add", "nightly", "--cron", "30 2 * * *", "--tz", "Europe/Berlin", "--env",
               "TOKEN=hunter2", "--priority", "3", "--timeout", "2h", "--retries", "2", "--retry-on", "3",
               "busybox", "sh", "-c", "echo $TOKEN --json")
    assert done.exit_code == 0, done.output
    assert done.output.startswith("nightly: 30 2 * * * (Europe/Berlin), next fire ")
    [s] = pool.schedules()
    assert s.spec.command == ("sh", "-c", "echo $TOKEN --json")  # after IMAGE: the command's, not options
    assert (s.spec.priority, s.spec.timeout, s.spec.retries, s.spec.retry_on) == (3, 7200, 2, (3,))
    assert s.tz == "Europe/Berlin" and s.misfire == "once" and s.overlap == "skip"
    assert run("schedule", "add", "--every", "10m", "--overlap", "queue", "poll", "--", "busybox",
               "true").exit_code == 0  # options before NAME too, and a `--` before IMAGE
    listed = run("schedule").output
    assert "hunter2" not in listed
    assert listed.splitlines()[0].split() == ["NAME", "WHEN", "STATE", "LAST", "FIRE", "LAST", "JOB", "NEXT",
                                              "FIRE"]
    assert "every 10m" in listed and "30 2 * * * (Europe/Berlin)" in listed
    docs = json.loads(run("schedule", "ls", "--json").output)
    assert [d["name"] for d in docs] == ["nightly", "poll"]
    assert docs[0]["spec"]["env"] == {"TOKEN": "<redacted>"} and docs[1]["every"] == 600
    assert docs[1]["next_fire"] % 600_000 == 0
    paused = run("schedule", "pause", "poll", "--json")
    assert json.loads(paused.output)["paused"] is True and json.loads(paused.output)["next_fire"] is None
    assert run("schedule", "resume", "poll").output.startswith("resumed schedule poll, next fire ")
    assert run("schedule", "rm", "poll").output == "removed schedule poll\n"
    assert [s.name for s in pool.schedules()] == ["nightly"]


@pytest.mark.parametrize(("args", "code", "says"), [
    (["add", "x", "busybox", "true"], 2, "cron=EXPRESSION or every=SECONDS"),
    (["add", "x", "--cron", "61 * * * *", "busybox", "true"], 2, "does not parse"),
    (["add", "x", "--every", "0", "busybox", "true"], 2, "out of range"),
    (["add", "x", "--every", "ten", "busybox", "true"], 2, "is not a duration"),
    (["add", "x", "--cron", "0 3 * * *", "--tz", "Nowhere/Land", "busybox", "true"], 2, "no time zone"),
    (["add", "x y", "--every", "1m", "busybox", "true"], 2, "a schedule's name"),
    (["add", "x", "--every", "1m", "--misfire", "often", "busybox", "true"], 2, "often"),
    (["add", "x", "--every", "1m", "--memory", "lots", "busybox", "true"], 2, "memory"),
    (["add", "x", "--every", "1m", "busybox"], 2, "COMMAND"),
    (["add", "x", "--every", "1m", "--retry-on", "3", "busybox", "true"], 2, "--retries"),
    (["add", "x", "--every", "1m", "--at", "2026-12-03T02:00:00Z", "busybox", "true"], 2, "--at"),
    (["add", "old", "--every", "1m", "busybox", "true"], 1, "exists already"),
    (["rm", "nothing"], 1, "no schedule nothing"),
    (["pause", "nothing"], 1, "no schedule nothing"),
])
def test_bad_input_writes_nothing(run: Run, raw: redis.Redis, args: list[str], code: int, says: str) -> None:
    assert run("schedule", "add", "old", "--every", "1m", "busybox", "true").exit_code == 0
    before = keyspace(raw)
    result = run("schedule", *args)
    assert result.exit_code == code, result.output
    assert says in result.output
    assert keyspace(raw) == before
