"""Bad input through the Python API, on a real redis-server: wrong types and values for every `Pool` method,
a bad URL, pool name or setting, and Redis down.

Every refusal is a `JobpoolError` subclass, never a bare KeyError/ValueError/TypeError or a redis-py error,
and a refused call writes nothing: the whole keyspace (tests/support/snapshot.py) is compared before and after
each call, with a job in each state present (the `seeded` fixture, tests/integration/conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
import redis

from jobpool import (
    ConfigError,
    InvalidArgument,
    InvalidSpec,
    JobpoolError,
    NotFound,
    Pool,
    RedisUnavailable,
)
from jobpool.spec import MAX_SPEC_BYTES
from jobpool.supervisor import sweep_once
from tests.support.bad_input import HUGE, UNKNOWN_ID, Jobs
from tests.support.constants import IMAGE
from tests.support.snapshot import keyspace

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
    #: The pool is `Any` to the type checker: the cases pass it wrong types on purpose.
    call: Callable[[Any, Jobs], Any]
    expected: type[JobpoolError] | tuple[type[JobpoolError], ...]


def refusals(pool: Pool, seeded: Jobs, raw: redis.Redis, cases: list[Case]) -> dict[str, str]:
    """Run each case; what went wrong, by case name: not the expected typed error, or a write to Redis."""
    problems = {}
    for case in cases:
        before = keyspace(raw)
        try:
            case.call(pool, seeded)
        except Exception as exc:  # noqa: BLE001 - judged below
            if not isinstance(exc, JobpoolError) or not isinstance(exc, case.expected):
                problems[case.name] = f"{type(exc).__module__}.{type(exc).__name__}: {str(exc)[:120]}"
        else:
            problems[case.name] = "accepted"
        if keyspace(raw) != before:
            problems[case.name] = problems.get(case.name, "refused") + ", and Redis was written to"
    return problems


def calling(call: Callable[[Pool, Any], Any], job_id: Any) -> Callable[[Any, Jobs], Any]:
    return lambda p, j: call(p, job_id)


@pytest.mark.parametrize("call", ID_CALLS)
def test_a_garbage_job_id_is_not_found_and_writes_nothing(pool: Pool, seeded: Jobs, raw: redis.Redis,
                                                          call: str) -> None:
    ids = [i for i in GARBAGE_IDS if not (i is None and call in ("pause", "resume"))]  # None: the whole queue
    cases = [Case(repr(i)[:30], calling(ID_CALLS[call], i), NotFound) for i in ids]
    assert refusals(pool, seeded, raw, cases) == {}


BAD_ARGUMENTS = [
    # list
    Case("list state unknown", lambda p, j: p.list("lost"), InvalidArgument),
    Case("list state int", lambda p, j: p.list(3), InvalidArgument),
    Case("list state list", lambda p, j: p.list(["queued"]), InvalidArgument),
    Case("list limit 0", lambda p, j: p.list(limit=0), InvalidArgument),
    Case("list limit negative", lambda p, j: p.list(limit=-1), InvalidArgument),
    Case("list limit bool", lambda p, j: p.list(limit=True), InvalidArgument),
    Case("list limit str", lambda p, j: p.list(limit="10"), InvalidArgument),
    Case("list limit None", lambda p, j: p.list(limit=None), InvalidArgument),
    Case("list limit huge", lambda p, j: p.list("queued", limit=2**64), InvalidArgument),
    Case("list all limit huge", lambda p, j: p.list(limit=10**30), InvalidArgument),
    # set_slots
    Case("slots negative", lambda p, j: p.set_slots(-1), InvalidArgument),
    Case("slots too many", lambda p, j: p.set_slots(100_001), InvalidArgument),
    Case("slots huge", lambda p, j: p.set_slots(2**64), InvalidArgument),
    Case("slots bool", lambda p, j: p.set_slots(True), InvalidArgument),
    Case("slots float", lambda p, j: p.set_slots(1.5), InvalidArgument),
    Case("slots str", lambda p, j: p.set_slots("3"), InvalidArgument),
    Case("slots None", lambda p, j: p.set_slots(None), InvalidArgument),
    # events
    Case("events count 0", lambda p, j: p.events(count=0), InvalidArgument),
    Case("events count negative", lambda p, j: p.events(count=-1), InvalidArgument),
    Case("events count str", lambda p, j: p.events(count="ten"), InvalidArgument),
    Case("events count huge", lambda p, j: p.events(count=2**64), InvalidArgument),
    Case("events after garbage", lambda p, j: p.events(after="yesterday"), InvalidArgument),
    Case("events after None", lambda p, j: p.events(after=None), InvalidArgument),
    # wait
    Case("wait state unknown", lambda p, j: p.wait(j["queued"].id, states=["lost"]), InvalidArgument),
    Case("wait states a bare str", lambda p, j: p.wait(j["queued"].id, states="lost"), InvalidArgument),
    Case("wait timeout str", lambda p, j: p.wait(j["queued"].id, timeout="soon"), InvalidArgument),
    Case("wait timeout None", lambda p, j: p.wait(j["queued"].id, timeout=None), InvalidArgument),
    Case("wait interval negative", lambda p, j: p.wait(j["running"].id, timeout=0.01, interval=-1),
         InvalidArgument),
    # control: reasons and attempts go to the scripts' ARGV
    Case("cancel reason None", lambda p, j: p.cancel(j["queued"].id, reason=None), InvalidArgument),
    Case("cancel reason dict", lambda p, j: p.cancel(j["queued"].id, reason={"why": 1}), InvalidArgument),
    Case("pause job reason None", lambda p, j: p.pause(j["queued"].id, reason=None), InvalidArgument),
    Case("pause queue reason None", lambda p, j: p.pause(None, reason=None), InvalidArgument),
    Case("evict attempt None", lambda p, j: p.evict(j["running"].id, None), InvalidArgument),
    Case("evict attempt not a number", lambda p, j: p.evict(j["running"].id, "first"), JobpoolError),
    Case("evict reason None", lambda p, j: p.evict(j["running"].id, 1, reason=None), InvalidArgument),
    Case("cancel a finished job", lambda p, j: p.cancel(j["cancelled"].id), JobpoolError),
    Case("resume a queued job", lambda p, j: p.resume(j["queued"].id), JobpoolError),
]


def test_bad_arguments_are_typed_errors_and_write_nothing(pool: Pool, seeded: Jobs, raw: redis.Redis) -> None:
    assert refusals(pool, seeded, raw, BAD_ARGUMENTS) == {}


BAD_SPECS = [
    Case("image None", lambda p, j: p.enqueue(None, ["true"]), InvalidSpec),
    Case("image int", lambda p, j: p.enqueue(5, ["true"]), InvalidSpec),
    Case("image huge", lambda p, j: p.enqueue(HUGE, ["true"]), InvalidSpec),
    Case("command None", lambda p, j: p.enqueue(IMAGE, None), InvalidSpec),
    Case("command a str", lambda p, j: p.enqueue(IMAGE, "echo hi"), InvalidSpec),
    Case("command empty", lambda p, j: p.enqueue(IMAGE, []), InvalidSpec),
    Case("command of ints", lambda p, j: p.enqueue(IMAGE, [1, 2]), InvalidSpec),
    Case("command a dict", lambda p, j: p.enqueue(IMAGE, {"sh": "-c"}), InvalidSpec),
    Case("command huge", lambda p, j: p.enqueue(IMAGE, ["x" * 60_000] * 5), InvalidSpec),
    Case("command lone surrogate", lambda p, j: p.enqueue(IMAGE, ["\udcff"]), InvalidSpec),
    Case("env a list", lambda p, j: p.enqueue(IMAGE, ["true"], env=["A=1"]), InvalidSpec),
    Case("env value None", lambda p, j: p.enqueue(IMAGE, ["true"], env={"A": None}), InvalidSpec),
    Case("env name digit", lambda p, j: p.enqueue(IMAGE, ["true"], env={"1A": "x"}), InvalidSpec),
    Case("env name braces", lambda p, j: p.enqueue(IMAGE, ["true"], env={"{A}": "x"}), InvalidSpec),
    Case("env name newline", lambda p, j: p.enqueue(IMAGE, ["true"], env={"A\n": "x"}), InvalidSpec),
    Case("labels a str", lambda p, j: p.enqueue(IMAGE, ["true"], labels="a=b"), InvalidSpec),
    Case("labels value int", lambda p, j: p.enqueue(IMAGE, ["true"], labels={"a": 1}), InvalidSpec),
    Case("labels reserved", lambda p, j: p.enqueue(IMAGE, ["true"], labels={"jobpool.pool": "x"}),
         InvalidSpec),
    Case("labels empty key", lambda p, j: p.enqueue(IMAGE, ["true"], labels={"": "x"}), InvalidSpec),
    Case("mounts outside roots", lambda p, j: p.enqueue(IMAGE, ["true"], mounts=["/etc:/d"]), InvalidSpec),
    Case("mounts a str", lambda p, j: p.enqueue(IMAGE, ["true"], mounts="/a:/b"), InvalidSpec),
    Case("mounts of None", lambda p, j: p.enqueue(IMAGE, ["true"], mounts=[None]), InvalidSpec),
    Case("network host", lambda p, j: p.enqueue(IMAGE, ["true"], network="host"), InvalidSpec),
    Case("network container", lambda p, j: p.enqueue(IMAGE, ["true"], network="container:x"), InvalidSpec),
    Case("network None", lambda p, j: p.enqueue(IMAGE, ["true"], network=None), InvalidSpec),
    Case("cpus bool", lambda p, j: p.enqueue(IMAGE, ["true"], cpus=True), InvalidSpec),
    Case("cpus negative", lambda p, j: p.enqueue(IMAGE, ["true"], cpus=-1), InvalidSpec),
    Case("cpus nan", lambda p, j: p.enqueue(IMAGE, ["true"], cpus=float("nan")), InvalidSpec),
    Case("cpus str", lambda p, j: p.enqueue(IMAGE, ["true"], cpus="2"), InvalidSpec),
    Case("memory unit", lambda p, j: p.enqueue(IMAGE, ["true"], memory="lots"), InvalidSpec),
    Case("memory int", lambda p, j: p.enqueue(IMAGE, ["true"], memory=512), InvalidSpec),
    Case("memory newline", lambda p, j: p.enqueue(IMAGE, ["true"], memory="512m\n"), InvalidSpec),
    Case("workdir relative", lambda p, j: p.enqueue(IMAGE, ["true"], workdir="tmp"), InvalidSpec),
    Case("user int", lambda p, j: p.enqueue(IMAGE, ["true"], user=0), InvalidSpec),
    Case("unknown field", lambda p, j: p.enqueue(IMAGE, ["true"], privileged=True), InvalidSpec),
    Case("coalesce_key int", lambda p, j: p.enqueue(IMAGE, ["true"], coalesce_key=5), InvalidSpec),
    Case("coalesce_key empty", lambda p, j: p.enqueue(IMAGE, ["true"], coalesce_key=""), InvalidSpec),
    Case("coalesce_key list", lambda p, j: p.enqueue(IMAGE, ["true"], coalesce_key=["k"]), InvalidSpec),
    Case("coalesce_key huge",
         lambda p, j: p.enqueue(IMAGE, ["true"], coalesce_key="k" * (MAX_SPEC_BYTES + 1)), InvalidSpec),
]


def test_bad_specs_are_invalid_spec_and_write_nothing(pool: Pool, seeded: Jobs, raw: redis.Redis) -> None:
    assert refusals(pool, seeded, raw, BAD_SPECS) == {}


def test_odd_but_valid_input_round_trips(pool: Pool, seeded: Jobs) -> None:
    """Garbage-looking values that are legal (braces, newlines, unicode in values) are stored verbatim and
    do not leak into key names."""
    weird = "{pool} a\nb \u2603 '\"; DROP"
    job = pool.enqueue(IMAGE, ["echo", weird], env={"A": weird}, labels={"k": weird}, coalesce_key=weird)
    again = pool.enqueue(IMAGE, ["other"], coalesce_key=weird)
    assert again.id == job.id and again.coalesced
    got = pool.get(job.id)
    assert got.spec.command == ("echo", weird) and got.spec.env == {"A": weird}
    assert all(k.startswith(("jobpool:{it}:", "rq:")) for k in cast("list[str]", pool.store.client.keys("*")))


FROM_URL = [
    # (url or None for the test server's, pool name, settings, the variable the message must name)
    ("http://127.0.0.1/", "default", {}, "JOBPOOL_REDIS_URL"),
    ("", "default", {}, "JOBPOOL_REDIS_URL"),
    (5, "default", {}, "JOBPOOL_REDIS_URL"),
    ("redis://127.0.0.1:notaport/0", "default", {}, "JOBPOOL_REDIS_URL"),
    ("redis://[::1/0", "default", {}, "JOBPOOL_REDIS_URL"),
    (None, "a b", {}, "JOBPOOL_POOL"),
    (None, "", {}, "JOBPOOL_POOL"),
    (None, "{p}", {}, "JOBPOOL_POOL"),
    (None, "x" * 65, {}, "JOBPOOL_POOL"),
    (None, 5, {}, "JOBPOOL_POOL"),
    (None, "p\n", {}, "JOBPOOL_POOL"),
    (None, "p", {"max_concurrent_jobs": -1}, "JOBPOOL_MAX_CONCURRENT_JOBS"),
    (None, "p", {"max_concurrent_jobs": "3"}, "JOBPOOL_MAX_CONCURRENT_JOBS"),
    (None, "p", {"recovery_budget": True}, "JOBPOOL_RECOVERY_BUDGET"),
    (None, "p", {"drain_timeout_secs": 1.5}, "JOBPOOL_DRAIN_TIMEOUT_SECS"),
    (None, "p", {"heartbeat_secs": float("nan")}, "JOBPOOL_HEARTBEAT_SECS"),
    (None, "p", {"lease_secs": 1.0}, "JOBPOOL_LEASE_SECS"),
    (None, "p", {"executor": "podman"}, "JOBPOOL_EXECUTOR"),
    (None, "p", {"bind_roots": ("relative",)}, "JOBPOOL_BIND_ROOTS"),
    (None, "p", {"checkpoint_root": "relative/dir"}, "JOBPOOL_CHECKPOINT_ROOT"),
    (None, "p", {"metrics_port": 0}, "JOBPOOL_METRICS_PORT"),
    (None, "p", {"metrics_port": "9100"}, "JOBPOOL_METRICS_PORT"),
    (None, "p", {"metrics_port": True}, "JOBPOOL_METRICS_PORT"),
    (None, "p", {"metrics_host": "two words"}, "JOBPOOL_METRICS_HOST"),
    (None, "p", {"metrics_host": ""}, "JOBPOOL_METRICS_HOST"),
]


def from_url_problems(redis_url: str, cases: list[tuple[Any, ...]]) -> dict[str, str]:
    problems = {}
    for url, name, settings, variable in cases:
        label = f"{url!r} {name!r} {settings!r}"[:60]
        try:
            Pool.from_url(redis_url if url is None else url, name=name, **settings).store.client.close()
        except ConfigError as exc:
            if variable not in str(exc):
                problems[label] = f"ConfigError not naming {variable}: {exc}"
        except Exception as exc:  # noqa: BLE001 - reported
            problems[label] = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
        else:
            problems[label] = "accepted"
    return problems


def test_from_url_with_a_bad_url_name_or_setting_is_config_error_naming_it(redis_url: str) -> None:
    assert from_url_problems(redis_url, FROM_URL) == {}


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
        "pause job": lambda: pool.pause(job.id), "pause queue": pool.pause,
        "resume job": lambda: pool.resume(job.id), "resume queue": pool.resume,
        "set_slots": lambda: pool.set_slots(2), "evict": lambda: pool.evict(job.id, 1),
        "sweep_once": lambda: sweep_once(pool.store),
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
    pool.store.client.close()
    assert wrong == {}
