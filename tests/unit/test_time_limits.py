"""Time limits through the scripts and the watcher's side of them (jobpool/workers/timelimit.py), on
fakeredis[lua] and a real server: time_out.lua marks an attempt once, fenced on its owner and attempt; an
exit recorded after the mark (the watcher's finish, or the supervisor's reconcile after the watcher died)
fails the job as `timeout`, or retries it while its retries last; an exit 0 after the mark still succeeds;
the mark of one attempt says nothing of the next. The watcher's limit reads the attempt's start once, and
marks before it asks for the stop.
"""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from jobpool import errors
from jobpool.api import Pool
from jobpool.contract import REASON_TIMEOUT
from jobpool.models import JobState
from jobpool.procid import identity_of
from jobpool.supervisor.timers import release_due
from jobpool.workers.attempt import Attempt
from jobpool.workers.executors.subprocess import ProcessHandle
from jobpool.workers.timelimit import REFUSED, STOP, WAIT, TimeLimit, duration
from tests.support.attempts import claim
from tests.support.pool_helpers import Backend, enqueue, events_of, reconcile, row

BOOT = "boot-a"


def launched(pool: Pool, **spec: object) -> Attempt:
    """A job with `spec`, promoted, claimed by BOOT and launched."""
    job = enqueue(pool, "sleep", "600", **spec)
    att = claim(pool, job.id, BOOT)
    att.set_container("cid-1", "daemon-1")
    return att


def timeout_events(pool: Pool, job_id: str) -> list[dict[str, str]]:
    return [e for e in events_of(pool, job_id) if e["reason"] == REASON_TIMEOUT and e["to"] == "running"]


# ---- time_out.lua ------------------------------------------------------------------------------------


def test_the_mark_is_recorded_once_with_its_evidence(backend: Backend) -> None:
    pool = backend.pool()
    att = launched(pool, timeout=2)
    assert att.timeout == 2
    assert att.time_out("ran 2s; its limit is 2s") is True
    assert row(pool, att.job_id)["timed_out"] == str(att.attempt)
    before = backend.keyspace()
    assert att.time_out("ran 3s; its limit is 2s") is False  # sent again after a lost reply: already
    assert backend.keyspace() == before
    [ev] = timeout_events(pool, att.job_id)
    assert (ev["from"], ev["evidence"]) == ("running", "ran 2s; its limit is 2s")
    assert ev["actor"] == f"worker:{BOOT}"
    assert pool.get(att.job_id).state is JobState.RUNNING  # marked, not ended: its exit ends it


@pytest.mark.parametrize("who", ["another boot", "another attempt", "unclaimed"])
def test_the_mark_is_fenced_and_a_refusal_writes_nothing(backend: Backend, who: str) -> None:
    pool = backend.pool()
    att = launched(pool, timeout=2)
    if who == "unclaimed":
        backend.client.hset(pool.keys.job(att.job_id), "owner_boot", "")
    other = {"another boot": Attempt(pool.store, att.job_id, "boot-b", att.attempt),
             "another attempt": Attempt(pool.store, att.job_id, BOOT, att.attempt + 1),
             "unclaimed": att}[who]
    before = backend.keyspace()
    with pytest.raises(errors.NotOwner):
        other.time_out("ran 2s; its limit is 2s")
    assert backend.keyspace() == before


def test_the_mark_of_an_unknown_job_or_a_finished_one_is_refused(backend: Backend) -> None:
    pool = backend.pool()
    with pytest.raises(errors.NotFound):
        Attempt(pool.store, "nosuchjob", BOOT, 1).time_out("x")
    att = launched(pool, timeout=2)
    att.finish("exit", 1)
    before = backend.keyspace()
    with pytest.raises(errors.NotOwner):
        att.time_out("x")
    assert backend.keyspace() == before


@pytest.mark.parametrize(("kind", "code"), [("interrupted", 143), ("interrupted", 137), ("exit", 1),
                                            ("interrupted", 75)])
def test_an_exit_after_the_mark_fails_the_job_as_timeout(backend: Backend, kind: str, code: int) -> None:
    pool = backend.pool()
    att = launched(pool, timeout=2)
    att.time_out("ran 2s; its limit is 2s")
    assert att.finish(kind, code) == "failed"
    job = pool.get(att.job_id)
    assert (job.state, job.error_reason, job.exit_code) == (JobState.FAILED, REASON_TIMEOUT, code)
    assert pool.store.client.zscore(pool.keys.running, att.job_id) is None  # the slot is free
    assert "timed_out" not in row(pool, att.job_id)  # a live attempt's field: compacted away


