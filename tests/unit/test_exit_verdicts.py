"""The Python exit -> state rules against the Lua scripts that apply them, by running the scripts.

A dry run of the sweep shows `expected_state` (jobpool/supervisor/verdicts.py); what happens is decided by
reconcile_apply.lua for the supervisor and finish.lua for a worker (both through `verdict_for_exit` in
_lib.lua). Each case here sets up a real row with the real scripts (claim, pause, cancel, resume), asks the
Python rules what will happen, applies the verdict or the finish as jobpool does (`Applier.apply`,
`Attempt.finish` with the kind `finish_kind` picks), and compares with the state the script left, on
fakeredis[lua] and on a real server. Every exit is tried as the job's own, as an OOM kill and as a crash
(its daemon ended it: jobpool/exits.py), with and without recovery budget left.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from jobpool.api import Pool
from jobpool.contract import EXIT_TEMPFAIL, EXIT_UNKNOWN, REASON_OOM_KILLED, REASON_RESTART_LOST_EXIT
from jobpool.exits import CRASHED, OOM, OWN, Ending
from jobpool.supervisor.apply import Applier
from jobpool.supervisor.probes import Absent, Present, Probe
from jobpool.supervisor.verdicts import (
    DispatchFacts,
    Kind,
    RowSnapshot,
    decide,
    expected_state,
    state_after_exit,
)
from jobpool.workers.attempt import Attempt
from jobpool.workers.watch import finish_kind
from tests.support.attempts import claim
from tests.support.pool_helpers import Backend, enqueue, row, state_of

CODES = [0, EXIT_TEMPFAIL, 1, 143, EXIT_UNKNOWN]
#: What ended the container besides its own process, with the error_reason the rules give it.
CAUSES = {OWN: "", OOM: REASON_OOM_KILLED, CRASHED: REASON_RESTART_LOST_EXIT}


def _pause_withdrawn(pool: Pool, job_id: str) -> None:
    pool.pause(job_id)
    pool.resume(job_id)


#: What a user asked of the running job before it ended, each through its own script.
INTENTS: dict[str, Callable[[Pool, str], object]] = {
    "none": lambda pool, job_id: None,
    "cancel": lambda pool, job_id: pool.cancel(job_id),
    "pause": lambda pool, job_id: pool.pause(job_id),
    "pause withdrawn": _pause_withdrawn,
    "pause and cancel": lambda pool, job_id: (pool.pause(job_id), pool.cancel(job_id)),
}


def running(backend: Backend, intent: str, budget: int = 1) -> tuple[Pool, str, Attempt]:
    """A claimed, launched job with `intent` applied, and the queue's promotion paused so that whatever the
    job ends as stays visible (a handed-back job is not promoted again)."""
    pool = backend.pool(max_concurrent_jobs=1, recovery_budget=budget)
    job = enqueue(pool)
    att = claim(pool, job.id)
    att.set_container("c-1", "daemon-1")
    INTENTS[intent](pool, job.id)
    pool.pause(None)
    assert state_of(pool, job.id) == "running"
    return pool, job.id, att


def supervise(pool: Pool, job_id: str, probe: Probe) -> tuple[str, str]:
    """The worker is gone: (what the dry run predicts, the state reconcile_apply.lua leaves)."""
    pool.store.client.delete(pool.keys.lease(job_id))
    snap = RowSnapshot.from_row(row(pool, job_id))
    verdict = decide(snap, False, probe, None, pool.store.client.time()[0] * 1000, pool.settings)
    predicted = expected_state(snap, verdict, pool.settings)
    # A probe without a container id needs no Docker: nothing to remove, so no prober is asked.
    Applier(pool.store, None, None, "test-supervisor").apply(snap, verdict, probe, set())  # type: ignore[arg-type]
    return predicted, row(pool, job_id)["state"]


# ---- the supervisor: reconcile_apply.lua -------------------------------------------------------------


@pytest.mark.parametrize("intent", INTENTS)
@pytest.mark.parametrize("code", CODES)
def test_container_exited(backend: Backend, code: int, intent: str) -> None:
    pool, job_id, _ = running(backend, intent)
    predicted, got = supervise(pool, job_id, Present(running=False, exit_code=code))
    assert predicted == got == state_of(pool, job_id)


@pytest.mark.parametrize("intent", INTENTS)
@pytest.mark.parametrize("budget", [0, 1])
def test_container_absent(backend: Backend, budget: int, intent: str) -> None:
    pool, job_id, _ = running(backend, intent, budget)
    predicted, got = supervise(pool, job_id, Absent())
    assert predicted == got == state_of(pool, job_id)


@pytest.mark.parametrize("stored", ["-1", "junk", "1.5", "0"])
def test_absent_with_an_unreadable_recovery_count_and_no_budget(backend: Backend, stored: str) -> None:
    """A count edited by hand reads as the scripts read it (0), so the dry run says what will happen."""
    pool, job_id, _ = running(backend, "none", budget=0)
    pool.store.client.hset(pool.keys.job(job_id), "recovery_attempts", stored)
    predicted, got = supervise(pool, job_id, Absent())
    assert (predicted, got) == ("failed", "failed")


@pytest.mark.parametrize("intent", INTENTS)
@pytest.mark.parametrize("budget", [0, 1])
@pytest.mark.parametrize("cause", [OOM, CRASHED])
@pytest.mark.parametrize("code", CODES)
def test_container_ended_by_the_oom_killer_or_its_daemon(backend: Backend, code: int, cause: str, budget: int,
                                                         intent: str) -> None:
    pool, job_id, _ = running(backend, intent, budget)
    probe = Present(running=False, exit_code=code, ending=Ending(code, cause, CAUSES[cause], "seen"))
    predicted, got = supervise(pool, job_id, probe)
    assert predicted == got == state_of(pool, job_id)


def test_an_exit_without_a_code_changes_nothing(backend: Backend) -> None:
    pool, job_id, _ = running(backend, "none")
    assert supervise(pool, job_id, Present(running=False)) == ("running", "running")


def test_container_running_keeps_the_row(backend: Backend) -> None:
    pool, job_id, _ = running(backend, "none")
    pool.store.client.delete(pool.keys.lease(job_id))
    snap = RowSnapshot.from_row(row(pool, job_id))
    verdict = decide(snap, False, Present(running=True), None, 0, pool.settings)
    assert verdict.kind is Kind.ADOPT and expected_state(snap, verdict, pool.settings) == "running"


def test_a_lost_dispatch_is_redispatched_and_stays_running(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1, claim_grace_secs=0.1)
    job = enqueue(pool)
    snap = RowSnapshot.from_row(row(pool, job.id))
    now = (snap.promoted_at or 0) + 1000
    verdict = decide(snap, False, None, DispatchFacts(), now, pool.settings)
    assert verdict.kind is Kind.REDISPATCH
    Applier(pool.store, None, None, "test-supervisor").apply(snap, verdict, None, set())  # type: ignore[arg-type]
    assert expected_state(snap, verdict, pool.settings) == state_of(pool, job.id) == "running"
    assert pool.get(job.id).attempt == snap.attempt + 1


def test_a_dispatch_made_again_gets_a_claim_grace_of_its_own_despite_a_lingering_older_delivery(
        backend: Backend) -> None:
    """A worker took the delivery and died: its entry lingers in RQ's intermediate list for minutes. Past the
    claim grace the sweep dispatches a new attempt; a worker takes that one at once, and the next sweep must
    give it time to claim (counted per attempt), not dispatch again while the old entry still shows the id
    taken. Counted per id, it dispatched every sweep (seen in the soak: 2,274 attempts, none claimed)."""
    from jobpool.supervisor import ContainerProber, Supervisor

    pool = backend.pool(max_concurrent_jobs=1, claim_grace_secs=5)
    job = enqueue(pool)
    k = pool.keys
    assert backend.client.lmove(k.rq_queue, k.rq_intermediate, "RIGHT", "LEFT") in (job.id, job.id.encode())
    sup = Supervisor(pool.store, ContainerProber("unix:///nonexistent/jobpool.sock", timeout=1))
    try:
        assert sup.sweep().decisions[0].verdict.kind is Kind.KEEP, "taken moments ago: within the grace"
        sup.evidence._taken_since = {key: at - 60 for key, at in sup.evidence._taken_since.items()}
        assert sup.sweep().decisions[0].verdict.kind is Kind.REDISPATCH, "held for a minute: lost"
        assert pool.get(job.id).attempt == 2
        backend.client.lmove(k.rq_queue, k.rq_intermediate, "RIGHT", "LEFT")  # a worker takes attempt 2
        assert pool.store.client.lrange(k.rq_intermediate, 0, -1) == [job.id] * 2
        decision = sup.sweep().decisions[0]
        assert decision.verdict.kind is Kind.KEEP, decision
        assert pool.get(job.id).attempt == 2, "the worker that took attempt 2 can still claim it"
    finally:
        sup.close()


# ---- the worker: finish.lua ----------------------------------------------------------------------------


@pytest.mark.parametrize("intent", INTENTS)
@pytest.mark.parametrize("budget", [0, 1])
@pytest.mark.parametrize("cause", CAUSES, ids=["own", "oom", "crashed"])
@pytest.mark.parametrize("stop_asked", [False, True], ids=["exit", "interrupted"])
@pytest.mark.parametrize("code", CODES)
def test_worker_finish(backend: Backend, code: int, stop_asked: bool, cause: str, budget: int,
                       intent: str) -> None:
    pool, job_id, att = running(backend, intent, budget)
    snap = RowSnapshot.from_row(row(pool, job_id))
    predicted = state_after_exit(code, stop_asked, snap.cancel_requested, snap.pause_requested, cause,
                                 snap.recovery_attempts < budget)
    ended = Ending(code, cause, CAUSES[cause])
    reply = att.finish(finish_kind(ended, stop_asked), code, reason=ended.reason)
    assert predicted.value == reply == state_of(pool, job_id)
