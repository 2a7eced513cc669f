"""Time limits and retries with real processes: a real redis-server, the test dockerd, worker and supervisor
processes, killed with SIGKILL where the test says so.

A job past its time limit is stopped by whoever watches it (its worker, or a worker that adopted it after the
first was killed: the deadline is read from the container's own start, so the adopter keeps the same one)
and ends `failed` with error_reason `timeout`, its slot freed; a failed exit or a timeout with retries left
waits for its delay and runs again as a new attempt; a crash spends the recovery budget, never the retries
(docs/architecture.md, "Time and dependencies").
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import docker
import pytest

from jobpool import Job, JobState, Pool
from jobpool.supervisor import Supervisor
from tests.support.constants import FAST_ENV, IMAGE, SUB
from tests.support.job_containers import containers, started
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess

Spawn = Callable[..., JobpoolProcess]
#: The stop grace the workers run with (FAST_ENV): a job deaf to its stop signal is killed this long after.
GRACE = float(FAST_ENV["JOBPOOL_STOP_GRACE_SECS"])
#: What a bounded end may take beyond its limit and grace: a watch slice, a finish, a loaded test box.
SLACK = 5.0


def supervisor(spawn: Spawn) -> JobpoolProcess:
    """A real supervisor process: its sweep, and its timers releasing the retries when due."""
    return spawn(module="jobpool.cli", args=("supervisor",))


def history(pool: Pool, job_id: str) -> list[dict[str, str]]:
    return pool.events(job_id, count=1000)


def trail(pool: Pool, job_id: str) -> str:
    """A job's history, a line per event: what an assertion about it shows when it fails."""
    return "\n".join(f"{e['from']}->{e['to']} {e['reason']} [{e['evidence']}] {e['actor']}"
                     for e in history(pool, job_id))


def marks(pool: Pool, job_id: str) -> list[dict[str, str]]:
    """The time_out marks in a job's history (running -> running, reason timeout)."""
    return [e for e in history(pool, job_id) if (e["from"], e["to"], e["reason"]) == ("running", "running",
                                                                                      "timeout")]


def ended_within(job: Job, secs: float) -> float:
    """How long after its promotion the job ended, checked to be within `secs` (both on Redis's clock)."""
    assert job.promoted_at is not None and job.finished_at is not None
    took = (job.finished_at - job.promoted_at) / 1000
    assert took <= secs, f"job {job.id} ended {took:.1f}s after its start, more than {secs:.1f}s"
    return took


@pytest.fixture
def one_slot(pool: Pool, docker_host: str) -> Pool:
    pool.set_slots(1)
    return pool


def test_a_job_past_its_limit_is_stopped_and_fails_as_timeout_and_the_next_runs(
        one_slot: Pool, spawn: Spawn) -> None:
    pool = one_slot
    a = pool.enqueue(IMAGE, ["sleep", "600"], timeout=2)
    b = pool.enqueue(IMAGE, ["sh", "-c", "exit 0"])
    spawn()
    done = pool.wait(a.id, timeout=60)
    assert (done.state, done.error_reason, done.exit_code) == (JobState.FAILED, "timeout", 143)
    took = ended_within(done, 2 + SLACK)
    assert took >= 2
    [mark] = marks(pool, a.id)
    assert mark["evidence"] == "ran 2s; its limit is 2s" and mark["actor"].startswith("worker:")
    last = history(pool, a.id)[-1]
    assert (last["from"], last["to"], last["reason"]) == ("running", "failed", "timeout")
    # Its slot is free: the job queued behind it runs.
    assert pool.wait(b.id, timeout=60).state is JobState.SUCCEEDED


