"""Adversarial checks of time and dependencies (docs/architecture.md "Time and dependencies"): the paths
through `waiting`, `paused` and retries that the scripts' own tests do not walk, each checked against the
pool keys it must leave right (fair share's counts, `dependents`/`deps`, the slots and units held), on
fakeredis[lua] and a real redis-server.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from typing import cast

import pytest

from jobpool import errors
from jobpool.api import Pool
from jobpool.supervisor.timers import release_due
from tests.support.attempts import claim
from tests.support.pool_helpers import Backend, enqueue, orphan, reconcile, row, state_of


def release(pool: Pool) -> int:
    return release_due(pool.store, "test")


def fair_counts(pool: Pool) -> dict[str, int]:
    """`fair`'s counts (c:<priority>:<group>) as stored, zeros left out."""
    fair = cast("dict[str, str]", pool.store.client.hgetall(pool.keys.fair))
    return {k: int(v) for k, v in fair.items() if k.startswith("c:") and int(v) != 0}


def fair_expected(pool: Pool) -> dict[str, int]:
    """What fair share must count: each queued or paused job with a place in the queue (an `order`), by its
    priority and group (_lib.lua `group_left`)."""
    counts: Counter[str] = Counter()
    for index in (pool.keys.queued, pool.keys.paused_jobs):
        for job_id in cast("list[str]", pool.store.client.zrange(index, 0, -1)):
            r = row(pool, job_id)
            if "order" in r:
                counts[f"c:{r.get('priority', '0')}:{r.get('group', '')}"] += 1
    return dict(counts)


def assert_fair(pool: Pool) -> None:
    assert fair_counts(pool) == fair_expected(pool)


# ---- fair share through waiting -------------------------------------------------------------------------


def test_a_waiting_job_paused_then_resumed_into_the_queue_is_counted_by_fair_share(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    later = enqueue(pool, "later", group="g", not_before=time.time() + 0.2)
    other = enqueue(pool, "other", group="g")
    pool.pause(later.id)
    deadline = time.monotonic() + 10
    while row(pool, later.id).get("wait_until") and int(row(pool, later.id)["wait_until"]) > pool.now_ms():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    resumed = pool.resume(later.id)
    assert resumed is not None and resumed.state.value == "queued"
    assert_fair(pool)
    pool.cancel(later.id)
    assert_fair(pool)
    assert state_of(pool, other.id) == "queued"


# ---- the supervisor's verdict on a retried exit ---------------------------------------------------------


def test_a_reconciled_exit_that_is_retried_answers_waiting(backend: Backend) -> None:
    """The supervisor reports (and its sweep's record counts) the state the script left the job in."""
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool, retries=1, retry_delay=60)
    orphan(backend, pool, job.id)
    reply = reconcile(pool, job.id, "exited", code="3")
    assert state_of(pool, job.id) == "waiting"
    assert reply[1] == "waiting"


def test_an_eviction_is_never_retried_whatever_its_reason_says(backend: Backend) -> None:
    """docs: "A pause, a cancel, an eviction or a launch failure is never retried"; an operator's reason is
    free text, so one reading `timeout` or `exit_code_1` must not turn the eviction into a retry."""
    pool = backend.pool(max_concurrent_jobs=1)
    for reason in ("timeout", "exit_code_1"):
        job = enqueue(pool, reason, retries=2, retry_delay=0)
        claim(pool, job.id).set_container("cid-1", "daemon-1")
        got = pool.evict(job.id, 1, reason=reason)
        assert (got.state.value, got.retries_used) == ("failed", 0)


# ---- bad input writes nothing ----------------------------------------------------------------------------


def test_release_waiting_with_a_key_that_is_not_its_ids_row_writes_nothing(backend: Backend) -> None:
    """-6 is "the keys are not the ids' rows": refused before the first job is judged, not after."""
    pool = backend.pool(max_concurrent_jobs=0)
    a = enqueue(pool, "a", not_before=time.time() + 0.05)
    b = enqueue(pool, "b", not_before=time.time() + 0.05)
    time.sleep(0.1)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument):
        pool.store.run("release_waiting", [pool.keys.job(a.id), pool.keys.job(a.id)], ["test", a.id, b.id])
    assert backend.keyspace() == before


# ---- a random walk through waiting, pause, resume, retry and cancel; the pool keys checked at each step ---


def _ids(pool: Pool, index: str) -> list[str]:
    return cast("list[str]", pool.store.client.zrange(index, 0, -1))


