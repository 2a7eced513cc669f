"""Bad input through the CLI and its environment, as real processes and through click's runner: every
``JOBPOOL_*`` variable with a bad value, and Redis unreachable.

Each is one ``Error:`` line on stderr naming the variable, exit 2 (bad input) or 1 (failure), never a
traceback, and nothing is written to Redis (a canary key and the whole keyspace, tests/support/snapshot.py,
compared).
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from jobpool.cli import main as cli_main
from tests.support.bad_input import cli, one_line_error
from tests.support.servers import free_port
from tests.support.snapshot import keyspace

BAD_ENV = [
    ("JOBPOOL_REDIS_URL", "http://127.0.0.1/"),
    ("JOBPOOL_REDIS_URL", "127.0.0.1:6379"),
    ("JOBPOOL_REDIS_URL", "redis+sentinel://127.0.0.1:26379"),  # no service name
    ("JOBPOOL_REDIS_URL", "redis+sentinel://127.0.0.1:26379,127.0.0.1/svc"),  # a host without its port
    ("JOBPOOL_REDIS_URL", "redis+sentinel://:secret@127.0.0.1:26379/svc/zero"),
    ("JOBPOOL_REDIS_WAIT_REPLICAS", "17"),
    ("JOBPOOL_REDIS_WAIT_REPLICAS", "-1"),
    ("JOBPOOL_REDIS_WAIT_TIMEOUT_SECS", "0"),
    ("JOBPOOL_POOL", "no spaces"),
    ("JOBPOOL_POOL", "x" * 65),
    ("JOBPOOL_MAX_CONCURRENT_JOBS", "many"),
    ("JOBPOOL_MAX_CONCURRENT_JOBS", "100001"),
    ("JOBPOOL_MAX_CONCURRENT_JOBS", "2.5"),
    ("JOBPOOL_HEARTBEAT_SECS", "0"),
    ("JOBPOOL_HEARTBEAT_SECS", "nan"),
    ("JOBPOOL_LEASE_SECS", "1"),  # under twice the default heartbeat (5 s)
    ("JOBPOOL_LEASE_SECS", "-inf"),
    ("JOBPOOL_SWEEP_INTERVAL_SECS", "0"),
    ("JOBPOOL_JOB_STALE_SECONDS", "-5"),
    ("JOBPOOL_DRAIN_TIMEOUT_SECS", "1.5"),
    ("JOBPOOL_DRAIN_TIMEOUT_SECS", "0"),
    ("JOBPOOL_RECOVERY_BUDGET", "1001"),
    ("JOBPOOL_RECOVERY_BUDGET", "one"),
    ("JOBPOOL_EXECUTOR", "podman"),
    ("JOBPOOL_EXECUTOR", ""),
    ("JOBPOOL_CLAIM_GRACE_SECS", "0"),
    ("JOBPOOL_PROBE_TIMEOUT_SECS", "601"),
    ("JOBPOOL_STOP_GRACE_SECS", "-1"),
    ("JOBPOOL_BIND_ROOTS", "relative/dir"),
    ("JOBPOOL_CHECKPOINT_ROOT", "relative/dir"),
    ("JOBPOOL_CHECKPOINT_ROOT", "/a:/b"),
    ("JOBPOOL_EVENTS_MAXLEN", "10"),
    ("JOBPOOL_KEEP_SUCCEEDED", "-1"),
    ("JOBPOOL_KEEP_SUCCEEDED", "lots"),
    ("JOBPOOL_KEEP_FAILED", "1.5"),
    ("JOBPOOL_KEEP_CANCELLED", "100000001"),
    ("JOBPOOL_KEEP_SUCCEEDED_SECS", "7d"),
    ("JOBPOOL_KEEP_FAILED_SECS", "-86400"),
    ("JOBPOOL_KEEP_CANCELLED_SECS", "3.5"),
    ("JOBPOOL_METRICS_PORT", "http"),
    ("JOBPOOL_METRICS_PORT", "65536"),
    ("JOBPOOL_METRICS_HOST", "not a host"),
    ("JOBPOOL_HOST_CHECK_SECS", "0"),
    ("JOBPOOL_TREND_SECS", "0"),
    ("JOBPOOL_TREND_SECS", "1.5"),
    ("JOBPOOL_TREND_SECS", "3601"),
]


def test_every_bad_jobpool_variable_is_one_line_exit_2_naming_it(redis_url: str, raw: redis.Redis,
                                                                 tmp_path: Path) -> None:
    """As real processes: one bad value of every variable for `ls` (it refuses before connecting), and a few
    for `worker` and `supervisor --once`. Run concurrently: each is a Python start-up."""
    first = {var: value for var, value in reversed(BAD_ENV)}  # the first bad value listed for each variable
    assert set(first) == {
        "JOBPOOL_REDIS_URL", "JOBPOOL_POOL", "JOBPOOL_MAX_CONCURRENT_JOBS", "JOBPOOL_HEARTBEAT_SECS",
        "JOBPOOL_LEASE_SECS", "JOBPOOL_SWEEP_INTERVAL_SECS", "JOBPOOL_JOB_STALE_SECONDS",
        "JOBPOOL_DRAIN_TIMEOUT_SECS", "JOBPOOL_RECOVERY_BUDGET", "JOBPOOL_EXECUTOR",
        "JOBPOOL_CLAIM_GRACE_SECS", "JOBPOOL_PROBE_TIMEOUT_SECS", "JOBPOOL_STOP_GRACE_SECS",
        "JOBPOOL_BIND_ROOTS", "JOBPOOL_CHECKPOINT_ROOT", "JOBPOOL_EVENTS_MAXLEN", "JOBPOOL_KEEP_SUCCEEDED",
            "JOBPOOL_KEEP_FAILED",
        "JOBPOOL_KEEP_CANCELLED", "JOBPOOL_KEEP_SUCCEEDED_SECS", "JOBPOOL_KEEP_FAILED_SECS",
        "JOBPOOL_KEEP_CANCELLED_SECS", "JOBPOOL_METRICS_PORT", "JOBPOOL_METRICS_HOST",
        "JOBPOOL_REDIS_WAIT_REPLICAS", "JOBPOOL_REDIS_WAIT_TIMEOUT_SECS", "JOBPOOL_HOST_CHECK_SECS",
        "JOBPOOL_TREND_SECS"}
    raw.set("canary", "1")
    before = keyspace(raw)
    runs: list[tuple[tuple[str, ...], str, str]] = [(("ls",), var, value) for var, value in first.items()]
    runs += [(("worker",), "JOBPOOL_EXECUTOR", "podman"), (("worker",), "JOBPOOL_LEASE_SECS", "1"),
             (("supervisor", "--once"), "JOBPOOL_SWEEP_INTERVAL_SECS", "0"),
             (("supervisor", "--once"), "JOBPOOL_PROBE_TIMEOUT_SECS", "601"),
             (("prune",), "JOBPOOL_KEEP_FAILED_SECS", "-86400"),
             (("supervisor", "--once"), "JOBPOOL_KEEP_SUCCEEDED", "-1"),
             (("supervisor",), "JOBPOOL_METRICS_PORT", "65536")]
    base = {"JOBPOOL_REDIS_URL": redis_url, "JOBPOOL_POOL": "it"}

    def one(run: tuple[tuple[str, ...], str, str]) -> str | None:
        args, var, value = run
        try:
            result = cli(*args, env={**base, var: value}, cwd=tmp_path, timeout=30)
        except subprocess.TimeoutExpired:
            return f"{' '.join(args)} with {var}={value!r}: still running after 30 s (value accepted?)"
        why = one_line_error(result, 2)
        if why is None and var not in result.stderr:
            why = f"the message does not name {var}: {result.stderr!r}"
        return None if why is None else f"{' '.join(args)} with {var}={value!r}: {why}"

    with ThreadPoolExecutor(max_workers=6) as workers:
        problems = [p for p in workers.map(one, runs) if p]
    assert problems == []
    assert keyspace(raw) == before


def test_every_bad_value_is_refused_in_process_too(redis_url: str, raw: redis.Redis, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every listed bad value (not just the first of each variable), through click's runner: cheap."""
    monkeypatch.chdir(tmp_path)
    raw.set("canary", "1")
    before = keyspace(raw)
    clean: dict[str, str | None] = {k: None for k in os.environ if k.startswith("JOBPOOL_")}
    problems = []
    for var, value in BAD_ENV:
        env = {**clean, "JOBPOOL_REDIS_URL": redis_url, "JOBPOOL_POOL": "it", var: value}
        result = CliRunner().invoke(cli_main, ["ls"], env=env)
        lines = result.stderr.strip().splitlines()
        crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
        if result.exit_code != 2 or crashed or len(lines) != 1 or not lines[0].startswith(f"Error: {var}"):
            problems.append(f"{var}={value!r}: exit {result.exit_code}, {result.stderr!r}, "
                            f"{result.exception!r}")
    assert problems == []
    assert keyspace(raw) == before