def test_a_job_deaf_to_its_stop_signal_is_killed_after_the_grace(one_slot: Pool, spawn: Spawn) -> None:
    pool = one_slot
    # Without an init the shell is PID 1 and ignores SIGTERM; its sleep goes on until the SIGKILL.
    a = pool.enqueue(IMAGE, ["sh", "-c", "trap '' TERM; sleep 600"], timeout=2, init=False)
    spawn()
    done = pool.wait(a.id, timeout=60)
    assert (done.state, done.error_reason, done.exit_code) == (JobState.FAILED, "timeout", 137)
    assert ended_within(done, 2 + GRACE + SLACK) >= 2 + GRACE
    assert pool.slots()[0] == 0


def test_a_subprocess_job_past_its_limit_fails_as_timeout(sub_pool: Pool, spawn: Spawn) -> None:
    pool = sub_pool
    pool.set_slots(1)
    a = pool.enqueue("ignored", ["sleep", "600"], timeout=2)
    spawn(**SUB)
    done = pool.wait(a.id, timeout=60)
    assert (done.state, done.error_reason) == (JobState.FAILED, "timeout")
    assert ended_within(done, 2 + SLACK) >= 2
    assert len(marks(pool, a.id)) == 1
    assert pool.slots()[0] == 0


@pytest.mark.parametrize("adopter_starts", ["before the deadline", "after the deadline"])
def test_the_limit_is_enforced_by_the_adopter_after_the_watcher_was_killed(
        one_slot: Pool, spawn: Spawn, dclient: docker.DockerClient, adopter_starts: str) -> None:
    pool = one_slot
    limit = 6
    a = pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 600"], timeout=limit)
    supervisor(spawn)
    w1 = spawn()
    eventually(lambda: started(dclient, a.id), timeout=30, message="the job started")
    [container] = containers(dclient, a.id)
    first_owner = pool.get(a.id).owner_boot
    w1.kill_with_children()
    if adopter_starts == "after the deadline":
        # Nobody watches it past its deadline: it runs on (no watcher, no stop) until someone adopts it.
        eventually(lambda: pool.store.now_ms() - int(pool.get(a.id).promoted_at or 0) > (limit + 1) * 1000,
                   timeout=30, message="the deadline passing")
        container.reload()
        assert container.status == "running" and not marks(pool, a.id)
    spawn()
    done = pool.wait(a.id, timeout=60)
    assert (done.state, done.error_reason, done.exit_code) == (JobState.FAILED, "timeout", 143)
    [adopted] = [e for e in history(pool, a.id) if e["reason"] == "adopted"]
    assert adopted["actor"] != first_owner
    [mark] = marks(pool, a.id)
    assert mark["actor"] == f"worker:{adopted['actor']}", "the adopter marks it"
    assert int(mark["at"]) >= int(adopted["at"])
    if adopter_starts == "before the deadline":
        # The adopter kept the launcher's deadline (the container's own start), not a limit of its own.
        assert ended_within(done, limit + SLACK) >= limit
        assert int(mark["at"]) - int(adopted["at"]) < limit * 1000
    else:
        # Its deadline had passed: stopped as soon as it was adopted.
        assert int(mark["at"]) - int(adopted["at"]) < SLACK * 1000
    assert pool.slots()[0] == 0


def retry_evidence(pool: Pool, job_id: str) -> list[str]:
    return [e["evidence"] for e in history(pool, job_id) if (e["to"], e["reason"]) == ("waiting", "retry")]


