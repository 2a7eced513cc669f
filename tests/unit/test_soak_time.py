"""The chaos soak's judges of time and dependencies (bench/soak_time.py `judge_time`, and the transitions
bench/soak_report.py calls legal) can fail: each zero breaks on a hand-made event stream that breaks its
promise and holds on one that keeps it, and the soak's zeros then hold or not. And the soak's time mix is the
seed's, and a real pool takes every draw as built (its time limit, retries, start time, pipelines). No
fleet: the events are made up, as the soak's live reader of the stream would hand them over."""

from __future__ import annotations

import random
import time

from bench.soak import Figures
from bench.soak_fleet import IMAGE
from bench.soak_order import LIMITS, JobMix
from bench.soak_report import check_transitions
from bench.soak_time import (
    PLAIN,
    Built,
    TimeMix,
    TimeVerdict,
    fails_as,
    judge_time,
)
from bench.soak_watch import EventLog
from jobpool import JobState, schedules
from tests.support.pool_helpers import Backend


class Stream:
    """Events in stream order, as `EventLog` keeps them: ids and server times that only go up."""

    def __init__(self) -> None:
        self.events: list[dict[str, str]] = []
        self.at = 1_000_000

    def __call__(self, job: str, frm: str, to: str, reason: str, evidence: str = "", at: int = 0) -> None:
        self.at = at or self.at + 10
        self.events.append({"id": f"{self.at}-{len(self.events)}", "job": job, "from": frm, "to": to,
                            "reason": reason, "evidence": evidence, "actor": "test", "at": str(self.at)})

    def run(self, job: str, ends: str = "succeeded", reason: str = "exit_0") -> None:
        """`job` queued, promoted, claimed and ended."""
        self(job, "", "queued", "enqueued")
        self.promote_and_end(job, ends, reason)

    def promote_and_end(self, job: str, ends: str = "succeeded", reason: str = "exit_0") -> None:
        self(job, "queued", "running", "promoted", "attempt=1")
        self(job, "running", "running", "claimed")
        self(job, "running", ends, reason)


def zeros(v: TimeVerdict) -> tuple[int, int, int, int, int]:
    return (len(v.dependents_early), len(v.dependency_cancels_wrong), len(v.ticks_twice),
            len(v.delayed_early), len(v.retry_breaches))


def holds_with(v: TimeVerdict) -> bool:
    figures = Figures()
    figures.time = v
    return figures.zeros_hold()


# ---- the transitions ---------------------------------------------------------------------------------------


def test_every_transition_of_time_and_dependencies_is_legal_in_its_order() -> None:
    s = Stream()
    s("a", "", "waiting", "enqueued", "until 2026-12-02T00:00:00.000000Z")
    s("a", "waiting", "paused", "pause")
    s("a", "paused", "waiting", "resume")
    s("a", "waiting", "queued", "wait_over")
    s("a", "queued", "running", "promoted")
    s("a", "running", "running", "timeout", "ran 2 s, its limit 1 s")
    s("a", "running", "waiting", "retry", "retry 1 of 1 in 1 s after timeout")
    s("a", "waiting", "queued", "wait_over")
    s.promote_and_end("a", "failed", "timeout")
    s("a", "failed", "waiting", "retried")
    s("a", "waiting", "cancelled", "cancel")
    s("a", "cancelled", "queued", "retried")
    s.promote_and_end("a")
    s("a", "", "", "schedule_skipped", "schedule s tick ...: its last job is succeeded")  # a note
    s("b", "", "waiting", "enqueued", "after a")
    s("b", "waiting", "paused", "pause")
    s("b", "paused", "cancelled", "dependency_failed", "job x failed")
    s("b", "cancelled", "waiting", "retried")
    s("b", "waiting", "cancelled", "dependency_failed", "job x failed")
    assert check_transitions(s.events, ["a", "b"]) == 0


def test_a_new_pair_with_another_reason_or_from_the_wrong_state_is_illegal() -> None:
    queued, promoted = ("", "queued", "enqueued"), ("queued", "running", "promoted")
    born_waiting, paused = ("", "waiting", "enqueued"), ("waiting", "paused", "pause")
    for before, (frm, to, reason) in [
        ([born_waiting], ("waiting", "queued", "promoted")),  # only the release step queues a waiting job
        ([queued, promoted], ("running", "waiting", "shutdown_handback")),  # a handback keeps its place
        ([], ("", "waiting", "retry")),
        ([born_waiting, paused], ("paused", "waiting", "wait_over")),  # only a resume
        ([queued, promoted, ("running", "succeeded", "exit_0")], ("succeeded", "queued", "retried")),
        ([born_waiting], ("waiting", "running", "promoted")),  # a waiting job is never promoted
        ([born_waiting, paused], ("waiting", "queued", "wait_over")),  # from a state it was not in
    ]:
        s = Stream()
        for step in before:
            s("j", *step)
        s("j", frm, to, reason)
        assert check_transitions(s.events, ["j"]) == 1, (frm, to, reason)


