"""How an attempt ends when its own process did not end it, in the scripts (finish.lua for a worker,
reconcile_apply.lua for the supervisor, both through `verdict_for_exit` in _lib.lua) and in the rule that
decides it (jobpool/exits.py), on fakeredis[lua] and a real server.

An OOM kill fails the job `oom_killed`; a crash (its daemon ended it) spends one unit of recovery budget
like a vanished container: queued again at its place while budget is left, else failed, the error_reason
naming the evidence; the exit code is recorded either way. What Docker reports in each case is tested with
real daemons in tests/integration/test_daemon_faults.py.
"""

from __future__ import annotations

import pytest

from jobpool import Pool, errors
from jobpool.contract import (
    EXIT_TEMPFAIL,
    EXIT_UNKNOWN,
    REASON_CONTAINER_REMOVED,
    REASON_HOST_REBOOTED,
    REASON_OOM_KILLED,
    REASON_RESTART_LOST_EXIT,
    REASON_RESTART_STOPPED,
)
from jobpool.exits import CRASHED, OOM, OWN, Ending, Outages, docker_time, ending, killed_by_removal
from jobpool.supervisor.apply import Applier
from jobpool.supervisor.probes import Present
from jobpool.supervisor.verdicts import Kind, RowSnapshot, decide
from jobpool.workers.attempt import Attempt
from tests.support.attempts import claim
from tests.support.pool_helpers import (
    Backend,
    enqueue,
    events_of,
    queued_ids,
    row,
    running_ids,
    state_of,
)

T0 = 1_800_000_000.0  # an epoch second; Docker stamps below are built from it


