"""Retention: scripts/prune.lua and jobpool/retention.py on fakeredis[lua] and a real redis-server.

Finished jobs past a count or age cap go with everything they left; nothing else is ever touched, and a
prune given stale or wrong input removes nothing it should not.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from jobpool import errors
from jobpool.api import Pool
from jobpool.contract import ADOPT_RQ_PREFIX, JobState
from jobpool.retention import Cap, batch_keys, caps, past_caps, prune
from jobpool.supervisor.adoption import adopt_rq_job_id
from tests.support.attempts import claim
from tests.support.pool_helpers import Backend, enqueue, row, state_of


def finish(pool: Pool, job_id: str, code: int = 0) -> None:
    att = claim(pool, job_id)
    att.set_container("cid", "daemon")
    att.finish("exit", code, log_tail="out")


def finished_jobs(pool: Pool, n: int, code: int = 0) -> list[str]:
    """`n` jobs finished with `code`, oldest first, each in a millisecond of its own (jobs finished within
    the same one are ordered by their ids in the state index, not by when they finished)."""
    ids = []
    at = pool.now_ms() - 10_000
    for i in range(n):
        job = enqueue(pool, "echo", str(i))
        finish(pool, job.id, code)
        pool.store.client.zadd(pool.keys.state_index(pool.get(job.id).state.value), {job.id: at + i}, xx=True)
        ids.append(job.id)
    return ids


def leave_rq_traces(backend: Backend, pool: Pool, job_id: str) -> None:
    """What RQ and the supervisor leave beside a row: results, registry entries, a lease, a pointer."""
    backend.client.xadd(pool.keys.rq_results(job_id), {"type": "1"})
    backend.client.zadd(pool.keys.rq_finished, {job_id: float("inf")})
    backend.client.zadd(pool.keys.rq_failed, {job_id: 1})
    backend.client.set(pool.keys.lease(job_id), "x")
    adopt_request(backend, pool, job_id)


def adopt_request(backend: Backend, pool: Pool, job_id: str) -> str:
    """An adoption request's RQ hash with no TTL (never run, or its adopter killed) and the pointer to it."""
    request = adopt_rq_job_id(job_id, 1)
    backend.client.hset(pool.keys.rq_job(request), mapping={"status": "started"})
    backend.client.set(pool.keys.adoption(job_id), request)
    return request


def traces(backend: Backend, pool: Pool, job_id: str) -> list[str]:
    c = backend.client
    found = [k for k in pool.keys.leftovers(job_id) if c.exists(k)]
    found += cast("list[str]", c.keys(pool.keys.rq_job(f"{ADOPT_RQ_PREFIX}{job_id}-*")))
    found += [k for k in (pool.keys.rq_finished, pool.keys.rq_failed) if c.zscore(k, job_id) is not None]
    found += [s.value for s in JobState if c.zscore(pool.keys.state_index(s.value), job_id) is not None]
    return found


def test_the_count_cap_keeps_the_newest_and_removes_everything_the_rest_left(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1, keep_succeeded=2, keep_succeeded_secs=0)
    ids = finished_jobs(pool, 5)
    for job_id in ids:
        leave_rq_traces(backend, pool, job_id)
    report = prune(pool.store, actor=pool.actor)
    assert report.counts["succeeded"] == 3 and sorted(report.ids["succeeded"]) == sorted(ids[:3])
    for job_id in ids[:3]:
        assert traces(backend, pool, job_id) == []
        with pytest.raises(errors.NotFound, match="pruned"):
            pool.get(job_id)
    for job_id in ids[3:]:
        assert state_of(pool, job_id) == "succeeded" and "succeeded" in traces(backend, pool, job_id)
    assert prune(pool.store, actor=pool.actor).total == 0  # nothing left past the caps


def test_the_age_cap_removes_what_finished_before_it(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1, keep_failed=0, keep_failed_secs=3600)
    old, new = finished_jobs(pool, 2, code=3)
    index = pool.keys.state_index("failed")
    backend.client.zadd(index, {old: pool.now_ms() - 3601 * 1000}, xx=True)  # it finished over an hour ago
    assert prune(pool.store, dry_run=True, actor=pool.actor).ids["failed"] == [old]
    report = prune(pool.store, actor=pool.actor)
    assert report.ids["failed"] == [old]
    assert traces(backend, pool, old) == [] and state_of(pool, new) == "failed"


def test_caps_of_zero_keep_everything(backend: Backend) -> None:
    pool = backend.pool(keep_succeeded=0, keep_succeeded_secs=0, keep_failed=0, keep_failed_secs=0,
                        keep_cancelled=0, keep_cancelled_secs=0)
    ids = finished_jobs(pool, 3)
    backend.client.zadd(pool.keys.state_index("succeeded"), {ids[0]: 1}, xx=True)
    assert prune(pool.store, actor=pool.actor).total == 0
    assert all(state_of(pool, i) == "succeeded" for i in ids)


def test_a_dry_run_counts_and_lists_and_changes_nothing(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1, keep_succeeded=1, keep_succeeded_secs=0)
    ids = finished_jobs(pool, 4)
    before = backend.keyspace()
    report = prune(pool.store, dry_run=True, actor=pool.actor)
    assert report.dry_run and report.counts["succeeded"] == 3 and report.ids["succeeded"] == ids[:3]
    assert backend.keyspace() == before


def _run_prune(pool: Pool, state: str, ids: list[str], keep: int = 0, cutoff: int = 0) -> list[Any]:
    keys = [pool.keys.rq_finished, pool.keys.rq_failed, *batch_keys(pool.store, ids)]
    return pool.store.run("prune", keys, [state, keep, cutoff, "test", *ids])