def test_exit_0_after_the_mark_still_succeeds(backend: Backend) -> None:
    pool = backend.pool()
    att = launched(pool, timeout=2, retries=2)
    att.time_out("ran 2s; its limit is 2s")
    assert att.finish("interrupted", 0) == "succeeded"
    job = pool.get(att.job_id)
    assert (job.state, job.error_reason, job.retries_used) == (JobState.SUCCEEDED, "", 0)


def test_a_persisted_cancel_still_wins_over_the_mark(backend: Backend) -> None:
    pool = backend.pool()
    att = launched(pool, timeout=2, retries=2)
    att.time_out("ran 2s; its limit is 2s")
    pool.cancel(att.job_id)
    assert att.finish("interrupted", 143) == "cancelled"


def test_the_supervisor_reconciling_a_marked_attempt_fails_it_as_timeout(backend: Backend) -> None:
    """The watcher marked it and died before it recorded the exit: the sweep finds the container exited."""
    pool = backend.pool()
    att = launched(pool, timeout=2)
    att.time_out("ran 2s; its limit is 2s")
    backend.client.delete(pool.keys.lease(att.job_id))
    assert reconcile(pool, att.job_id, "exited", reason="", code="137")[1] == "failed"
    job = pool.get(att.job_id)
    assert (job.state, job.error_reason, job.exit_code) == (JobState.FAILED, REASON_TIMEOUT, 137)


def test_a_timeout_is_retried_while_retries_last_and_each_attempt_is_judged_alone(backend: Backend) -> None:
    pool = backend.pool()
    att = launched(pool, timeout=2, retries=1, retry_delay=0, retry_on=[4])  # retry_on names exits only
    att.time_out("ran 2s; its limit is 2s")
    assert att.finish("interrupted", 143) == "waiting"
    job = pool.get(att.job_id)
    assert (job.state, job.retries_used, job.wait_reason) == (JobState.WAITING, 1, "retry")
    last = events_of(pool, att.job_id)[-1]
    assert (last["to"], last["reason"]) == ("waiting", "retry")
    assert last["evidence"].startswith("retry 1 of 1 in 0 s after timeout")

    assert release_due(pool.store, "supervisor") == 1  # due at once: queued again and promoted
    second = claim(pool, att.job_id, BOOT)
    assert second.attempt == att.attempt + 1
    second.set_container("cid-2", "daemon-1")
    # The first attempt's mark is not this one's: its own exit fails it as its own, retries spent.
    assert second.finish("exit", 3) == "failed"
    job = pool.get(att.job_id)
    assert (job.state, job.error_reason) == (JobState.FAILED, "exit_code_3")


def test_the_last_retry_timed_out_fails_as_timeout(backend: Backend) -> None:
    pool = backend.pool()
    att = launched(pool, timeout=2, retries=1, retry_delay=0)
    att.time_out("ran 2s; its limit is 2s")
    assert att.finish("interrupted", 143) == "waiting"
    release_due(pool.store, "supervisor")
    second = claim(pool, att.job_id, BOOT)
    second.set_container("cid-2", "daemon-1")
    assert second.time_out("ran 2s; its limit is 2s") is True  # a mark of its own
    assert second.finish("interrupted", 137) == "failed"
    job = pool.get(att.job_id)
    assert (job.state, job.error_reason, job.retries_used) == (JobState.FAILED, REASON_TIMEOUT, 1)
    assert len(timeout_events(pool, att.job_id)) == 2


# ---- the watcher's limit (workers/timelimit.py) ------------------------------------------------------


@pytest.mark.parametrize(("secs", "text"), [(0, "0s"), (5, "5s"), (90, "1m 30s"), (3600, "1h"),
                                            (7203.9, "2h 0m 3s"), (7260, "2h 1m"), (-1, "0s")])
def test_durations_read_as_hours_minutes_seconds(secs: float, text: str) -> None:
    assert duration(secs) == text