def stamp(t: float) -> str:
    """A Docker timestamp (RFC 3339 with nanoseconds) for epoch second `t`."""
    from datetime import datetime, timezone

    whole = datetime.fromtimestamp(int(t), timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{round((t - int(t)) * 1e9):09d}Z"


def state(code: int, started: float, finished: float, oom: bool = False) -> dict[str, object]:
    return {"Status": "exited", "Running": False, "ExitCode": code, "Error": "", "OOMKilled": oom,
            "StartedAt": stamp(started), "FinishedAt": stamp(finished)}


def restarted(lost: float, back: float) -> Outages:
    outages = Outages()
    outages.unanswered(lost - 1)
    outages.unanswered(lost)  # the latest unanswered request opens the window
    outages.answered(back)
    return outages


def no_info() -> bool:
    raise AssertionError("the daemon's live-restore setting was asked for when it could not decide")


# ---- the rule (jobpool/exits.py) ------------------------------------------------------------------------


def test_docker_time_reads_nanoseconds_zones_and_the_zero_time() -> None:
    assert docker_time(stamp(T0 + 0.123456789)) == pytest.approx(T0 + 0.123456789, abs=1e-6)
    assert docker_time("2027-01-15T09:00:00+01:00") == docker_time("2027-01-15T08:00:00Z")
    assert docker_time("0001-01-01T00:00:00Z") is None
    assert docker_time("garbage") is None and docker_time(None) is None


def test_a_255_recorded_inside_a_restart_window_is_a_lost_exit() -> None:
    end = ending(state(EXIT_UNKNOWN, T0, T0 + 10.5), restarted(T0 + 10, T0 + 11), no_info)
    assert (end.cause, end.reason, end.code) == (CRASHED, REASON_RESTART_LOST_EXIT, EXIT_UNKNOWN)
    assert "could not read" in end.evidence


@pytest.mark.parametrize(("what", "started", "finished"), [
    ("ended before the daemon was last seen gone (its shim kept the real code)", T0, T0 + 9.9),
    ("ended after the daemon first answered again (a live exit)", T0, T0 + 11.5),
    ("started after the window opened", T0 + 10.2, T0 + 10.5),
])
def test_a_255_outside_a_restart_window_is_the_jobs_own(what: str, started: float, finished: float) -> None:
    end = ending(state(EXIT_UNKNOWN, started, finished), restarted(T0 + 10, T0 + 11), no_info)
    assert end == Ending(EXIT_UNKNOWN), what


def test_a_255_with_no_outage_seen_is_the_jobs_own() -> None:
    assert ending(state(EXIT_UNKNOWN, T0, T0 + 1), Outages(), no_info) == Ending(EXIT_UNKNOWN)


@pytest.mark.parametrize(("what", "started", "finished", "by_reboot"), [
    ("started before the boot, its end recorded after it", T0 - 100, T0 + 5, True),
    ("ended before the host went down", T0 - 100, T0 - 50, False),
    ("started in this boot", T0 + 1, T0 + 5, False),
    ("ended after this observer first heard from the daemon (a live exit)", T0 - 100, T0 + 20, False),
])
def test_a_container_of_an_earlier_boot_whose_end_this_boot_recorded_was_ended_by_the_reboot(
        what: str, started: float, finished: float, by_reboot: bool) -> None:
    outages = Outages(booted_at=T0)
    outages.answered(T0 + 10)
    end = ending(state(3, started, finished), outages, no_info)
    assert (end.cause, end.reason) == ((CRASHED, REASON_HOST_REBOOTED) if by_reboot else (OWN, "")), what
    assert ending(state(3, started, finished), Outages(booted_at=T0), no_info) == Ending(3), "never answered"


def test_an_outage_still_going_on_is_no_window() -> None:
    outages = Outages()
    outages.unanswered(T0 + 10)
    assert ending(state(EXIT_UNKNOWN, T0, T0 + 10.5), outages, no_info) == Ending(EXIT_UNKNOWN)


@pytest.mark.parametrize(("live_restore", "expected"), [(False, CRASHED), (True, OWN)])
def test_another_exit_inside_the_window_is_the_daemons_only_without_live_restore(live_restore: bool,
                                                                                expected: str) -> None:
    end = ending(state(143, T0, T0 + 10.5), restarted(T0 + 10, T0 + 11), lambda: live_restore)
    assert end.cause == expected and end.code == 143
    assert end.reason == (REASON_RESTART_STOPPED if expected == CRASHED else "")


def test_oom_killed_is_the_kernels_whenever_it_ended() -> None:
    end = ending(state(137, T0, T0 + 10.5, oom=True), restarted(T0 + 10, T0 + 11), no_info)
    assert (end.cause, end.reason, end.code) == (OOM, REASON_OOM_KILLED, 137)


def test_an_oom_kill_the_daemon_heard_of_after_the_exit_is_found_in_its_event_log() -> None:
    # Exit 137 without State.OOMKilled: the daemon's event log decides (exits.oom_event).
    end = ending(state(137, T0, T0 + 10.5), Outages(), no_info, lambda: True)
    assert (end.cause, end.reason, end.code) == (OOM, REASON_OOM_KILLED, 137)
    assert "oom event" in end.evidence
    assert ending(state(137, T0, T0 + 10.5), Outages(), no_info, lambda: False) == Ending(137)


@pytest.mark.parametrize(("status", "code", "oom", "removal"), [
    ("removing", 137, False, True),    # `docker rm -f`: marked as being removed, then killed
    ("exited", 137, False, False),     # a kill -9, or a `docker kill` (a later `docker rm`: its event log)
    ("dead", 137, False, False),       # a removal that failed: gone nowhere, a crash (`ending`, below)
    ("removing", 3, False, False),     # its own exit, removed after it ended
    ("removing", 137, True, False),    # OOMKilled set: Docker's word for an OOM kill wins
])
def test_only_an_exit_137_read_while_docker_removes_the_container_was_the_removals_kill(
        status: str, code: int, oom: bool, removal: bool) -> None:
    assert killed_by_removal({**state(code, T0, T0 + 1, oom=oom), "Status": status}) is removal


def test_an_exit_137_of_a_container_left_dead_by_a_failed_removal_is_a_crash() -> None:
    """Docker marks a container dead only as it removes it, and never starts a dead one: a removal that
    killed it and then failed leaves it so for good (tests/integration/test_workers_docker.py makes one)."""
    dead = {**state(137, T0, T0 + 1), "Status": "dead", "Dead": True,
            "Error": 'driver "vfs" failed to remove root filesystem: operation not permitted'}
    end = ending(dead, Outages(), no_info, lambda: False)
    assert (end.code, end.cause, end.reason) == (137, CRASHED, REASON_CONTAINER_REMOVED)
    assert "marked dead" in end.evidence and "operation not permitted" in end.evidence
    assert ending({**dead, "ExitCode": 3}, Outages(), no_info, no_log) == Ending(3), "its own, then removed"
    assert ending({**dead, "OOMKilled": True}, Outages(), no_info, no_log).cause == OOM
    assert ending(dead, Outages(), no_info, lambda: True).cause == OOM, "an oom event logged: the kernel's"


def no_log() -> bool:
    raise AssertionError("the daemon's event log was read when it could not decide")


@pytest.mark.parametrize("code", [0, 1, 143, EXIT_UNKNOWN])
def test_only_an_exit_137_without_the_flag_asks_the_event_log(code: int) -> None:
    ending(state(code, T0, T0 + 1), Outages(), no_info, no_log)
    ending(state(137, T0, T0 + 1, oom=True), Outages(), no_info, no_log)


def test_exit_0_is_the_jobs_own_even_flagged_oom_or_inside_a_window() -> None:
    assert ending(state(0, T0, T0 + 10.5, oom=True), restarted(T0 + 10, T0 + 11), no_info) == Ending(0)


def test_an_older_window_still_counts_for_a_container_judged_later() -> None:
    """A supervisor judges an orphan sweeps after the restart: every remembered window is looked at."""
    outages = restarted(T0 + 10, T0 + 11)
    outages.unanswered(T0 + 50)
    outages.answered(T0 + 51)
    end = ending(state(EXIT_UNKNOWN, T0, T0 + 10.5), outages, no_info)
    assert end.reason == REASON_RESTART_LOST_EXIT


# ---- the worker: finish.lua ----------------------------------------------------------------------------


def started(backend: Backend, budget: int = 1, recovered: int = 0) -> tuple[Pool, str, Attempt]:
    pool = backend.pool(max_concurrent_jobs=1, recovery_budget=budget)
    job = enqueue(pool)
    pool.store.client.hset(pool.keys.job(job.id), "recovery_attempts", recovered)
    att = claim(pool, job.id)
    att.set_container("c-1", "daemon-1")
    return pool, job.id, att


def test_a_crash_with_budget_left_is_queued_again_at_its_place(backend: Backend) -> None:
    pool, job_id, att = started(backend, budget=1)
    behind = enqueue(pool)
    pool.pause(None)  # so that what it ends as stays visible (a queued head is promoted at once)
    assert att.finish("crashed", EXIT_UNKNOWN, reason=REASON_RESTART_LOST_EXIT,
                      evidence="exit 255 recorded at a restart") == "queued"
    r = row(pool, job_id)
    assert (r["recovery_attempts"], r["exit_code"]) == ("1", "255")
    assert r["error_reason"] == REASON_RESTART_LOST_EXIT
    # Its slot is free, and it is back at its place: ahead of what was enqueued after it.
    assert running_ids(pool) == set() and queued_ids(pool) == [job_id, behind.id]
    last = events_of(pool, job_id)[-1]
    assert (last["from"], last["to"], last["reason"]) == ("running", "queued", REASON_RESTART_LOST_EXIT)
    assert last["evidence"] == "exit_code=255; exit 255 recorded at a restart"


def test_a_crash_with_no_budget_left_fails_naming_the_evidence(backend: Backend) -> None:
    pool, job_id, att = started(backend, budget=1, recovered=1)
    assert att.finish("crashed", 143, reason=REASON_RESTART_STOPPED) == "failed"
    job = pool.get(job_id)
    assert (job.error_reason, job.exit_code, job.recovery_attempts) == (REASON_RESTART_STOPPED, 143, 1)


def test_a_crash_without_a_reason_is_refused_and_changes_nothing(backend: Backend) -> None:
    pool, job_id, att = started(backend)
    before = row(pool, job_id)
    with pytest.raises(errors.JobpoolError):
        att.finish("crashed", EXIT_UNKNOWN)
    assert row(pool, job_id) == before


@pytest.mark.parametrize("code", [137, EXIT_TEMPFAIL])
def test_an_oom_kill_fails_oom_killed_whatever_the_code(backend: Backend, code: int) -> None:
    pool, job_id, att = started(backend)
    assert att.finish("oom", code) == "failed"
    job = pool.get(job_id)
    assert (job.error_reason, job.exit_code, job.recovery_attempts) == (REASON_OOM_KILLED, code, 0)


def test_a_cancel_asked_before_an_oom_kill_wins(backend: Backend) -> None:
    pool, job_id, att = started(backend)
    pool.cancel(job_id)
    assert att.finish("oom", 137) == "cancelled"


def test_a_crash_finish_sent_again_after_a_lost_reply_gets_the_same_answer(backend: Backend) -> None:
    pool, job_id, att = started(backend)
    assert att.finish("crashed", EXIT_UNKNOWN, reason=REASON_RESTART_LOST_EXIT) == "queued"
    assert att.finish("crashed", EXIT_UNKNOWN, reason=REASON_RESTART_LOST_EXIT) == "queued"
    assert row(pool, job_id)["recovery_attempts"] == "1", "a budget unit is spent once"


def test_a_finish_with_only_the_seven_old_arguments_still_reads_right(backend: Backend) -> None:
    """A caller from before ARGV[8..9] (budget, evidence): the two values the registry appends are not taken
    for them."""
    from jobpool.store.scriptcalls import CANDIDATES_ON_RELEASE

    pool, job_id, att = started(backend)
    pool.store.run("finish", [pool.keys.job(att.job_id), pool.keys.lease(att.job_id),
                              *pool.store.candidates(CANDIDATES_ON_RELEASE)],
             [job_id, att.boot_id, att.attempt, "exit", 3, "", ""])
    assert events_of(pool, job_id)[-1]["evidence"] == "exit_code=3"


# ---- the supervisor: reconcile_apply.lua ---------------------------------------------------------------


def orphan(pool: Pool, job_id: str) -> RowSnapshot:
    pool.store.client.delete(pool.keys.lease(job_id))
    return RowSnapshot.from_row(row(pool, job_id))


def test_the_supervisor_recovers_an_orphan_its_daemon_ended_as_a_crash(backend: Backend) -> None:
    pool, job_id, _ = started(backend, budget=1)
    snap = orphan(pool, job_id)
    probe = Present(running=False, exit_code=EXIT_UNKNOWN, detail="container c-1 exited with 255",
                    ending=Ending(EXIT_UNKNOWN, CRASHED, REASON_RESTART_LOST_EXIT, "seen"))
    verdict = decide(snap, False, probe, None, 0, pool.settings)
    assert (verdict.kind, verdict.reason) == (Kind.CRASHED, REASON_RESTART_LOST_EXIT)
    assert Applier(pool.store, None, None, "sup").apply(snap, verdict, probe, set()) == "queued"  # type: ignore[arg-type]
    r = row(pool, job_id)
    assert (r["state"], r["recovery_attempts"], r["exit_code"]) == ("queued", "1", "255")


def test_the_supervisor_fails_an_orphan_the_oom_killer_ended(backend: Backend) -> None:
    pool, job_id, _ = started(backend)
    snap = orphan(pool, job_id)
    probe = Present(running=False, exit_code=137, ending=Ending(137, OOM, REASON_OOM_KILLED, "seen"))
    verdict = decide(snap, False, probe, None, 0, pool.settings)
    assert verdict.kind is Kind.OOM
    Applier(pool.store, None, None, "sup").apply(snap, verdict, probe, set())  # type: ignore[arg-type]
    job = pool.get(job_id)
    assert (job.state.value, job.error_reason, job.exit_code) == ("failed", REASON_OOM_KILLED, 137)


def test_reconcile_refuses_a_crash_without_a_reason(backend: Backend) -> None:
    pool, job_id, _ = started(backend)
    snap = orphan(pool, job_id)
    keys = [pool.keys.job(job_id), pool.keys.lease(job_id), pool.keys.rq_job(job_id)]
    args = [job_id, snap.attempt, snap.owner_boot, snap.container_id, "crashed", "", EXIT_UNKNOWN, 1,
            "seen", "sup"]
    with pytest.raises(errors.JobpoolError):
        pool.store.run("reconcile_apply", keys, args)
    assert state_of(pool, job_id) == "running"
