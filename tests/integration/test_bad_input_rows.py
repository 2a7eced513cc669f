"""Rows edited by hand in Redis to garbage, on a real redis-server and real processes.

A garbage row is refused by `get` with a typed error and skipped by `list` (one bad row must neither hide the
good ones nor wedge promotion for the jobs queued behind it); the CLI reports it in one line; the supervisor
sweeps past it and still frees the slots of dead jobs; a worker ends a job it cannot read and runs the next.
The rows of the other jobs are compared before and after.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from jobpool import Job, JobpoolError, JobState, Pool
from jobpool.supervisor import reconcile, sweep_once
from jobpool.workers.attempt import Attempt
from tests.support.attempts import claim
from tests.support.bad_input import Jobs, alive, cli, one_line_error, rows, runs_to_success
from tests.support.constants import IMAGE, SUB
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess


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
def test_a_garbage_row_is_a_typed_error_for_get_and_skipped_by_list(
        pool: Pool, seeded: Jobs, raw: redis.Redis, kinds: list[str]) -> None:
    good = [j.id for j in seeded.values()]
    before = rows(pool, good)
    victims = {}
    for kind in kinds:
        victims[kind] = pool.enqueue(IMAGE, ["echo", kind]).id  # queued, behind seeded["queued"]
        GARBAGE_ROWS[kind](raw, pool.keys.job(victims[kind]))
    problems: dict[str, str] = {}
    for kind, victim in victims.items():
        try:
            pool.get(victim)
            problems[kind] = "get returned a Job"
        except Exception as exc:  # noqa: BLE001 - judged here
            if not isinstance(exc, JobpoolError):
                problems[kind] = f"get raised a bare {type(exc).__name__}: {exc}"
    lists: tuple[tuple[str, Callable[[], list[Job]], list[str]], ...] = (
        ("list()", pool.list, sorted(good)),
        ("list(queued)", lambda: pool.list("queued"), [seeded["queued"].id]),
        ("list(PAUSED)", lambda: pool.list(JobState.PAUSED), [seeded["paused"].id]))
    for name, call, want in lists:
        try:
            got = sorted(j.id for j in call())
        except Exception as exc:  # noqa: BLE001 - judged here
            problems[name] = f"raised {type(exc).__name__}: {exc}"
        else:
            if got != want:
                problems[name] = f"{got} instead of {want}"
    pool.stats()
    for kind, victim in victims.items():
        try:  # cancelling a garbage job may work (a way to be rid of it) or be refused, with a typed error
            pool.cancel(victim)
        except Exception as exc:  # noqa: BLE001 - judged here
            if not isinstance(exc, JobpoolError):
                problems[f"cancel {kind}"] = f"raised a bare {type(exc).__name__}: {exc}"
    assert problems == {}
    assert rows(pool, good) == before


def test_the_cli_reports_a_garbage_row_in_one_line_and_lists_the_good_ones(pool: Pool, seeded: Jobs,
                                                                          raw: redis.Redis, redis_url: str,
                                                                          tmp_path: Path) -> None:
    victims = {}
    for kind in ("spec not JSON", "state unknown", "key not a hash"):
        victims[kind] = pool.enqueue(IMAGE, ["echo", kind]).id
        GARBAGE_ROWS[kind](raw, pool.keys.job(victims[kind]))
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
WEDGES: dict[str, Callable[[redis.Redis, str], Any]] = {
    "hash deleted, id still queued": lambda raw, key: raw.delete(key),
    "attempt not a number": _set("attempt", "x"),
    "key not a hash": _not_a_hash,
    "state unknown": _set("state", "bogus"),
    "spec not JSON": _set("spec", "{not json"),
}


@pytest.mark.parametrize("kind", WEDGES)
def test_a_garbage_head_of_the_queue_does_not_wedge_promotion(pool: Pool, raw: redis.Redis,
                                                              kind: str) -> None:
    pool.set_slots(0)
    head = pool.enqueue(IMAGE, ["echo", "head"])
    behind = pool.enqueue(IMAGE, ["echo", "behind"])
    WEDGES[kind](raw, pool.keys.job(head.id))
    try:
        pool.set_slots(3)  # room for the head (if it is promotable), the job behind it, and one more
    except JobpoolError as exc:
        pytest.fail(f"set_slots raised {type(exc).__name__}: {exc}")
    assert pool.get(behind.id).state is JobState.RUNNING, "the job behind the head was not promoted"
    try:
        late = pool.enqueue(IMAGE, ["echo", "late"])
    except JobpoolError as exc:
        pytest.fail(f"enqueue raised {type(exc).__name__}: {exc}")
    assert pool.get(late.id).state is JobState.RUNNING


# ---- the supervisor sweeps past garbage ----------------------------------------------------------------

def _running_claimed(pool: Pool, boot: str, name: str, docker_host: str) -> str:
    """A promoted job claimed by `boot` on the test daemon, as a worker there would have claimed it."""
    job = pool.enqueue(IMAGE, ["echo", name])
    assert pool.get(job.id).state is JobState.RUNNING
    claim(pool, job.id, boot, docker_host)
    return job.id


def test_a_sweep_survives_garbage_running_rows_and_leaves_the_others_alone(
        pool: Pool, raw: redis.Redis, docker_host: str, pool_env: dict[str, str], tmp_path: Path) -> None:
    pool.set_slots(20)
    # The good ones: a running job whose owner holds its lease, a finished one, a paused one.
    live = _running_claimed(pool, "liveboot", "live", docker_host)
    raw.pexpire(pool.keys.lease(live), 120_000)
    done = _running_claimed(pool, "oldboot", "done", docker_host)
    Attempt(pool.store, done, "oldboot", 1).finish("exit", 0)
    paused = pool.enqueue(IMAGE, ["echo", "paused"]).id
    pool.pause(paused)
    good = [live, done, paused]
    # The garbage: running rows of a gone boot, spoilt in one way each.
    spoil: dict[str, Callable[[str, str], object]] = {
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
        job_id = _running_claimed(pool, "goneboot", kind, docker_host)
        raw.delete(pool.keys.lease(job_id))
        how(pool.keys.job(job_id), pool.keys.lease(job_id))
    before = rows(pool, good)

    report = sweep_once(pool.store)
    assert report.rows >= 1
    result = cli("supervisor", "--once", env={**pool_env, "DOCKER_HOST": docker_host}, cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "sweep of pool it failed" not in result.stderr, result.stderr[-2000:]
    assert rows(pool, good) == before
    assert raw.exists(pool.keys.lease(live))


SWEEP_ABORTS: dict[str, Callable[[redis.Redis, str], Any]] = {
    "key not a hash": _not_a_hash,
    "recovery_attempts garbage": _set("recovery_attempts", "-x"),
}


@pytest.mark.parametrize("kind", ["nothing spoilt (control)", *SWEEP_ABORTS])
def test_one_garbage_running_row_does_not_abort_the_sweep(pool_env: dict[str, str], raw: redis.Redis,
                                                          docker_host: str, kind: str) -> None:
    pool = Pool.from_env(env={**pool_env, "JOBPOOL_RECOVERY_BUDGET": "0"})
    try:
        pool.set_slots(2)
        spoilt = _running_claimed(pool, "goneboot", "spoilt", docker_host)
        # Its container never existed: absent -> failed.
        orphan = _running_claimed(pool, "goneboot", "orphan", docker_host)
        raw.zadd(pool.keys.running, {spoilt: 1})  # judged first
        raw.delete(pool.keys.lease(spoilt), pool.keys.lease(orphan))
        waiting = pool.enqueue(IMAGE, ["echo", "waiting"])
        if kind in SWEEP_ABORTS:
            SWEEP_ABORTS[kind](raw, pool.keys.job(spoilt))
        sweep_once(pool.store)
        assert pool.get(orphan).state is JobState.FAILED
        assert pool.get(waiting.id).state is JobState.RUNNING
    finally:
        pool.store.client.close()


GHOST_SLOTS: dict[str, Callable[[redis.Redis, str, str], Any]] = {
    "hash deleted": lambda raw, key, lease: raw.delete(key),
    "lease garbage": lambda raw, key, lease: raw.set(lease, "garbage"),
    "lease not a string": lambda raw, key, lease: raw.hset(lease, "a", "b"),
}


@pytest.mark.parametrize("kind", ["nothing spoilt (control)", *GHOST_SLOTS])
def test_a_sweep_frees_the_slot_of_a_dead_job_whatever_its_row_holds(pool_env: dict[str, str],
                                                                     raw: redis.Redis, docker_host: str,
                                                                     kind: str) -> None:
    pool = Pool.from_env(env={**pool_env, "JOBPOOL_RECOVERY_BUDGET": "0"})
    try:
        pool.set_slots(1)
        dead = _running_claimed(pool, "goneboot", "dead", docker_host)  # its boot and container are gone
        raw.delete(pool.keys.lease(dead))
        waiting = pool.enqueue(IMAGE, ["echo", "waiting"])
        if kind in GHOST_SLOTS:
            GHOST_SLOTS[kind](raw, pool.keys.job(dead), pool.keys.lease(dead))
        sweep_once(pool.store)
        sweep_once(pool.store)
        if kind == "hash deleted":
            # Without its row nothing says which daemon it ran on: an unattended sweep keeps the slot
            # (jobpool/fleet/daemonid.py); the operator's sweep frees it.
            assert pool.store.client.zscore(pool.keys.running, dead) is not None
            reconcile(pool.store, evict_stale=True)
        assert pool.store.client.zscore(pool.keys.running, dead) is None, "the dead job still holds its slot"
        assert pool.get(waiting.id).state is JobState.RUNNING
    finally:
        pool.store.client.close()


# ---- a worker ends a row it cannot read -----------------------------------------------------------------

def test_a_worker_ends_a_job_whose_spec_is_garbage_and_runs_the_next(
        sub_pool: Pool, raw: redis.Redis, spawn: Callable[..., JobpoolProcess]) -> None:
    pool = sub_pool
    pool.set_slots(0)
    bad = pool.enqueue("ignored", ["sh", "-c", "echo bad"])
    raw.hset(pool.keys.job(bad.id), "spec", "{not json")
    good = pool.enqueue("ignored", ["sh", "-c", "echo good"])
    procs = (spawn(**SUB), spawn(module="jobpool.cli", args=("supervisor",), **SUB))
    pool.set_slots(1)
    # get() cannot read this row
    state: Callable[[], object] = lambda: raw.hget(pool.keys.job(bad.id), "state")  # noqa: E731
    eventually(lambda: alive(*procs) and state() != b"queued", timeout=10,
               message="the bad job was promoted")
    runs_to_success(pool, good.id, procs, 10)
    assert state() == b"failed"
