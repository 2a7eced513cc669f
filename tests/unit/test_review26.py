"""Adversarial checks of time and dependencies (docs/architecture.md "Time and dependencies"): the paths
through `waiting`, `paused` and retries that the scripts' own tests do not walk, each checked against the
pool keys it must leave right (fair share's counts, `dependents`/`deps`, the slots and units held), on
fakeredis[lua] and a real redis-server.
"""

from __future__ import annotations

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


# ---- bad input writes nothing -------------------------------------------------------------------------------


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