@pytest.mark.parametrize(("module", "args", "var", "value"), [
    pytest.param("jobpool.workers", (), "JOBPOOL_HEARTBEAT_SECS", "abc"),
    pytest.param("jobpool.cli", ("ls",), "JOBPOOL_REDIS_URL", "redis://127.0.0.1:notaport/0"),
    pytest.param("jobpool.workers", (), "JOBPOOL_REDIS_URL", "redis+sentinel://h:1/svc?socket_timout=1"),
    pytest.param("jobpool.cli", ("ls",), "JOBPOOL_POOL", "p\n"),
])
def test_a_bad_variable_at_other_doors_is_one_line_exit_2(redis_url: str, tmp_path: Path, module: str,
                                                          args: tuple[str, ...], var: str,
                                                          value: str) -> None:
    result = cli(*args, env={"JOBPOOL_REDIS_URL": redis_url, var: value}, cwd=tmp_path, module=module)
    assert one_line_error(result, 2) is None, one_line_error(result, 2)
    assert var in result.stderr


def test_supervisor_once_with_redis_unreachable_is_one_line_exit_1(tmp_path: Path) -> None:
    result = cli("supervisor", "--once", env={"JOBPOOL_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"},
                 cwd=tmp_path)
    assert one_line_error(result, 1) is None, one_line_error(result, 1)
    assert "redis unreachable" in result.stderr