def test_failed_exits_are_retried_until_the_retries_are_spent(pool: Pool, docker_host: str,
                                                               spawn: Spawn) -> None:
    pool.set_slots(2)
    retried = pool.enqueue(IMAGE, ["sh", "-c", "echo run; exit 3"], retries=2, retry_delay=1)
    not_retried = pool.enqueue(IMAGE, ["sh", "-c", "exit 3"], retries=2, retry_delay=1, retry_on=[4])
    supervisor(spawn)
    spawn()
    spawn()
    done = pool.wait(retried.id, timeout=90)
    assert (done.state, done.error_reason, done.exit_code) == (JobState.FAILED, "exit_code_3", 3)
    assert (done.attempt, done.retries_used, done.recovery_attempts) == (3, 2, 0), trail(pool, retried.id)
    first, second = retry_evidence(pool, retried.id)
    assert first.startswith("retry 1 of 2 in 1 s after exit_code_3"), first
    assert second.startswith("retry 2 of 2 in 2 s after exit_code_3"), second
    # Each retry waited for its delay (at most a fifth off) before it was queued again.
    evs = history(pool, retried.id)
    waits = [(int(e["at"]), int(nxt["at"])) for e, nxt in itertools.pairwise(evs)
             if (e["to"], nxt["to"]) == ("waiting", "queued")]
    assert len(waits) == 2
    assert waits[0][1] - waits[0][0] >= 800 and waits[1][1] - waits[1][0] >= 1600

    other = pool.wait(not_retried.id, timeout=60)
    assert (other.state, other.error_reason, other.attempt, other.retries_used) == (
        JobState.FAILED, "exit_code_3", 1, 0)
    assert retry_evidence(pool, not_retried.id) == []


def test_a_timeout_is_retried_once_then_fails_as_timeout(one_slot: Pool, spawn: Spawn) -> None:
    pool = one_slot
    a = pool.enqueue(IMAGE, ["sleep", "600"], timeout=2, retries=1, retry_delay=1)
    supervisor(spawn)
    spawn()
    done = pool.wait(a.id, timeout=90)
    assert (done.state, done.error_reason, done.attempt, done.retries_used) == (
        JobState.FAILED, "timeout", 2, 1)
    [evidence] = retry_evidence(pool, a.id)
    assert evidence.startswith("retry 1 of 1 in 1 s after timeout"), evidence
    assert len(marks(pool, a.id)) == 2  # each attempt ran its own whole limit out


#: A job that crashes once and then fails on its own: its first attempt leaves a mark in its checkpoint and
#: runs until it is killed with its worker; every later one finds the mark and exits 3.
CRASH_THEN_FAIL = ('if [ -f "$JOBPOOL_CHECKPOINT_DIR/ran" ]; then echo again; exit 3; fi; '
                   'touch "$JOBPOOL_CHECKPOINT_DIR/ran"; echo started; sleep 600')


def test_a_crash_spends_recovery_budget_not_retries(pool_env: dict[str, str], docker_host: str,
                                                     spawn: Spawn, dclient: docker.DockerClient) -> None:
    pool = Pool.from_env(env={**pool_env, "JOBPOOL_RECOVERY_BUDGET": "1"})
    sup = Supervisor(pool.store)
    try:
        pool.set_slots(1)
        a = pool.enqueue(IMAGE, ["sh", "-c", CRASH_THEN_FAIL], retries=1, retry_delay=1)
        w = spawn()
        eventually(lambda: started(dclient, a.id), timeout=30, message="the job started")
        w.kill_with_children()
        for c in containers(dclient, a.id):  # its host lost it with its worker
            c.remove(force=True)
        eventually(lambda: not pool.store.client.exists(pool.keys.lease(a.id)), timeout=10,
                   message="the lease lapsing")

        sup.sweep()

        job = pool.get(a.id)
        assert (job.recovery_attempts, job.retries_used) == (1, 0)
        crash = [e for e in history(pool, a.id) if (e["from"], e["to"]) == ("running", "queued")]
        assert [e["reason"] for e in crash] == ["orphan_reconciled_no_container"]
        assert retry_evidence(pool, a.id) == []
        assert job.state is JobState.RUNNING and job.attempt == 2  # queued at its place, promoted again

        # Its own failures from then on are retried, from its retries.
        supervisor(spawn)
        spawn()
        done = pool.wait(a.id, timeout=90)
        assert (done.state, done.error_reason, done.attempt) == (JobState.FAILED, "exit_code_3", 3)
        assert (done.recovery_attempts, done.retries_used) == (1, 1)
        [evidence] = retry_evidence(pool, a.id)
        assert evidence.startswith("retry 1 of 1 in 1 s after exit_code_3"), evidence
    finally:
        sup.close()
        pool.close()
