"""Every script that may free a slot replies in one shape, {0, result, promoted, why_stopped, ...}
(scripts/_lib.lua), so a caller knows whether to promote again instead of promoting blindly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from jobpool.api import Pool
from jobpool.store.scriptcalls import CANDIDATES_ON_RELEASE
from tests.support.attempts import claim
from tests.support.pool_helpers import Backend, enqueue, orphan, reconcile

WHY = {"paused", "full", "empty", "stale", "batch", "none"}


def _release(pool: Pool, script: str, job_id: str, *args: Any) -> list[Any]:
    keys = [pool.keys.job(job_id), pool.keys.lease(job_id), *pool.store.candidates(CANDIDATES_ON_RELEASE)]
    return pool.store.run(script, keys, [job_id, *args])


CASES: dict[str, Callable[[Backend, Pool, str], list[Any]]] = {
    "cancel": lambda b, p, j: _release(p, "cancel", j, "r", "t"),
    "pause_job": lambda b, p, j: _release(p, "pause_job", j, "r", "t"),
    "evict": lambda b, p, j: (claim(p, j), _release(p, "evict", j, 1, "r", "e", "t"))[1],
    "reconcile_apply": lambda b, p, j: (orphan(b, p, j), reconcile(p, j, "absent"))[1],
    "finish": lambda b, p, j: (att := claim(p, j)).store.run(
        "finish", [p.keys.job(j), p.keys.lease(j), *p.store.candidates(CANDIDATES_ON_RELEASE)],
        [j, att.boot_id, 1, "exit", 0, "", ""]),
}


@pytest.mark.parametrize("script", list(CASES))
def test_a_release_reply_says_how_promotion_stopped(backend: Backend, script: str) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool, "first")
    nxt = enqueue(pool, "second")
    reply = CASES[script](backend, pool, job.id)
    assert reply[0] == 0 and isinstance(reply[2], int) and reply[3] in WHY, reply
    if reply[1] != "running":  # the slot was freed: the job behind took it in the same step
        assert (reply[2], pool.get(nxt.id).state.value) == (1, "running"), reply


def test_a_finish_sent_again_after_its_reply_was_lost_gets_the_same_answer(backend: Backend) -> None:
    """The worker retries a finish whose reply it never saw (a connection reset after Redis ran it); the
    first one landed and cleared the owner, so a fenced refusal would read as "superseded"."""
    pool = backend.pool()
    job = enqueue(pool, "x")
    att = claim(pool, job.id)
    assert att.finish("exit", 0) == "succeeded"
    before = backend.keyspace()
    assert att.finish("exit", 0) == "succeeded"
    assert backend.keyspace() == before
    # Only that boot's own finish of that attempt: another boot, or the next attempt, is still refused.
    from jobpool.errors import NotOwner
    from jobpool.workers.attempt import Attempt

    with pytest.raises(NotOwner):
        Attempt(pool.store, job.id, "boot-z", 1).finish("exit", 0)