SECRET = "Url-secret-4e1b"
#: Commands that read their settings and end (run in-process); `worker`, `supervisor` and `dashboard`, which
#: would run on with a URL they took, are run as processes with a deadline below.
SHORT_COMMANDS = [
    ("status",), ("status", "--json"), ("ls",), ("enqueue", "busybox", "true"), ("show", "0" * 32),
    ("cancel", "0" * 32), ("logs", "0" * 32), ("events",), ("pause",), ("resume",), ("slots",),
    ("slots", "3"), ("prune",), ("reconcile",), ("forget-daemon", "d" * 12), ("forget-collision", "d" * 12),
]
#: (module, args) of every door as a real process.
DOORS = [("jobpool.cli", ("worker",)), ("jobpool.cli", ("supervisor",)),
         ("jobpool.cli", ("supervisor", "--once")), ("jobpool.cli", ("dashboard", "--port", "{free port}")),
         ("jobpool.workers", ()), ("jobpool.cli", ("status",)),
         ("jobpool.cli", ("enqueue", "busybox", "true"))]


def bad_urls(port: int) -> list[str]:
    """URLs redis-py would read as another database than they say, or fail on only at the first connection,
    all naming the test's own Redis (so a command that took one would really run, or write)."""
    at = f"127.0.0.1:{port}"
    return [f"redis://{at}/abc", f"redis://{at}/1/5", f"redis://{at}/-1", f"redis://{at}/ 1",
            f"redis://{at}/0?db=abc", f"redis://{at}/1?db=2", f"redis://{at}/0?socket_timout=5",
            f"redis://{at}/0?Password={SECRET}", f"redis://{at}/abc?password={SECRET}",
            f"unix:///tmp/no.sock?db=x&password={SECRET}", f"redis://{at}/0?decode_responses=no",
            f"redis+sentinel://{at}/svc/x?sentinel_password={SECRET}",
            f"redis+sentinel://:{SECRET}@{at}/svc?socket_timout=1",
            f"redis+sentinel://{at}/svc/1?db=2"]