def test_an_adoption_request_goes_only_while_the_pointer_still_names_it(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    a, b = finished_jobs(pool, 2)
    old = adopt_request(backend, pool, a)
    keys = [pool.keys.rq_finished, pool.keys.rq_failed, *batch_keys(pool.store, [a])]
    new = adopt_request(backend, pool, a)  # asked again between the read and the script
    assert pool.store.run("prune", keys, ["succeeded", 0, pool.now_ms() + 1, "test", a]) == [0, 1, a]
    assert backend.client.exists(pool.keys.rq_job(old)) == 1, "no longer named: not this prune's to judge"
    assert backend.client.exists(pool.keys.rq_job(new)) == 1
    # A pointer naming something that is not this job's adoption request is not followed.
    other = adopt_request(backend, pool, a)
    backend.client.set(pool.keys.adoption(b), other)
    assert batch_keys(pool.store, [b])[-1] == ""
    assert _run_prune(pool, "succeeded", [b], cutoff=pool.now_ms() + 1) == [0, 1, b]
    assert backend.client.exists(pool.keys.rq_job(other)) == 1


def test_the_script_refuses_an_adoption_hash_that_is_not_the_jobs(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    a, b = finished_jobs(pool, 2)
    request = adopt_request(backend, pool, b)
    keys = [pool.keys.rq_finished, pool.keys.rq_failed, *pool.keys.leftovers(a), pool.keys.rq_job(request)]
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument):
        pool.store.run("prune", keys, ["succeeded", 0, pool.now_ms() + 1, "test", a])
    assert backend.keyspace() == before


def test_the_script_never_touches_a_queued_running_or_paused_job(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    running = enqueue(pool, "a")
    claim(pool, running.id)
    queued = enqueue(pool, "b")
    paused = enqueue(pool, "c")
    pool.pause(paused.id)
    ids = [running.id, queued.id, paused.id]
    before = backend.keyspace()
    far_future = pool.now_ms() + 10**9
    for state in ("succeeded", "failed", "cancelled"):
        assert _run_prune(pool, state, ids, keep=0, cutoff=far_future) == [0, 0]
    assert backend.keyspace() == before
    assert [state_of(pool, i) for i in ids] == ["running", "queued", "paused"]


def test_the_script_judges_again_so_a_stale_read_removes_nothing_within_the_caps(backend: Backend) -> None:
    """Candidates read when 3 of 3 were past a cap of 0... then the cap says keep 3: nothing goes."""
    pool = backend.pool(max_concurrent_jobs=1)
    ids = finished_jobs(pool, 3)
    before = backend.keyspace()
    assert _run_prune(pool, "succeeded", ids, keep=3) == [0, 0]
    assert backend.keyspace() == before


def test_the_script_refuses_keys_that_are_not_the_ids_own_and_writes_nothing(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    a, b = finished_jobs(pool, 2)
    keys = [pool.keys.rq_finished, pool.keys.rq_failed, *pool.keys.leftovers(b), ""]
    before = backend.keyspace()
    with pytest.raises(errors.InvalidArgument):
        pool.store.run("prune", keys, ["succeeded", 0, pool.now_ms() + 1, "test", a])
    with pytest.raises(errors.InvalidArgument):
        _run_prune(pool, "running", [a], keep=0, cutoff=pool.now_ms() + 1)
    assert backend.keyspace() == before


def test_an_index_entry_whose_row_is_gone_is_pruned_too(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1, keep_succeeded=1, keep_succeeded_secs=0)
    ids = finished_jobs(pool, 3)
    backend.client.delete(pool.keys.job(ids[0]))
    assert sorted(prune(pool.store, actor=pool.actor).ids["succeeded"]) == sorted(ids[:2])


def test_past_caps_reads_a_prefix_and_counts_the_union_of_both_caps(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    ids = finished_jobs(pool, 5)
    now = pool.now_ms()
    index = pool.keys.state_index("succeeded")
    # Distinct finish times (jobs finished in one millisecond tie, and ties go by id).
    backend.client.zadd(index, {ids[0]: now - 10_000, ids[1]: now - 9_000, ids[2]: now - 3, ids[3]: now - 2,
                                ids[4]: now - 1}, xx=True)
    assert past_caps(pool.store, Cap(JobState.SUCCEEDED, 4, 5), now, 10) == (ids[:2], 2)  # age: 2, count: 1
    assert past_caps(pool.store, Cap(JobState.SUCCEEDED, 1, 5), now, 3) == (ids[:3], 4)  # count: 4, age: 2


def test_caps_come_from_the_settings(backend: Backend) -> None:
    pool = backend.pool(keep_succeeded=5, keep_failed_secs=60)
    by_state = {c.state.value: c for c in caps(pool.settings)}
    assert by_state["succeeded"].keep == 5 and by_state["failed"].max_age_secs == 60
    assert by_state["cancelled"] == Cap(JobState.CANCELLED, 10_000, 7 * 86400)


def test_a_finished_row_keeps_what_is_shown_and_drops_what_steered_the_attempt(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    [job_id] = finished_jobs(pool, 1)
    r = row(pool, job_id)
    for gone in ("claim_token", "owner_boot", "pause_requested", "cancel_requested", "heartbeat_at",
                 "coalesce_key", "error_reason", "identity"):
        assert gone not in r, gone
    assert (r["state"], r["exit_code"], r["container_id"], r["finished_as"]) == ("succeeded", "0", "cid",
                                                                                   "succeeded")
    job = pool.get(job_id)
    assert (job.exit_code, job.owner_boot, job.error_reason, job.pause_requested) == (0, "", "", False)
