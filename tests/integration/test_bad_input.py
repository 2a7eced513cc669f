"""Bad input at every entry point (issue #6, "Bad input"), on a real redis-server and real processes.

Four doors: the Python API (wrong types and values for every `Pool` method, a bad URL or pool name, Redis
down), the CLI and its environment (every ``JOBPOOL_*`` variable with a bad value), rows edited by hand in
Redis to garbage, and junk pushed onto the pool's RQ queue. What each door must do:

- the API raises a `JobpoolError` subclass, never a bare KeyError/ValueError/TypeError or a redis-py error,
  and a refused call writes nothing (the whole keyspace is compared before and after);
- the CLI prints one line on stderr and exits 2 (bad input) or 1 (failure), never a traceback;
- a garbage row is refused by `get` with a typed error and skipped by `list`: one bad row must neither hide
  the good ones nor wedge promotion for the jobs queued behind it;
- workers and the supervisor survive garbage: they keep running, and good jobs still run to the end;
- nothing changes for the other jobs (their rows are compared before and after).

Known bugs are pinned by strict xfails whose reason says what is wrong; each passes once its bug is fixed.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from polling import eventually
from procs import JobpoolProcess
from servers import daemon_identity, free_port

from jobpool import (
    ConfigError,
    InvalidArgument,
    InvalidSpec,
    Job,
    JobpoolError,
    JobState,
    NotFound,
    Pool,
    RedisUnavailable,
)
from jobpool.cli import main as cli_main
from jobpool.spec import MAX_SPEC_BYTES
from jobpool.supervisor import reconcile, sweep_once
from jobpool.workers.attempt import Attempt

REPO = Path(__file__).resolve().parents[2]
IMAGE = "jobpool-test:busybox"
SUB = {"JOBPOOL_EXECUTOR": "subprocess"}
#: A well-formed job id that no pool holds.
UNKNOWN_ID = "0" * 32
HUGE = "x" * 1_000_000

Jobs = dict[str, Job]


def xbug(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, reason=f"bug: {reason}")


# ---- fixtures and helpers --------------------------------------------------------------------------------

@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A client that returns bytes: for snapshots and for writing garbage by hand."""
    with contextlib.closing(redis.Redis.from_url(redis_url)) as client:
        yield client


def keyspace(raw: redis.Redis) -> dict[bytes, tuple[bytes, Any]]:
    """Every key with its type and contents: equal snapshots mean nothing was written. (Not DUMP: a hash
    stored as a hashtable serializes in an order that incremental rehashing changes on mere reads.)"""
    keys = sorted(raw.keys("*"))
    pipe = raw.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    kinds = pipe.execute()
    read: dict[bytes, Callable[[Any, bytes], Any]] = {
        b"string": lambda p, k: p.get(k), b"hash": lambda p, k: p.hgetall(k),
        b"list": lambda p, k: p.lrange(k, 0, -1), b"set": lambda p, k: p.smembers(k),
        b"zset": lambda p, k: p.zrange(k, 0, -1, withscores=True), b"stream": lambda p, k: p.xrange(k),
    }
    for key, kind in zip(keys, kinds, strict=True):
        read[kind](pipe, key)
    return dict(zip(keys, zip(kinds, pipe.execute(), strict=True), strict=True))


def rows(pool: Pool, ids: list[str]) -> dict[str, dict[str, str]]:
    """The raw hashes of `ids`: "unchanged for the other jobs" is checked on these."""
    return {job_id: pool.client.hgetall(pool.keys.job(job_id)) for job_id in ids}


def claim(pool: Pool, job_id: str, boot: str) -> Attempt:
    """Claim a promoted job as a worker boot would (no process behind it), recording the identity of the
    test's daemon when there is one, as a worker on it would."""
    attempt = Attempt(pool, job_id, boot, pool.get(job_id).attempt)
    host = os.environ.get("DOCKER_HOST")
    attempt.claim("docker" if host else "", daemon_identity(host) if host else "")
    return attempt


@pytest.fixture
def api(pool_env: dict[str, str]) -> Iterator[Pool]:
    pool = Pool.from_env(env=pool_env)
    yield pool
    pool.client.close()