def _all_databases(raw: redis.Redis) -> dict[str, object]:
    return dict(raw.info("keyspace"))


def _refusal_problem(args: tuple[str, ...], url: str, exit_code: int, stderr: str) -> str | None:
    lines = stderr.strip().splitlines()
    shown_host = url.partition("://")[2].rpartition("@")[2][:12]  # the host (or socket path) stays readable
    if exit_code != 2 or len(lines) != 1 or not lines[0].startswith("Error: JOBPOOL_REDIS_URL: "):
        return f"{' '.join(args)} with {url!r}: exit {exit_code}, {stderr[-600:]!r}"
    if SECRET in stderr or shown_host not in stderr:
        return f"{' '.join(args)} with {url!r}: the line shows the password or hides the host: {stderr!r}"
    return None


def test_a_bad_database_or_option_is_refused_by_every_command(redis_url: str, raw: redis.Redis,
                                                              tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command that reads settings, with every bad URL: one line naming the URL (its password hidden),
    exit 2, nothing written to any database of the Redis it names."""
    monkeypatch.chdir(tmp_path)
    raw.set("canary", "1")
    before = (keyspace(raw), _all_databases(raw))
    clean: dict[str, str | None] = {k: None for k in os.environ if k.startswith("JOBPOOL_")}
    problems = []
    for url in bad_urls(raw.connection_pool.connection_kwargs["port"]):
        for args in SHORT_COMMANDS:
            result = CliRunner().invoke(cli_main, list(args), env={**clean, "JOBPOOL_REDIS_URL": url,
                                                                   "JOBPOOL_POOL": "it"})
            crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
            problem = _refusal_problem(args, url, result.exit_code, result.stderr)
            if problem or crashed:
                problems.append(problem or f"{' '.join(args)} with {url!r}: {result.exception!r}")
    assert problems == []
    assert (keyspace(raw), _all_databases(raw)) == before


def test_a_bad_database_or_option_is_refused_at_every_door_as_a_process(redis_url: str, raw: redis.Redis,
                                                                        tmp_path: Path) -> None:
    """The worker, the supervisor (looping and once), the dashboard, `python -m jobpool.workers`, and a
    reading and a writing command as real processes: each door meets several bad URLs, each URL a door."""
    urls = bad_urls(raw.connection_pool.connection_kwargs["port"])
    runs = [(DOORS[i % len(DOORS)], url) for i, url in enumerate(urls)]
    runs += [(door, urls[(i + 5) % len(urls)]) for i, door in enumerate(DOORS)]
    raw.set("canary", "1")
    before = (keyspace(raw), _all_databases(raw))

    def one(run: tuple[tuple[str, tuple[str, ...]], str]) -> str | None:
        (module, args), url = run
        args = tuple(str(free_port()) if a == "{free port}" else a for a in args)
        try:
            result = cli(*args, env={"JOBPOOL_REDIS_URL": url, "JOBPOOL_POOL": "it"}, cwd=tmp_path,
                         module=module, timeout=30)
        except subprocess.TimeoutExpired:
            return f"{module} {' '.join(args)} with {url!r}: still running after 30 s (URL taken?)"
        if "Traceback" in result.stderr:
            return f"{module} {' '.join(args)} with {url!r}: traceback {result.stderr[-600:]!r}"
        return _refusal_problem((module, *args), url, result.returncode, result.stderr)

    with ThreadPoolExecutor(max_workers=6) as workers:
        problems = [p for p in workers.map(one, runs) if p]
    assert problems == []
    assert (keyspace(raw), _all_databases(raw)) == before