# ---- no dependent started before its dependency succeeded --------------------------------------------------


def pipeline(s: Stream) -> dict[str, Built]:
    """a, then b after a, then c after b: each released and run once the one before it succeeded."""
    s("a", "", "queued", "enqueued")
    s("b", "", "waiting", "enqueued", "after a")
    s("c", "", "waiting", "enqueued", "after b")
    s.promote_and_end("a")
    s("b", "waiting", "queued", "wait_over")
    s.promote_and_end("b")
    s("c", "waiting", "queued", "wait_over")
    s.promote_and_end("c")
    return {"a": PLAIN, "b": Built("link", after=("a",)), "c": Built("link", after=("b",))}


def test_a_pipeline_run_in_order_holds_the_zero() -> None:
    s = Stream()
    v = judge_time(s.events, pipeline(s), {})
    assert zeros(v) == (0, 0, 0, 0, 0) and holds_with(v)
    assert v.met["released"] == 2


def test_a_dependent_queued_or_promoted_before_its_dependency_succeeded_breaks_it() -> None:
    s = Stream()
    built = pipeline(s)
    # b's release moved before a's success: queued (and promoted) while a was still running.
    release = next(i for i, e in enumerate(s.events) if e["job"] == "b" and e["reason"] == "wait_over")
    s.events.insert(3, s.events.pop(release))
    v = judge_time(s.events, built, {})
    assert len(v.dependents_early) == 1 and "it waits for a, queued" in v.dependents_early[0]
    assert v.involved == {"b"} and not holds_with(v)
    assert "dependents_early=1" in Figures(time=v).line()


def test_a_dependent_promoted_after_its_dependency_failed_breaks_it() -> None:
    s = Stream()
    s("a", "", "queued", "enqueued")
    s("b", "", "waiting", "enqueued", "after a")
    s.promote_and_end("a", "failed", "exit_code_3")
    s("b", "waiting", "queued", "wait_over")  # it must have been cancelled instead
    s.promote_and_end("b")
    v = judge_time(s.events, {"a": PLAIN, "b": Built("link", after=("a",))}, {})
    assert len(v.dependents_early) == 2 and all("it waits for a, failed" in x for x in v.dependents_early)
    assert not holds_with(v)


def test_a_dependent_born_queued_after_its_dependency_succeeded_holds_and_one_retried_in_turn_too() -> None:
    s = Stream()
    s.run("a", "failed", "exit_code_3")
    s("b", "", "waiting", "enqueued", "after a")
    s("b", "waiting", "cancelled", "dependency_failed", "job a failed")
    s("a", "failed", "queued", "retried")  # a person retries a, then b: b runs once a succeeded
    s.promote_and_end("a")
    s("b", "cancelled", "queued", "retried")
    s.promote_and_end("b")
    s("c", "", "queued", "enqueued")  # after a, which had succeeded already
    s.promote_and_end("c")
    built = {"a": PLAIN, "b": Built("link", after=("a",)), "c": Built("link", after=("a",))}
    v = judge_time(s.events, built, {})
    assert zeros(v) == (0, 0, 0, 0, 0), v.lines()
    assert (v.met["dependency_cancelled"], v.met["retried_by_a_person"]) == (1, 2)


def test_a_dependency_cancel_that_names_a_job_it_does_not_wait_for_or_one_not_ended_breaks_its_zero() -> None:
    built = {"a": PLAIN, "x": PLAIN, "b": Built("link", after=("a",))}
    good, stranger, early = Stream(), Stream(), Stream()
    for s in (good, stranger, early):
        s("a", "", "queued", "enqueued")
        s("x", "", "queued", "enqueued")
        s("b", "", "waiting", "enqueued", "after a")
        s.promote_and_end("x", "failed", "exit_code_3")
    good.promote_and_end("a", "cancelled", "cancel_requested")
    good("b", "waiting", "cancelled", "dependency_failed", "job a cancelled")
    stranger.promote_and_end("a", "failed", "exit_code_3")
    stranger("b", "waiting", "cancelled", "dependency_failed", "job x failed")
    early("b", "waiting", "cancelled", "dependency_failed", "job a failed")  # a still queued
    assert zeros(judge_time(good.events, built, {})) == (0, 0, 0, 0, 0)
    # a failed, and a person retried it before the release step cancelled b: that cancel is right too.
    retried = Stream()
    retried.events, retried.at = [dict(e) for e in stranger.events[:-1]], stranger.at
    retried("a", "failed", "queued", "retried")
    retried("b", "waiting", "cancelled", "dependency_failed",
            "job a failed or was cancelled, and was retried since")
    assert zeros(judge_time(retried.events, built, {})) == (0, 0, 0, 0, 0)
    for s in (stranger, early):
        v = judge_time(s.events, built, {})
        assert zeros(v) == (0, 1, 0, 0, 0), v.lines()
        assert not holds_with(v)