@pytest.fixture
def seeded(api: Pool) -> Jobs:
    """One job in each of running (promoted, unclaimed), queued, paused and cancelled, so "nothing written"
    and "nothing lost" mean something."""
    api.set_slots(1)
    jobs = {
        "running": api.enqueue(IMAGE, ["sh", "-c", "sleep 1"]),
        "queued": api.enqueue(IMAGE, ["true"], env={"TOKEN": "secret"}),
        "paused": api.enqueue(IMAGE, ["true"], labels={"team": "a"}),
        "cancelled": api.enqueue(IMAGE, ["false"]),
    }
    api.pause(jobs["paused"].id)
    api.cancel(jobs["cancelled"].id)
    return {name: api.get(job.id) for name, job in jobs.items()}


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        module: str = "jobpool.cli", timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """`python -m jobpool.cli ARGS` as a real process, with only the JOBPOOL_* variables given."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("JOBPOOL_")}
    full.update({"PYTHONPATH": str(REPO), **(env or {})})
    return subprocess.run([sys.executable, "-m", module, *args], env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str | None:
    """None if `result` is a clean refusal (exit `code`, one `Error:` line, no traceback); else why not."""
    lines = result.stderr.strip().splitlines()
    if "Traceback" in result.stderr or "Traceback" in result.stdout:
        return f"traceback (exit {result.returncode}): {lines[-1] if lines else ''}"
    if result.returncode != code:
        return f"exit {result.returncode}, wanted {code}; stderr {result.stderr!r}"
    if len(lines) != 1 or not lines[0].startswith("Error: "):
        return f"stderr is not one 'Error:' line: {result.stderr!r}"
    return None


# ---- the API: every Pool method with wrong types and values ------------------------------------------

GARBAGE_IDS = [None, 7, b"0" * 32, "", "a b", "{jobs}", "line\nbreak", HUGE, UNKNOWN_ID]
ID_CALLS: dict[str, Callable[[Pool, Any], Any]] = {
    "get": lambda p, i: p.get(i),
    "logs": lambda p, i: p.logs(i),
    "cancel": lambda p, i: p.cancel(i),
    "pause": lambda p, i: p.pause(i),
    "resume": lambda p, i: p.resume(i),
    "evict": lambda p, i: p.evict(i, 1),
    "wait": lambda p, i: p.wait(i, timeout=0.01),
}


@dataclass(frozen=True)
class Case:
    """One bad call: `call(pool, seeded_jobs)` must raise `expected` and write nothing."""

    name: str
    call: Callable[[Pool, Jobs], Any]
    expected: type[JobpoolError] | tuple[type[JobpoolError], ...]
    bug: str | None = None


def _case(name: str, call: Callable[[Pool, Jobs], Any], expected: type[JobpoolError] | tuple[type, ...],
          bug: str | None = None) -> Case:
    return Case(name, call, expected, bug)


def split(cases: list[Case]) -> tuple[list[Case], list[Any]]:
    """The cases that must pass (run together, cheaply), and the known bugs as strict-xfail params, one per
    bug with all the cases that show it."""
    bugs: dict[str, list[Case]] = {}
    for case in cases:
        if case.bug is not None:
            bugs.setdefault(case.bug, []).append(case)
    return ([c for c in cases if c.bug is None],
            [pytest.param(group, id=" + ".join(c.name for c in group), marks=xbug(bug))
             for bug, group in bugs.items()])


def refusals(api: Pool, seeded: Jobs, raw: redis.Redis, cases: list[Case]) -> dict[str, str]:
    """Run each case; what went wrong, by case name: not the expected typed error, or a write to Redis."""
    problems = {}
    for case in cases:
        before = keyspace(raw)
        try:
            case.call(api, seeded)
        except Exception as exc:  # noqa: BLE001 - judged below
            if not isinstance(exc, JobpoolError) or not isinstance(exc, case.expected):
                problems[case.name] = f"{type(exc).__module__}.{type(exc).__name__}: {str(exc)[:120]}"
        else:
            problems[case.name] = "accepted"
        if keyspace(raw) != before:
            problems[case.name] = problems.get(case.name, "refused") + ", and Redis was written to"
    return problems


@pytest.mark.parametrize("call", ID_CALLS)
def test_a_garbage_job_id_is_not_found_and_writes_nothing(api: Pool, seeded: Jobs, raw: redis.Redis,
                                                          call: str) -> None:
    ids = [i for i in GARBAGE_IDS if not (i is None and call in ("pause", "resume"))]  # None: the whole queue
    cases = [Case(repr(i)[:30], lambda p, j, i=i: ID_CALLS[call](p, i), NotFound) for i in ids]
    assert refusals(api, seeded, raw, cases) == {}


BAD_ARGUMENTS = [
    # list
    _case("list state unknown", lambda p, j: p.list("lost"), InvalidArgument),
    _case("list state int", lambda p, j: p.list(3), InvalidArgument),
    _case("list state list", lambda p, j: p.list(["queued"]), InvalidArgument),
    _case("list limit 0", lambda p, j: p.list(limit=0), InvalidArgument),
    _case("list limit negative", lambda p, j: p.list(limit=-1), InvalidArgument),
    _case("list limit bool", lambda p, j: p.list(limit=True), InvalidArgument),
    _case("list limit str", lambda p, j: p.list(limit="10"), InvalidArgument),
    _case("list limit None", lambda p, j: p.list(limit=None), InvalidArgument),
    _case("list limit huge", lambda p, j: p.list("queued", limit=2**64), InvalidArgument),
    _case("list all limit huge", lambda p, j: p.list(limit=10**30), InvalidArgument),
    # set_slots
    _case("slots negative", lambda p, j: p.set_slots(-1), InvalidArgument),
    _case("slots too many", lambda p, j: p.set_slots(100_001), InvalidArgument),
    _case("slots huge", lambda p, j: p.set_slots(2**64), InvalidArgument),
    _case("slots bool", lambda p, j: p.set_slots(True), InvalidArgument),
    _case("slots float", lambda p, j: p.set_slots(1.5), InvalidArgument),
    _case("slots str", lambda p, j: p.set_slots("3"), InvalidArgument),
    _case("slots None", lambda p, j: p.set_slots(None), InvalidArgument),
    # events
    _case("events count 0", lambda p, j: p.events(count=0), InvalidArgument),
    _case("events count negative", lambda p, j: p.events(count=-1), InvalidArgument),
    _case("events count str", lambda p, j: p.events(count="ten"), InvalidArgument),
    _case("events count huge", lambda p, j: p.events(count=2**64), InvalidArgument),
    _case("events after garbage", lambda p, j: p.events(after="yesterday"), InvalidArgument),
    _case("events after None", lambda p, j: p.events(after=None), InvalidArgument),
    # wait
    _case("wait state unknown", lambda p, j: p.wait(j["queued"].id, states=["lost"]), InvalidArgument),
    _case("wait states a bare str", lambda p, j: p.wait(j["queued"].id, states="lost"), InvalidArgument),
    _case("wait timeout str", lambda p, j: p.wait(j["queued"].id, timeout="soon"), InvalidArgument),
    _case("wait timeout None", lambda p, j: p.wait(j["queued"].id, timeout=None), InvalidArgument),
    _case("wait interval negative", lambda p, j: p.wait(j["running"].id, timeout=0.01, interval=-1),
          InvalidArgument),
    # control: reasons and attempts go to the scripts' ARGV
    _case("cancel reason None", lambda p, j: p.cancel(j["queued"].id, reason=None), InvalidArgument),
    _case("cancel reason dict", lambda p, j: p.cancel(j["queued"].id, reason={"why": 1}), InvalidArgument),
    _case("pause job reason None", lambda p, j: p.pause(j["queued"].id, reason=None), InvalidArgument),
    _case("pause queue reason None", lambda p, j: p.pause(None, reason=None), InvalidArgument),
    _case("evict attempt None", lambda p, j: p.evict(j["running"].id, None), InvalidArgument),
    _case("evict attempt not a number", lambda p, j: p.evict(j["running"].id, "first"), JobpoolError),
    _case("evict reason None", lambda p, j: p.evict(j["running"].id, 1, reason=None), InvalidArgument),
    _case("cancel a finished job", lambda p, j: p.cancel(j["cancelled"].id), JobpoolError),
    _case("resume a queued job", lambda p, j: p.resume(j["queued"].id), JobpoolError),
]


ARGUMENTS_OK, ARGUMENT_BUGS = split(BAD_ARGUMENTS)


def test_bad_arguments_are_typed_errors_and_write_nothing(api: Pool, seeded: Jobs, raw: redis.Redis) -> None:
    assert refusals(api, seeded, raw, ARGUMENTS_OK) == {}


BAD_SPECS = [
    _case("image None", lambda p, j: p.enqueue(None, ["true"]), InvalidSpec),
    _case("image int", lambda p, j: p.enqueue(5, ["true"]), InvalidSpec),
    _case("image huge", lambda p, j: p.enqueue(HUGE, ["true"]), InvalidSpec),
    _case("command None", lambda p, j: p.enqueue(IMAGE, None), InvalidSpec),
    _case("command a str", lambda p, j: p.enqueue(IMAGE, "echo hi"), InvalidSpec),
    _case("command empty", lambda p, j: p.enqueue(IMAGE, []), InvalidSpec),
    _case("command of ints", lambda p, j: p.enqueue(IMAGE, [1, 2]), InvalidSpec),
    _case("command a dict", lambda p, j: p.enqueue(IMAGE, {"sh": "-c"}), InvalidSpec),
    _case("command huge", lambda p, j: p.enqueue(IMAGE, ["x" * 60_000] * 5), InvalidSpec),
    _case("command lone surrogate", lambda p, j: p.enqueue(IMAGE, ["\udcff"]), InvalidSpec),
    _case("env a list", lambda p, j: p.enqueue(IMAGE, ["true"], env=["A=1"]), InvalidSpec),
    _case("env value None", lambda p, j: p.enqueue(IMAGE, ["true"], env={"A": None}), InvalidSpec),
    _case("env name digit", lambda p, j: p.enqueue(IMAGE, ["true"], env={"1A": "x"}), InvalidSpec),
    _case("env name braces", lambda p, j: p.enqueue(IMAGE, ["true"], env={"{A}": "x"}), InvalidSpec),
    _case("env name newline", lambda p, j: p.enqueue(IMAGE, ["true"], env={"A\n": "x"}), InvalidSpec),
    _case("labels a str", lambda p, j: p.enqueue(IMAGE, ["true"], labels="a=b"), InvalidSpec),
    _case("labels value int", lambda p, j: p.enqueue(IMAGE, ["true"], labels={"a": 1}), InvalidSpec),
    _case("labels reserved", lambda p, j: p.enqueue(IMAGE, ["true"], labels={"jobpool.pool": "x"}),
          InvalidSpec),
    _case("labels empty key", lambda p, j: p.enqueue(IMAGE, ["true"], labels={"": "x"}), InvalidSpec),
    _case("mounts outside roots", lambda p, j: p.enqueue(IMAGE, ["true"], mounts=["/etc:/d"]), InvalidSpec),
    _case("mounts a str", lambda p, j: p.enqueue(IMAGE, ["true"], mounts="/a:/b"), InvalidSpec),
    _case("mounts of None", lambda p, j: p.enqueue(IMAGE, ["true"], mounts=[None]), InvalidSpec),
    _case("network host", lambda p, j: p.enqueue(IMAGE, ["true"], network="host"), InvalidSpec),
    _case("network container", lambda p, j: p.enqueue(IMAGE, ["true"], network="container:x"), InvalidSpec),
    _case("network None", lambda p, j: p.enqueue(IMAGE, ["true"], network=None), InvalidSpec),
    _case("cpus bool", lambda p, j: p.enqueue(IMAGE, ["true"], cpus=True), InvalidSpec),
    _case("cpus negative", lambda p, j: p.enqueue(IMAGE, ["true"], cpus=-1), InvalidSpec),
    _case("cpus nan", lambda p, j: p.enqueue(IMAGE, ["true"], cpus=float("nan")), InvalidSpec),
    _case("cpus str", lambda p, j: p.enqueue(IMAGE, ["true"], cpus="2"), InvalidSpec),
    _case("memory unit", lambda p, j: p.enqueue(IMAGE, ["true"], memory="lots"), InvalidSpec),
    _case("memory int", lambda p, j: p.enqueue(IMAGE, ["true"], memory=512), InvalidSpec),
    _case("memory newline", lambda p, j: p.enqueue(IMAGE, ["true"], memory="512m\n"), InvalidSpec),
    _case("workdir relative", lambda p, j: p.enqueue(IMAGE, ["true"], workdir="tmp"), InvalidSpec),
    _case("user int", lambda p, j: p.enqueue(IMAGE, ["true"], user=0), InvalidSpec),
    _case("unknown field", lambda p, j: p.enqueue(IMAGE, ["true"], privileged=True), InvalidSpec),
    _case("coalesce_key int", lambda p, j: p.enqueue(IMAGE, ["true"], coalesce_key=5), InvalidSpec),
    _case("coalesce_key empty", lambda p, j: p.enqueue(IMAGE, ["true"], coalesce_key=""), InvalidSpec),
    _case("coalesce_key list", lambda p, j: p.enqueue(IMAGE, ["true"], coalesce_key=["k"]), InvalidSpec),
    _case("coalesce_key huge",
          lambda p, j: p.enqueue(IMAGE, ["true"], coalesce_key="k" * (MAX_SPEC_BYTES + 1)), InvalidSpec),
]


SPECS_OK, SPEC_BUGS = split(BAD_SPECS)


def test_bad_specs_are_invalid_spec_and_write_nothing(api: Pool, seeded: Jobs, raw: redis.Redis) -> None:
    assert refusals(api, seeded, raw, SPECS_OK) == {}


def test_odd_but_valid_input_round_trips(api: Pool, seeded: Jobs) -> None:
    """Garbage-looking values that are legal (braces, newlines, unicode in values) are stored verbatim and
    do not leak into key names."""
    weird = "{pool} a\nb \u2603 '\"; DROP"
    job = api.enqueue(IMAGE, ["echo", weird], env={"A": weird}, labels={"k": weird}, coalesce_key=weird)
    again = api.enqueue(IMAGE, ["other"], coalesce_key=weird)
    assert again.id == job.id and again.coalesced
    got = api.get(job.id)
    assert got.spec.command == ("echo", weird) and got.spec.env == {"A": weird}
    assert all(k.startswith(("jobpool:{it}:", "rq:")) for k in api.client.keys("*"))


FROM_URL = [
    # (url or None for the test server's, pool name, settings, the variable the message must name, bug)
    ("http://127.0.0.1/", "default", {}, "JOBPOOL_REDIS_URL", None),
    ("", "default", {}, "JOBPOOL_REDIS_URL", None),
    (5, "default", {}, "JOBPOOL_REDIS_URL", None),
    ("redis://127.0.0.1:notaport/0", "default", {}, "JOBPOOL_REDIS_URL", None),
    ("redis://[::1/0", "default", {}, "JOBPOOL_REDIS_URL", None),
    (None, "a b", {}, "JOBPOOL_POOL", None),
    (None, "", {}, "JOBPOOL_POOL", None),
    (None, "{p}", {}, "JOBPOOL_POOL", None),
    (None, "x" * 65, {}, "JOBPOOL_POOL", None),
    (None, 5, {}, "JOBPOOL_POOL", None),
    (None, "p\n", {}, "JOBPOOL_POOL", None),
    (None, "p", {"max_concurrent_jobs": -1}, "JOBPOOL_MAX_CONCURRENT_JOBS", None),
    (None, "p", {"max_concurrent_jobs": "3"}, "JOBPOOL_MAX_CONCURRENT_JOBS", None),
    (None, "p", {"recovery_budget": True}, "JOBPOOL_RECOVERY_BUDGET", None),
    (None, "p", {"drain_timeout_secs": 1.5}, "JOBPOOL_DRAIN_TIMEOUT_SECS", None),
    (None, "p", {"heartbeat_secs": float("nan")}, "JOBPOOL_HEARTBEAT_SECS", None),
    (None, "p", {"lease_secs": 1.0}, "JOBPOOL_LEASE_SECS", None),
    (None, "p", {"executor": "podman"}, "JOBPOOL_EXECUTOR", None),
    (None, "p", {"bind_roots": ("relative",)}, "JOBPOOL_BIND_ROOTS", None),
]


def from_url_problems(redis_url: str, cases: list[tuple[Any, ...]]) -> dict[str, str]:
    problems = {}
    for url, name, settings, variable, _ in cases:
        label = f"{url!r} {name!r} {settings!r}"[:60]
        try:
            Pool.from_url(redis_url if url is None else url, name=name, **settings).client.close()
        except ConfigError as exc:
            if variable not in str(exc):
                problems[label] = f"ConfigError not naming {variable}: {exc}"
        except Exception as exc:  # noqa: BLE001 - reported
            problems[label] = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
        else:
            problems[label] = "accepted"
    return problems


def test_from_url_with_a_bad_url_name_or_setting_is_config_error_naming_it(redis_url: str) -> None:
    assert from_url_problems(redis_url, [c for c in FROM_URL if c[4] is None]) == {}


def test_redis_down_is_redis_unavailable_everywhere(redis_server_factory: Callable[[], Any],
                                                    pool_env: dict[str, str]) -> None:
    server = redis_server_factory()
    server.start()
    pool = Pool.from_env(env={**pool_env, "JOBPOOL_REDIS_URL": server.url})
    job = pool.enqueue(IMAGE, ["true"])
    server.stop()
    calls: dict[str, Callable[[], Any]] = {
        "enqueue": lambda: pool.enqueue(IMAGE, ["true"]), "promote": pool.promote,
        "get": lambda: pool.get(job.id), "list": pool.list, "list state": lambda: pool.list("queued"),
        "logs": lambda: pool.logs(job.id), "slots": pool.slots, "stats": pool.stats, "events": pool.events,
        "wait": lambda: pool.wait(job.id, timeout=0.01), "cancel": lambda: pool.cancel(job.id),
        "pause job": lambda: pool.pause(job.id), "pause queue": lambda: pool.pause(),
        "resume job": lambda: pool.resume(job.id), "resume queue": lambda: pool.resume(),
        "set_slots": lambda: pool.set_slots(2), "evict": lambda: pool.evict(job.id, 1),
        "sweep_once": lambda: sweep_once(pool),
    }
    wrong = {}
    for name, call in calls.items():
        try:
            call()
        except RedisUnavailable:
            continue
        except BaseException as exc:  # noqa: BLE001 - collected and reported below
            wrong[name] = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
        else:
            wrong[name] = "returned"
    pool.client.close()
    assert wrong == {}


# ---- the CLI's environment: every JOBPOOL_* variable with a bad value ----------------------------------

BAD_ENV = [
    ("JOBPOOL_REDIS_URL", "http://127.0.0.1/"),
    ("JOBPOOL_REDIS_URL", "127.0.0.1:6379"),
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
        "JOBPOOL_BIND_ROOTS"}
    raw.set("canary", "1")
    before = keyspace(raw)
    runs = [(("ls",), var, value) for var, value in first.items()]
    runs += [(("worker",), "JOBPOOL_EXECUTOR", "podman"), (("worker",), "JOBPOOL_LEASE_SECS", "1"),
             (("supervisor", "--once"), "JOBPOOL_SWEEP_INTERVAL_SECS", "0"),
             (("supervisor", "--once"), "JOBPOOL_PROBE_TIMEOUT_SECS", "601")]
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


# ---- rows edited by hand to garbage ------------------------------------------------------------------

def _set(field: str, value: str) -> Callable[[redis.Redis, str], Any]:
    return lambda raw, key: raw.hset(key, field, value)


def _not_a_hash(raw: redis.Redis, key: str) -> None:
    raw.delete(key)
    raw.set(key, "garbage")


#: How to spoil a job's hash, by kind.
GARBAGE_ROWS: dict[str, Callable[[redis.Redis, str], Any]] = {
    "spec not JSON": _set("spec", "{not json"),
    "spec wrong shape": _set("spec", '["image"]'),
    "spec missing fields": _set("spec", '{"image": "x"}'),
    "spec unknown field": _set("spec", '{"image": "x", "command": ["true"], "privileged": true}'),
    "attempt not a number": _set("attempt", "x"),
    "seq missing": lambda raw, key: raw.hdel(key, "seq"),
    "created_at empty": _set("created_at", ""),
    "exit_code not a number": _set("exit_code", "x"),
    "state unknown": _set("state", "bogus"),
    "key not a hash": _not_a_hash,
    "hash deleted, id still indexed": lambda raw, key: raw.delete(key),
}
GARBAGE_ROW_GROUPS = [
    pytest.param(["spec not JSON", "spec wrong shape", "spec missing fields", "spec unknown field"],
                 id="spec"),
    pytest.param(["attempt not a number", "seq missing", "created_at empty", "exit_code not a number"],
                 id="numbers"),
    pytest.param(["state unknown"], id="state"),
    pytest.param(["key not a hash"], id="not a hash"),
    pytest.param(["hash deleted, id still indexed"], id="deleted"),
]


@pytest.mark.parametrize("kinds", GARBAGE_ROW_GROUPS)
def test_a_garbage_row_is_a_typed_error_for_get_and_skipped_by_list(api: Pool, seeded: Jobs, raw: redis.Redis,
                                                                    kinds: list[str]) -> None:
    good = [j.id for j in seeded.values()]
    before = rows(api, good)
    victims = {}
    for kind in kinds:
        victims[kind] = api.enqueue(IMAGE, ["echo", kind]).id  # queued, behind seeded["queued"]
        GARBAGE_ROWS[kind](raw, api.keys.job(victims[kind]))
    problems: dict[str, str] = {}
    for kind, victim in victims.items():
        try:
            api.get(victim)
            problems[kind] = "get returned a Job"
        except Exception as exc:  # noqa: BLE001 - judged here
            if not isinstance(exc, JobpoolError):
                problems[kind] = f"get raised a bare {type(exc).__name__}: {exc}"
    for name, call, want in (("list()", api.list, sorted(good)),
                             ("list(queued)", lambda: api.list("queued"), [seeded["queued"].id]),
                             ("list(PAUSED)", lambda: api.list(JobState.PAUSED), [seeded["paused"].id])):
        try:
            got = sorted(j.id for j in call())
        except Exception as exc:  # noqa: BLE001 - judged here
            problems[name] = f"raised {type(exc).__name__}: {exc}"
        else:
            if got != want:
                problems[name] = f"{got} instead of {want}"
    api.stats()
    for kind, victim in victims.items():
        try:  # cancelling a garbage job may work (a way to be rid of it) or be refused, with a typed error
            api.cancel(victim)
        except Exception as exc:  # noqa: BLE001 - judged here
            if not isinstance(exc, JobpoolError):
                problems[f"cancel {kind}"] = f"raised a bare {type(exc).__name__}: {exc}"
    assert problems == {}
    assert rows(api, good) == before


def test_the_cli_reports_a_garbage_row_in_one_line_and_lists_the_good_ones(api: Pool, seeded: Jobs,
                                                                          raw: redis.Redis, redis_url: str,
                                                                          tmp_path: Path) -> None:
    victims = {}
    for kind in ("spec not JSON", "state unknown", "key not a hash"):
        victims[kind] = api.enqueue(IMAGE, ["echo", kind]).id
        GARBAGE_ROWS[kind](raw, api.keys.job(victims[kind]))
    env = {"JOBPOOL_REDIS_URL": redis_url, "JOBPOOL_POOL": "it"}
    commands = [("show", job_id) for job_id in victims.values()] + [("ls",), ("ls", "--json")]
    with ThreadPoolExecutor(max_workers=len(commands)) as workers:
        outputs = workers.map(lambda c: cli(*c, env=env, cwd=tmp_path), commands)
        results = dict(zip(commands, outputs, strict=True))
    problems = {c: one_line_error(results[c], 1) for c in commands if c[0] == "show"}
    ls, ls_json = results[("ls",)], results[("ls", "--json")]
    if ls.returncode != 0 or "Traceback" in ls.stderr:
        problems[("ls",)] = f"exit {ls.returncode}: {ls.stderr.strip().splitlines()[-1:]}"
    elif ls_json.returncode != 0 or sorted(j["id"] for j in json.loads(ls_json.stdout)) != sorted(
            j.id for j in seeded.values()):
        problems[("ls", "--json")] = f"exit {ls_json.returncode}: {ls_json.stdout[:200]!r}"
    assert {c: p for c, p in problems.items() if p} == {}


# A head of the queue that promotion cannot use must not wedge the queue behind it ("the queue never wedges").
WEDGES = {
    "hash deleted, id still queued": (lambda raw, key: raw.delete(key), None),
    "attempt not a number": (_set("attempt", "x"), None),
    "key not a hash": (_not_a_hash, None),
    "state unknown": (_set("state", "bogus"), None),
    "spec not JSON": (_set("spec", "{not json"), None),
}


@pytest.mark.parametrize("kind", [
    pytest.param(kind, marks=[xbug(bug)] if bug else []) for kind, (_, bug) in WEDGES.items()
])
def test_a_garbage_head_of_the_queue_does_not_wedge_promotion(api: Pool, raw: redis.Redis, kind: str) -> None:
    api.set_slots(0)
    head = api.enqueue(IMAGE, ["echo", "head"])
    behind = api.enqueue(IMAGE, ["echo", "behind"])
    WEDGES[kind][0](raw, api.keys.job(head.id))
    try:
        api.set_slots(3)  # room for the head (if it is promotable), the job behind it, and one more
    except JobpoolError as exc:
        pytest.fail(f"set_slots raised {type(exc).__name__}: {exc}")
    assert api.get(behind.id).state is JobState.RUNNING, "the job behind the head was not promoted"
    try:
        late = api.enqueue(IMAGE, ["echo", "late"])
    except JobpoolError as exc:
        pytest.fail(f"enqueue raised {type(exc).__name__}: {exc}")
    assert api.get(late.id).state is JobState.RUNNING


# ---- the supervisor sweeps past garbage ----------------------------------------------------------------

def _running_claimed(pool: Pool, boot: str, name: str) -> str:
    job = pool.enqueue(IMAGE, ["echo", name])
    assert pool.get(job.id).state is JobState.RUNNING
    claim(pool, job.id, boot)
    return job.id


def test_a_sweep_survives_garbage_running_rows_and_leaves_the_others_alone(
        api: Pool, raw: redis.Redis, docker_host: str, pool_env: dict[str, str], tmp_path: Path) -> None:
    api.set_slots(20)
    # The good ones: a running job whose owner holds its lease, a finished one, a paused one.
    live = _running_claimed(api, "liveboot", "live")
    raw.pexpire(api.keys.lease(live), 120_000)
    done = _running_claimed(api, "oldboot", "done")
    Attempt(api, done, "oldboot", 1).finish("exit", 0)
    paused = api.enqueue(IMAGE, ["echo", "paused"]).id
    api.pause(paused)
    good = [live, done, paused]
    # The garbage: running rows of a gone boot, spoilt in one way each.
    spoil = {
        "lease garbage": lambda key, lease: raw.set(lease, "garbage"),
        "lease not a string": lambda key, lease: (raw.delete(lease), raw.hset(lease, "a", "b")),
        "hash deleted": lambda key, lease: raw.delete(key),
        "state unknown": lambda key, lease: raw.hset(key, "state", "bogus"),
        "attempt not a number": lambda key, lease: raw.hset(key, "attempt", "x"),
        "spec not JSON": lambda key, lease: raw.hset(key, "spec", "{not json"),
        "owner with braces": lambda key, lease: raw.hset(key, "owner_boot", "{it} a\nb"),
        "claimed_at garbage": lambda key, lease: raw.hset(key, "claimed_at", "soon"),
    }
    for kind, how in spoil.items():
        job_id = _running_claimed(api, "goneboot", kind)
        raw.delete(api.keys.lease(job_id))
        how(api.keys.job(job_id), api.keys.lease(job_id))
    before = rows(api, good)

    report = sweep_once(api)
    assert report.rows >= 1
    result = cli("supervisor", "--once", env={**pool_env, "DOCKER_HOST": docker_host}, cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "sweep of pool it failed" not in result.stderr, result.stderr[-2000:]
    assert rows(api, good) == before
    assert raw.exists(api.keys.lease(live))


SWEEP_ABORTS = {
    "key not a hash": (_not_a_hash, None),
    "recovery_attempts garbage": (_set("recovery_attempts", "-x"), None),
}


@pytest.mark.parametrize("kind", [
    pytest.param("nothing spoilt (control)"),
    *(pytest.param(k, marks=[xbug(bug)] if bug else []) for k, (_, bug) in SWEEP_ABORTS.items()),
])
def test_one_garbage_running_row_does_not_abort_the_sweep(pool_env: dict[str, str], raw: redis.Redis,
                                                          docker_host: str, kind: str) -> None:
    api = Pool.from_env(env={**pool_env, "JOBPOOL_RECOVERY_BUDGET": "0"})
    try:
        api.set_slots(2)
        spoilt = _running_claimed(api, "goneboot", "spoilt")
        orphan = _running_claimed(api, "goneboot", "orphan")  # its container never existed: absent -> failed
        raw.zadd(api.keys.running, {spoilt: 1})  # judged first
        raw.delete(api.keys.lease(spoilt), api.keys.lease(orphan))
        waiting = api.enqueue(IMAGE, ["echo", "waiting"])
        if kind in SWEEP_ABORTS:
            SWEEP_ABORTS[kind][0](raw, api.keys.job(spoilt))
        sweep_once(api)
        assert api.get(orphan).state is JobState.FAILED
        assert api.get(waiting.id).state is JobState.RUNNING
    finally:
        api.client.close()


GHOST_SLOTS = {
    "hash deleted": (lambda raw, key, lease: raw.delete(key), None),
    "lease garbage": (lambda raw, key, lease: raw.set(lease, "garbage"), None),
    "lease not a string": (lambda raw, key, lease: raw.hset(lease, "a", "b"), None),
}


@pytest.mark.parametrize("kind", [
    pytest.param("nothing spoilt (control)"),
    *(pytest.param(k, marks=[xbug(bug)] if bug else []) for k, (_, bug) in GHOST_SLOTS.items()),
])
def test_a_sweep_frees_the_slot_of_a_dead_job_whatever_its_row_holds(pool_env: dict[str, str],
                                                                     raw: redis.Redis, docker_host: str,
                                                                     kind: str) -> None:
    api = Pool.from_env(env={**pool_env, "JOBPOOL_RECOVERY_BUDGET": "0"})
    try:
        api.set_slots(1)
        dead = _running_claimed(api, "goneboot", "dead")  # its boot and container are gone
        raw.delete(api.keys.lease(dead))
        waiting = api.enqueue(IMAGE, ["echo", "waiting"])
        if kind in GHOST_SLOTS:
            GHOST_SLOTS[kind][0](raw, api.keys.job(dead), api.keys.lease(dead))
        sweep_once(api)
        sweep_once(api)
        if kind == "hash deleted":
            # Without its row nothing says which daemon it ran on: an unattended sweep keeps the slot
            # (jobpool/daemonid.py); the operator's sweep frees it.
            assert api.client.zscore(api.keys.running, dead) is not None
            reconcile(api, evict_stale=True)
        assert api.client.zscore(api.keys.running, dead) is None, "the dead job still holds its slot"
        assert api.get(waiting.id).state is JobState.RUNNING
    finally:
        api.client.close()


# ---- workers: junk on the RQ queue, garbage rows, and a good job after -----------------------------------

@pytest.fixture
def sub_pool(pool_env: dict[str, str]) -> Iterator[Pool]:
    pool = Pool.from_env(env={**pool_env, **SUB})
    yield pool
    pool.client.close()


def _alive(*procs: JobpoolProcess) -> bool:
    """True while every process runs; fails at once (not at a polling deadline) when one has died."""
    for p in procs:
        code = p.proc.poll()
        if code is not None:
            raise AssertionError(f"{p.log_path.name} exited with {code}:\n{p.log()[-3000:]}")
    return True


def _runs_to_success(pool: Pool, job_id: str, procs: tuple[JobpoolProcess, ...], timeout: float) -> Job:
    def done() -> Job | None:
        _alive(*procs)
        job = pool.get(job_id)
        assert job.state not in (JobState.FAILED, JobState.CANCELLED), (job, pool.logs(job_id))
        return job if job.state is JobState.SUCCEEDED else None

    return eventually(done, timeout=timeout, message=f"job {job_id} succeeded")


def test_a_worker_skips_junk_rq_ids_and_stale_attempts_and_runs_the_next_job(
        sub_pool: Pool, raw: redis.Redis, spawn: Callable[..., JobpoolProcess]) -> None:
    pool = sub_pool
    pool.set_slots(5)
    # A job that already ran (its RQ job hash is still there): a late duplicate delivery of attempt 1.
    done = pool.enqueue("ignored", ["sh", "-c", "echo done"])
    raw.lrem(pool.keys.rq_queue, 0, done.id)
    Attempt(pool, done.id, "oldboot", 1).claim()
    Attempt(pool, done.id, "oldboot", 1).finish("exit", 0)
    # A running job another (live) boot owns: a duplicate delivery of its current attempt.
    owned = pool.enqueue("ignored", ["sh", "-c", "echo owned"])
    raw.lrem(pool.keys.rq_queue, 0, owned.id)
    claim(pool, owned.id, "otherboot")
    raw.pexpire(pool.keys.lease(owned.id), 120_000)
    # A queued job not yet promoted (its RQ job hash says 'created'): delivered before its time.
    pool.pause()
    early = pool.enqueue("ignored", ["sh", "-c", "echo early"])
    # Garbage rows no worker was asked about: they must not matter.
    spoilt = pool.enqueue("ignored", ["sh", "-c", "echo spoilt"])
    pool.pause(spoilt.id)
    raw.hset(pool.keys.job(spoilt.id), "spec", "{not json")
    raw.zadd(pool.keys.running, {"ghost" + UNKNOWN_ID[5:]: 1})
    raw.set(pool.keys.lease(UNKNOWN_ID), "garbage")
    others = [done.id, owned.id]
    before = rows(pool, others)
    raw.rpush(pool.keys.rq_queue, UNKNOWN_ID, done.id, owned.id, early.id)
    raw.sadd("rq:queues", pool.keys.rq_queue)

    worker = spawn(**SUB)
    eventually(lambda: _alive(worker) and raw.llen(pool.keys.rq_queue) == 0, timeout=20,
               message="the worker took every junk id")
    eventually(lambda: _alive(worker) and worker.log().count("not claimed") >= 3, timeout=10,
               message="the worker refused the three stale deliveries")
    assert pool.get(early.id).state is JobState.QUEUED and pool.get(early.id).attempt == 0
    pool.resume()
    good = pool.enqueue("ignored", ["sh", "-c", "echo good"])
    assert _runs_to_success(pool, early.id, (worker,), 20).attempt == 1
    _runs_to_success(pool, good.id, (worker,), 20)
    assert pool.logs(early.id).strip() == "early" and pool.logs(good.id).strip() == "good"
    assert rows(pool, others) == before
    _alive(worker)


@pytest.mark.parametrize("junk", [
    pytest.param("id"),
    pytest.param("hash"),
])
def test_a_worker_survives_an_rq_entry_rq_cannot_load(sub_pool: Pool, raw: redis.Redis,
                                                      spawn: Callable[..., JobpoolProcess],
                                                      junk: str) -> None:
    pool = sub_pool
    pool.set_slots(1)
    if junk == "id":
        raw.rpush(pool.keys.rq_queue, "not a {job} id\n")
    else:
        raw.hset("rq:job:" + UNKNOWN_ID, mapping={"created_at": "x", "data": "garbage", "status": "queued"})
        raw.rpush(pool.keys.rq_queue, UNKNOWN_ID)
    raw.sadd("rq:queues", pool.keys.rq_queue)
    worker = spawn(**SUB)
    eventually(lambda: _alive(worker) and raw.llen(pool.keys.rq_queue) == 0, timeout=20,
               message="the worker took the junk")
    good = pool.enqueue("ignored", ["sh", "-c", "echo good"])
    _runs_to_success(pool, good.id, (worker,), 15)


def test_a_worker_ends_a_job_whose_spec_is_garbage_and_runs_the_next(
        sub_pool: Pool, raw: redis.Redis, spawn: Callable[..., JobpoolProcess]) -> None:
    pool = sub_pool
    pool.set_slots(0)
    bad = pool.enqueue("ignored", ["sh", "-c", "echo bad"])
    raw.hset(pool.keys.job(bad.id), "spec", "{not json")
    good = pool.enqueue("ignored", ["sh", "-c", "echo good"])
    procs = (spawn(**SUB), spawn(module="jobpool.cli", args=("supervisor",), **SUB))
    pool.set_slots(1)
    state = lambda: raw.hget(pool.keys.job(bad.id), "state")  # noqa: E731 - get() cannot read this row
    eventually(lambda: _alive(*procs) and state() != b"queued", timeout=10,
               message="the bad job was promoted")
    _runs_to_success(pool, good.id, procs, 10)
    assert state() == b"failed"
