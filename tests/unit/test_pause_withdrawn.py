"""A pause withdrawn by a resume after the watcher may already have signalled the job (resume_job.lua,
verdict_for_exit in _lib.lua, finish.lua), on fakeredis[lua] and a real server.

The watcher reports an exit it asked for as 'interrupted'; with the pause withdrawn a non-zero exit hands the
job back to its place (no recovery budget spent) with a reason that says so, and exit 0 is still success.
"""

from __future__ import annotations

from typing import cast

import pytest

from jobpool import Pool
from jobpool.models import Job, JobState
from jobpool.workers.attempt import Attempt
from tests.support.attempts import claim
from tests.support.pool_helpers import (
    Backend,
    assert_event,
    enqueue,
    last_event,
    lease,
    orphan,
    queued_ids,
    reconcile,
    row,
)


def withdrawn(backend: Backend) -> tuple[Pool, Job, Attempt, Job]:  # the job queued behind it last
    """A running claimed job whose pause was requested, then withdrawn by a resume; promotion paused so a
    handback stays visible in `queued`."""
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    behind = enqueue(pool)
    att = claim(pool, job.id)
    pool.pause(job.id)
    assert att.heartbeat().pause  # the watcher sees it and sends SIGTERM
    assert cast(Job, pool.resume(job.id)).state is JobState.RUNNING
    pool.pause(None)
    return pool, job, att, behind


def test_resume_of_a_running_job_records_which_attempt_it_withdrew(backend: Backend) -> None:
    pool, job, att, _ = withdrawn(backend)
    assert row(pool, job.id)["pause_withdrawn"] == str(att.attempt)
    assert row(pool, job.id)["pause_requested"] == "0"
    assert_event(last_event(pool, job.id), job.id, "running", "running", "pause_withdrawn")


@pytest.mark.parametrize("code", [75, 143, 137, 1])
def test_nonzero_exit_after_the_withdrawn_pause_is_handed_back_to_its_place(backend: Backend,
                                                                           code: int) -> None:
    pool, job, att, behind = withdrawn(backend)
    assert att.finish("interrupted", code, log_tail="checkpointed") == "queued"
    got = pool.get(job.id)
    assert (got.state, got.error_reason, got.recovery_attempts, got.seq) == \
        (JobState.QUEUED, "pause_withdrawn_handback", 0, job.seq)
    assert queued_ids(pool) == [job.id, behind.id] and lease(pool, job.id) is None
    assert_event(last_event(pool, job.id), job.id, "running", "queued", "pause_withdrawn_handback",
                 evidence=f"exit_code={code}")


def test_exit_0_after_the_withdrawn_pause_is_still_success(backend: Backend) -> None:
    pool, job, att, _ = withdrawn(backend)
    assert att.finish("interrupted", 0) == "succeeded"
    assert pool.get(job.id).error_reason == ""


def test_a_pause_requested_again_wins_over_the_withdrawn_one(backend: Backend) -> None:
    pool, job, att, _ = withdrawn(backend)
    pool.pause(job.id)
    assert att.finish("interrupted", 75) == "paused"


def test_an_exit_the_watcher_did_not_ask_for_still_fails(backend: Backend) -> None:
    """Withdrawn before the watcher acted: it never signalled, reports 'exit', and a failure is a failure."""
    pool, job, att, _ = withdrawn(backend)
    assert att.finish("exit", 75) == "failed"
    assert pool.get(job.id).error_reason == "exit_code_75"


def test_a_withdrawn_pause_of_an_earlier_attempt_does_not_name_a_later_handback(backend: Backend) -> None:
    pool, job, att, _ = withdrawn(backend)
    att.finish("interrupted", 75)
    pool.resume(None)
    second = claim(pool, job.id)
    assert second.attempt == att.attempt + 1
    pool.pause(None)
    assert second.finish("interrupted", 75) == "queued"
    assert pool.get(job.id).error_reason == "shutdown_handback"  # a drain's, as before


def test_supervisor_finding_exit_75_after_a_withdrawn_pause_hands_back_so_named(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    job = enqueue(pool)
    orphan(backend, pool, job.id)
    pool.pause(job.id)
    pool.resume(job.id)
    pool.pause(None)
    assert reconcile(pool, job.id, "exited", reason="", code="75")[1] == "queued"
    assert pool.get(job.id).error_reason == "pause_withdrawn_handback"