def check_pool_keys(pool: Pool) -> None:
    """What every step must leave right: fair share's counts, the slots in use, the named units, who waits
    for whom and how many of each one's dependencies are left, and no waiting job with a place in the
    queue."""
    k, client = pool.keys, pool.store.client
    assert_fair(pool)
    running = _ids(pool, k.running)
    rows = {j: row(pool, j) for j in running}
    weights = sum(int(r.get("slots", "1")) for r in rows.values())
    assert int(cast(str, client.hget(k.config, "slots_used") or 0)) == weights
    units: Counter[str] = Counter()
    for r in rows.values():
        for use in filter(None, r.get("uses", "").split(";")):
            name, amount, _ = use.split("=")
            units[name] += int(amount)
    used = {f: int(v) for f, v in cast("dict[str, str]", client.hgetall(k.limit_used)).items()
            if not f.startswith("=")}
    assert used == {n: v for n, v in units.items() if v}
    holding = set(_ids(pool, k.waiting)) | set(_ids(pool, k.paused_jobs))
    succeeded = set(_ids(pool, k.succeeded))
    left: Counter[str] = Counter()
    for member in cast("list[str]", client.zrange(k.dependents, 0, -1)):
        dep, dependent = member.split(" ")
        assert dependent in holding, f"{member}: its dependent is {state_of(pool, dependent)}"
        if dep not in succeeded:
            left[dependent] += 1
    deps = cast("dict[str, str]", client.hgetall(k.deps))
    for field, value in deps.items():
        job = field.removeprefix("x:")
        assert job in holding, f"deps {field}: the job is {state_of(pool, job)}"
        if not field.startswith("x:"):
            assert int(value) == left[job], (field, value, left[job])
    for job in _ids(pool, k.waiting):
        assert "order" not in row(pool, job), f"waiting {job} has a place in the queue"
    assert set(_ids(pool, k.ready)) <= set(_ids(pool, k.queued))


def _spec_options(rng: random.Random, jobs: list[str]) -> dict[str, object]:
    """A new job's options: a group, a priority, sometimes a named limit's unit, a weight, a start time far
    off, jobs to wait for, retries."""
    kw: dict[str, object] = {"group": rng.choice([None, "g", "h"]), "priority": rng.choice([0, 0, 1])}
    if rng.random() < 0.3:
        kw["uses"] = {"db": 1}
    if rng.random() < 0.2:
        kw["slots"] = 2
    if rng.random() < 0.3:
        kw["not_before"] = time.time() + 3600
    if jobs and rng.random() < 0.5:
        kw["after"] = rng.sample(jobs, min(len(jobs), rng.choice([1, 2])))
    if rng.random() < 0.4:
        kw["retries"], kw["retry_delay"] = rng.choice([1, 2]), 0
    return kw


def _walk_step(pool: Pool, rng: random.Random, op: str, pick: str) -> None:
    """One step on job `pick` (finish: on a running job of its own choosing)."""
    state = state_of(pool, pick)
    running = _ids(pool, pool.keys.running)
    if op == "finish" and running:
        claim(pool, rng.choice(running)).finish("exit", exit_code=rng.choice([0, 0, 1]))
    elif op in ("pause", "resume", "cancel", "retry") and not (op == "cancel" and state == "running"):
        getattr(pool, op)(pick)
    elif op == "due" and state in ("waiting", "paused") and row(pool, pick).get("wait_until"):
        pool.store.client.hset(pool.keys.job(pick), "wait_until", 0)  # its time came
        pool.store.client.zadd(pool.keys.waiting, {pick: 0}, xx=True)
    elif op == "release":
        release(pool)


def test_a_random_walk_keeps_the_pool_keys_right(backend: Backend) -> None:
    rng = random.Random(int(os.environ.get("REVIEW26_SEED", "3")))
    pool = backend.pool(max_concurrent_jobs=3, reserve_after_secs=0)
    pool.set_limit("db", 2)
    jobs: list[str] = []
    steps = 1000 if backend.name == "fakeredis" else 300
    for step in range(steps):
        op = rng.choice(["enqueue", "enqueue", "finish", "finish", "pause", "resume", "cancel", "retry",
                         "due", "release"])
        try:
            if op == "enqueue" or not jobs:
                jobs.append(enqueue(pool, str(step), **_spec_options(rng, jobs)).id)
            else:
                _walk_step(pool, rng, op, rng.choice(jobs[-30:]))
        except (errors.InvalidState, errors.InvalidSpec):
            pass
        check_pool_keys(pool)