# ---- no schedule tick fired twice --------------------------------------------------------------------------


def test_one_job_per_tick_holds_and_two_jobs_of_one_tick_break_the_zero() -> None:
    s = Stream()
    for job in ("f1", "f2", "f3"):
        s.run(job)
    s("f3", "", "", "schedule_skipped", "schedule soak-tick tick ...: its last job is running")
    once = {"f1": ("soak-tick", "1000"), "f2": ("soak-tick", "4000"), "f3": ("other", "1000")}
    v = judge_time(s.events, {}, once)
    assert zeros(v) == (0, 0, 0, 0, 0) and (v.met["fired"], v.met["ticks_skipped"]) == (3, 1)
    twice = {**once, "f3": ("soak-tick", "4000")}
    v = judge_time(s.events, {}, twice)
    assert v.ticks_twice == ["schedule soak-tick tick 4000: jobs f2, f3"]
    assert v.involved == {"f2", "f3"} and not holds_with(v)
    assert "ticks_twice=1" in Figures(time=v).line()


# ---- a delayed job starts no earlier than its not_before ---------------------------------------------------


def test_a_delayed_job_released_at_its_time_holds_and_one_queued_before_breaks() -> None:
    delayed = {"d": Built("delayed", frozenset(), not_before_ms=2_000_000)}
    for queued_at, early in ((2_000_000, 0), (2_000_450, 0), (1_999_999, 1)):
        s = Stream()
        s("d", "", "waiting", "enqueued", "until ...", at=1_000_000)
        s("d", "waiting", "queued", "wait_over", at=queued_at)
        s.promote_and_end("d")
        v = judge_time(s.events, delayed, {})
        assert len(v.delayed_early) == early, (queued_at, v.lines())
    # Cancelled while it waited and retried by a person: the retry runs it at once, not judged.
    s = Stream()
    s("d", "", "waiting", "enqueued", "until ...", at=1_000_000)
    s("d", "waiting", "cancelled", "cancel")
    s("d", "cancelled", "queued", "retried")
    s.promote_and_end("d")
    assert zeros(judge_time(s.events, delayed, {})) == (0, 0, 0, 0, 0)


# ---- retries: only a failure of the job's own its spec retries, within its retries -------------------------


def retried(s: Stream, job: str, n: int, of: int, after: str) -> None:
    s(job, "running", "waiting", "retry", f"retry {n} of {of} in 1 s after {after}; exit_code=4")
    s(job, "waiting", "queued", "wait_over")
    s(job, "queued", "running", "promoted")


def test_retries_as_built_hold_and_each_way_to_break_them_is_counted() -> None:
    built = {"r": Built("retry_fail", frozenset({"exit_code_4"}), retries=2, retry_on=(4,))}

    def stream(*steps: tuple[int, int, str], ends: str = "exit_code_4") -> list[dict[str, str]]:
        s = Stream()
        s("r", "", "queued", "enqueued")
        s("r", "queued", "running", "promoted")
        for n, of, after in steps:
            retried(s, "r", n, of, after)
        s("r", "running", "failed", ends)
        return s.events

    v = judge_time(stream((1, 2, "exit_code_4"), (2, 2, "exit_code_4")), built, {})
    assert zeros(v) == (0, 0, 0, 0, 0) and v.met["retried_by_policy"] == 2
    for events in (
        stream((1, 2, "exit_code_4"), (2, 2, "exit_code_4"), (3, 2, "exit_code_4")),  # past its retries
        stream((1, 2, "exit_code_5"), (2, 2, "exit_code_4")),  # an exit its retry_on leaves out
        stream((1, 2, "daemon_restart_lost_exit"), (2, 2, "exit_code_4")),  # a crash spends no retry
        stream((2, 2, "exit_code_4"), (2, 2, "exit_code_4")),  # numbered wrong
        stream((1, 2, "exit_code_4")),  # failed with a retry left
    ):
        v = judge_time(events, built, {})
        assert len(v.retry_breaches) >= 1 and zeros(v)[:4] == (0, 0, 0, 0), v.lines()
        assert not holds_with(v)
    # Ended by a crash with retries left: not a failure its spec retries.
    assert zeros(judge_time(stream(ends="daemon_restart_lost_exit"), built, {})) == (0, 0, 0, 0, 0)
    # A person's retry makes its retries whole again.
    s = Stream()
    s.events = stream((1, 2, "exit_code_4"), (2, 2, "exit_code_4"))
    s("r", "failed", "queued", "retried")
    s("r", "queued", "running", "promoted")
    retried(s, "r", 1, 2, "exit_code_4")
    retried(s, "r", 2, 2, "exit_code_4")
    s("r", "running", "failed", "exit_code_4")
    assert zeros(judge_time(s.events, built, {})) == (0, 0, 0, 0, 0)