class Started:
    """A handle whose start reads as `ran` seconds ago (None: its daemon does not answer), counting reads."""

    def __init__(self, ran: float | None) -> None:
        self.ran, self.reads = ran, 0

    def ran_for(self, timeout: float) -> float | None:
        self.reads += 1
        return self.ran


def test_the_deadline_is_fixed_from_the_start_read_once() -> None:
    limit = TimeLimit(10)
    handle = Started(4.0)
    assert not limit.over(handle, 100.0, 0.5)  # type: ignore[arg-type]  # only ran_for is read
    assert limit.deadline == 106.0
    assert not limit.over(handle, 105.9, 0.5)  # type: ignore[arg-type]
    assert limit.over(handle, 106.0, 0.5)  # type: ignore[arg-type]
    assert handle.reads == 1
    assert limit.evidence(109.2) == "ran 13s; its limit is 10s"


def test_an_unreadable_start_is_no_evidence_and_is_read_again_later() -> None:
    limit = TimeLimit(1)
    handle = Started(None)
    assert not limit.over(handle, 100.0, 0.5)  # type: ignore[arg-type]
    assert not limit.over(handle, 100.5, 0.5)  # type: ignore[arg-type]  # not asked again at once
    assert handle.reads == 1
    handle.ran = 50.0  # the daemon answers again: the start says it ran out long ago
    assert limit.over(handle, 101.0, 0.5)  # type: ignore[arg-type]
    assert handle.reads == 2


def test_no_timeout_means_no_limit() -> None:
    assert TimeLimit.of(None) is None
    limit = TimeLimit.of(7)
    assert limit is not None and limit.limit == 7


def test_check_marks_then_says_stop_once(backend: Backend) -> None:
    pool = backend.pool()
    att = launched(pool, timeout=3)
    limit = TimeLimit(3)
    handle = Started(1.0)
    assert limit.check(att, handle, 10.0, 0.5) == WAIT  # type: ignore[arg-type]
    assert "timed_out" not in row(pool, att.job_id)
    assert limit.check(att, handle, 12.0, 0.5) == STOP  # type: ignore[arg-type]
    assert row(pool, att.job_id)["timed_out"] == str(att.attempt)
    assert limit.check(att, handle, 13.0, 0.5) == WAIT  # type: ignore[arg-type]  # its stop is under way
    [ev] = timeout_events(pool, att.job_id)
    assert ev["evidence"] == "ran 3s; its limit is 3s"


def test_an_adopter_finds_the_mark_made_and_stops_it_too(backend: Backend) -> None:
    pool = backend.pool()
    att = launched(pool, timeout=3)
    att.time_out("ran 3s; its limit is 3s")
    backend.client.delete(pool.keys.lease(att.job_id))
    adopter, _, _, _ = Attempt.adopt(pool.store, att.job_id, BOOT, att.attempt, "boot-b", evidence="running",
                                     daemon_id="daemon-1")
    assert adopter.timeout == 3
    assert TimeLimit(3).check(adopter, Started(9.0), 10.0, 0.5) == STOP  # type: ignore[arg-type]
    assert len(timeout_events(pool, att.job_id)) == 1


def test_check_on_a_row_no_longer_ours_says_refused_and_writes_nothing(backend: Backend) -> None:
    pool = backend.pool()
    att = launched(pool, timeout=3)
    backend.client.hset(pool.keys.job(att.job_id), "owner_boot", "boot-b")
    before = backend.keyspace()
    limit = TimeLimit(3)
    assert limit.check(att, Started(5.0), 10.0, 0.5) == REFUSED  # type: ignore[arg-type]
    assert limit.check(att, Started(5.0), 10.1, 0.5) == WAIT  # type: ignore[arg-type]  # asked again later
    assert limit.check(att, Started(5.0), 10.6, 0.5) == REFUSED  # type: ignore[arg-type]
    assert backend.keyspace() == before


def test_a_process_handle_reads_its_start_from_the_kernel() -> None:
    """A subprocess job's start: its identity's start time (ticks since boot) against /proc/uptime."""
    proc = subprocess.Popen(["sleep", "5"])
    try:
        handle = SimpleNamespace(identity=identity_of(proc.pid))
        ran = ProcessHandle.ran_for(handle, 0.5)  # type: ignore[arg-type]  # only its identity is read
        assert ran is not None and 0.0 <= ran < 5.0
    finally:
        proc.kill()
        proc.wait()
