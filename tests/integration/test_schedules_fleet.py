"""Schedules fired by real supervisor processes (jobpool/schedules.py, jobpool/supervisor/timers.py).

A fleet of supervisors, one of them SIGKILLed at random moments and started again, fires a one-second
schedule for a minute: every tick makes one job at most (the enqueue script's guard), and no two ticks in a
row are missed (some supervisor is always there to fire). The pool has no slot, so nothing runs and the fires
are all that is tested; a second test runs the fired jobs with a worker.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterator

import pytest

from jobpool import Pool
from jobpool.models import Job, JobState
from tests.support.constants import SUB
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess

#: How long the fleet fires the schedule, and how long a killed supervisor stays down (at most).
RUN_SECS = 30
DOWN_SECS = (0.5, 3.0)
#: Between two kills (seconds).
BETWEEN_KILLS = (2.0, 6.0)
NAME = "every-second"


@pytest.fixture
def quiet_pool(pool_env: dict[str, str]) -> Iterator[Pool]:
    """The test's pool with no slot: fired jobs stay queued."""
    p = Pool.from_env(env={**pool_env, **SUB})
    p.set_slots(0)
    yield p
    p.close()


def supervisor(spawn: Callable[..., JobpoolProcess]) -> JobpoolProcess:
    return spawn("jobpool.cli", ("supervisor",), **SUB)


def started(sup: JobpoolProcess) -> bool:
    """Whether its loop runs: its timers start before the line it logs."""
    return "sweeping every" in sup.log()


def fired(pool: Pool) -> list[Job]:
    return sorted((j for j in pool.list(limit=100_000) if j.schedule == NAME), key=lambda j: j.tick or 0)


@pytest.mark.parametrize("n", [2, 3])
def test_a_fleet_fires_each_tick_once_while_supervisors_are_killed(
        quiet_pool: Pool, spawn: Callable[..., JobpoolProcess], n: int) -> None:
    pool = quiet_pool
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    sups = [supervisor(spawn) for _ in range(n)]
    for sup in sups:
        eventually(lambda sup=sup: started(sup), timeout=30, message=f"supervisor {sup.pid} started")
    added = pool.add_schedule(NAME, every=1, overlap="queue", image="busybox", command=["true"])
    eventually(lambda: fired(pool), timeout=10, message="the first tick fired")
    deadline, kills = time.monotonic() + RUN_SECS, 0
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(*BETWEEN_KILLS))  # paces the faults; nothing is waited for here
        victim = rng.randrange(n)
        sups[victim].kill_with_children()
        kills += 1
        time.sleep(rng.uniform(*DOWN_SECS))
        sups[victim] = supervisor(spawn)  # started again (the fixture stops it after the test)
    last = pool.now_ms() // 1000 * 1000
    # Every tick up to `last` is handled once the watermark reaches it; then nothing more fires.
    eventually(lambda: (fired(pool)[-1].tick or 0) >= last, timeout=10, message=f"tick {last} fired")
    pool.pause_schedule(NAME)
    jobs = fired(pool)
    ticks = [j.tick or 0 for j in jobs]
    context = f"seed {seed}, {n} supervisors, {kills} kills"
    assert len(ticks) == len(set(ticks)), f"a tick fired twice ({context})"
    assert added.next_fire is not None and ticks[0] >= added.next_fire
    missed = sorted(set(range(added.next_fire, ticks[-1] + 1, 1000)) - set(ticks))
    assert [t for t in missed if t + 1000 in missed] == [], f"two ticks in a row missed: {missed} ({context})"
    assert len(ticks) >= RUN_SECS, context
    assert all(j.state is JobState.QUEUED for j in jobs)
    # Fired by the fleet, not one process: the supervisors killed and started again fired ticks too.
    actors = {pool.events(j.id)[0]["actor"] for j in jobs}
    assert len(actors) >= 2, actors
    assert all(a.startswith("supervisor:") for a in actors)
    [s] = pool.schedules()
    assert s.paused and s.last_job == jobs[-1].id and s.last_fire == ticks[-1]


def test_fired_jobs_run_and_the_next_waits_for_the_last(
        sub_pool: Pool, spawn: Callable[..., JobpoolProcess]) -> None:
    pool = sub_pool
    pool.set_slots(1)
    supervisor(spawn)
    spawn(**SUB)  # a worker running jobs as local processes
    pool.add_schedule(NAME, every=1, image="ignored", command=["sh", "-c", "sleep 1.5"])  # overlap 'skip'

    def done() -> list[Job]:
        return [j for j in fired(pool) if j.state is JobState.SUCCEEDED]
    eventually(lambda: len(done()) >= 2, timeout=60, message="two fired jobs succeeded")
    pool.remove_schedule(NAME)
    jobs = fired(pool)
    ticks = [j.tick or 0 for j in jobs]
    assert len(ticks) == len(set(ticks))
    # Overlap 'skip': a job runs longer than a tick, so the ticks while it waited or ran made none.
    assert all(b - a >= 2000 for a, b in itertools.pairwise(ticks))
    assert any(e["reason"] == "schedule_skipped" for e in pool.events())