def test_a_timeout_job_that_succeeded_is_counted_but_breaks_no_zero() -> None:
    s = Stream()
    s.run("t")
    s.run("u", "failed", "timeout")
    built = {"t": Built("timeout", frozenset({"timeout"})), "u": Built("timeout", frozenset({"timeout"}))}
    v = judge_time(s.events, built, {})
    assert len(v.timeouts_unenforced) == 1 and v.involved == {"t"} and holds_with(v)
    assert fails_as(built, "u") == {"timeout"} and fails_as(built, "plain-job") == {"exit_code_3"}


# ---- the mix -----------------------------------------------------------------------------------------------


def draws(seed: int, n: int, backend: Backend) -> tuple[TimeMix, list[str]]:
    """At least `n` jobs of the time mix of `seed`, enqueued in a pool where nothing starts (max 0 slots):
    the enqueue's checks and holds alone."""
    pool = backend.pool(max_concurrent_jobs=0)
    for name, size in LIMITS.items():
        pool.set_limit(name, size)
    mix = TimeMix(random.Random(seed), JobMix(random.Random(seed + 1), 2))
    ids: list[str] = []
    while len(ids) < n:
        ids += mix.feed(pool, lambda: ["true"], ids)
    return mix, ids


def test_the_time_mix_is_the_seeds_and_a_pool_takes_every_draw_as_built(backend: Backend) -> None:
    # Before the jobs are enqueued: a delayed job's start was to come then (it may have come by the time the
    # rows are read, on a slow run; nothing here releases it, so it still waits).
    enqueued_after_ms = time.time() * 1000
    first, ids = draws(4, 120, backend)
    again, _ = draws(4, 120, backend)
    assert [(b.kind, b.retries, b.retry_on, len(b.after)) for b in first.built.values()] == [
        (b.kind, b.retries, b.retry_on, len(b.after)) for b in again.built.values()]
    kinds = first.kinds
    assert all(kinds[k] > 0 for k in ("plain", "timeout", "retry_fail", "retry_flaky", "not_retried",
                                      "delayed", "pipeline")), kinds
    pool = backend.pool()
    for job_id in ids:
        b, job = first.built[job_id], pool.get(job_id)
        assert (job.spec.retries, tuple(job.spec.retry_on)) == (b.retries, b.retry_on), b
        assert (job.spec.timeout is not None) == (b.kind == "timeout"), b
        assert job.after == b.after, b
        if b.not_before_ms:
            assert job.state is JobState.WAITING and job.wait_until == b.not_before_ms > enqueued_after_ms
        if b.after:
            assert job.state is JobState.WAITING
    assert any(b.kind == "failing_link" for b in first.built.values())
    assert any(len(b.after) > 1 for b in first.built.values()), "a fan-in"


# ---- the jobs a schedule fired, found in the stream --------------------------------------------------------


def test_the_event_log_finds_each_job_a_schedule_fired_with_its_tick(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)  # nothing starts; overlap 'queue' fires each tick all the same
    log = EventLog("", pool.keys, client=backend.client)
    mine = pool.enqueue(IMAGE, ["true"]).id
    pool.add_schedule("every-second", every=1, overlap="queue", image=IMAGE, command=["true"])
    made = 0
    deadline = time.monotonic() + 10
    while made < 2 and time.monotonic() < deadline:
        made += schedules.fire_due(pool.store, "test")
        time.sleep(0.05)
    log.read()
    rows = {j.id: (j.schedule, str(j.tick)) for j in pool.list(JobState.QUEUED, limit=10) if j.schedule}
    assert made >= 2 and log.fired == rows and mine not in log.fired and not log.unread
    assert len(set(log.fired.values())) == len(log.fired)
    assert zeros(judge_time(log.events, {mine: PLAIN}, log.fired)) == (0, 0, 0, 0, 0)
