"""The slot limit holds under real concurrency: 8 processes enqueue, take deliveries, claim and finish at
once against one pool with 3 slots, on a real redis-server, while one of them also pauses the queue and
moves the limit between 1 and 3.

Each process acts as a worker would, without Docker: it pops a delivery off RQ's list, claims the attempt
named in the RQ job's meta, heartbeats and finishes (success, failure, or a shutdown hand-back on a first
attempt), and sometimes cancels one of its own jobs. Afterwards the `events` stream is replayed: counting +1
on every transition into `running` and -1 on every transition out of it, the count never exceeds 3, and
every job ends terminal.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import random
import time
import traceback
from collections import Counter
from typing import Any, cast

from jobpool import Conflict, InvalidState, NotOwner, Pool
from jobpool.workers.attempt import Attempt
from tests.support.polling import eventually

POOL = "conc"
SLOTS = 3
PROCS = 8
JOBS_PER_PROC = 30
DEADLINE_SECS = 120
#: The one daemon every process's deliveries "run" on.
DAEMON = "daemon"


def _take_deliveries(pool: Pool, boot: str, rng: random.Random, stats: Counter[str]) -> bool:
    """Pop one delivery and run it as a worker on daemon DAEMON would, its daemon's own queue first (where a
    job handed back there waits: its checkpoint affinity), then the pool's; False when both were empty."""
    job_id = cast("str | None", pool.store.client.lpop(pool.keys.daemon_queue(DAEMON))
                  or pool.store.client.lpop(pool.keys.rq_queue))
    if job_id is None:
        return False
    meta = cast(str, pool.store.client.hget(pool.keys.rq_job(job_id), "meta"))
    attempt = json.loads(meta)["jobpool_attempt"]
    me = Attempt(pool.store, job_id, boot, attempt)
    try:
        me.claim()
    except (Conflict, NotOwner, InvalidState):  # cancelled or superseded before we got to it
        stats["claim_refused"] += 1
        return True
    stats["claimed"] += 1
    me.heartbeat()
    me.set_container(f"c-{job_id[:8]}-{attempt}", DAEMON)
    if attempt == 1 and rng.random() < 0.2:
        state = me.finish("interrupted", 75)
    else:
        state = me.finish("exit", rng.choice([0, 0, 0, 1]))
    stats[f"finished_{state}"] += 1
    return True


def _operator_moves(pool: Pool, rng: random.Random, stats: Counter[str]) -> None:
    """Process 0 also plays the operator: queue pause/resume and the limit moved within 1..SLOTS."""
    roll = rng.random()
    if roll < 0.05:
        pool.pause(None, reason="ops")
        stats["queue_paused"] += 1
    elif roll < 0.15:
        pool.resume(None)
    elif roll < 0.2:
        pool.set_slots(rng.randint(1, SLOTS))
        stats["slots_set"] += 1


def run_process(url: str, index: int, start: Any, enqueuers_done: Any, results: Any) -> None:
    """One of the concurrent processes (spawned; must be importable)."""
    stats: Counter[str] = Counter()
    try:
        pool = Pool.from_url(url, POOL, max_concurrent_jobs=SLOTS, lease_secs=60, heartbeat_secs=5)
        rng = random.Random(index)
        boot, enqueued = f"boot-{index}", 0
        start.wait(60)
        deadline = time.monotonic() + DEADLINE_SECS
        while time.monotonic() < deadline:
            if enqueued < JOBS_PER_PROC and rng.random() < 0.5:
                job = pool.enqueue(image="busybox", command=["work", str(rng.randrange(40))],
                                   coalesce=rng.random() < 0.3)
                enqueued += 1
                stats["coalesced" if job.coalesced else "enqueued"] += 1
                if enqueued == JOBS_PER_PROC:
                    with enqueuers_done.get_lock():
                        enqueuers_done.value += 1
                if rng.random() < 0.05:
                    with contextlib.suppress(InvalidState):
                        pool.cancel(job.id, reason="changed my mind")
                        stats["cancel_called"] += 1
                continue
            if index == 0:
                _operator_moves(pool, rng, stats)
                if enqueued == JOBS_PER_PROC:  # from here on, leave promotion on at the full limit
                    pool.resume(None)
                    pool.set_slots(SLOTS)
            if _take_deliveries(pool, boot, rng, stats):
                continue
            if enqueuers_done.value == PROCS and pool.store.client.zcard(pool.keys.queued) == 0 \
                    and pool.store.client.zcard(pool.keys.running) == 0:
                break
            time.sleep(0.002)  # the list is empty: poll again (an RQ worker would block in BLMOVE)
        else:
            raise TimeoutError(f"process {index} still busy after {DEADLINE_SECS}s: {dict(stats)}")
        pool.store.client.close()
        results.put((index, "ok", dict(stats)))
    except BaseException:
        results.put((index, "error", traceback.format_exc()))
        raise


def replay(events: list[dict[str, str]]) -> tuple[int, int]:
    """(highest, final) number of running jobs, from transitions alone."""
    running = highest = 0
    for ev in events:
        if ev["job"] == "":
            continue  # queue events
        if ev["to"] == "running" and ev["from"] != "running":
            running += 1
        elif ev["from"] == "running" and ev["to"] != "running":
            running -= 1
        assert running >= 0, f"left running more often than entered, at {ev}"
        highest = max(highest, running)
    return highest, running


def test_eight_processes_never_exceed_three_slots(redis_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, done, results = ctx.Barrier(PROCS + 1), ctx.Value("i", 0), ctx.Queue()
    procs = [ctx.Process(target=run_process, args=(redis_url, i, start, done, results), daemon=True)
             for i in range(PROCS)]
    for p in procs:
        p.start()
    try:
        start.wait(120)  # every process is connected and ready: release them at once
        reports = [results.get(timeout=DEADLINE_SECS + 60) for _ in procs]
        for p in procs:
            p.join(30)
    finally:
        for p in procs:  # only on failure: a process still alive is one we started
            if p.is_alive():
                p.terminate()
                p.join(10)
        results.close()
        results.join_thread()
    errors = [r for r in reports if r[1] == "error"]
    assert not errors, "\n".join(str(e[2]) for e in errors)
    assert [p.exitcode for p in procs] == [0] * PROCS
    totals: Counter[str] = Counter()
    for _, _, stats in reports:
        totals.update(stats)
    assert totals["claimed"] > SLOTS * 10, totals
    assert totals["finished_queued"] > 0 and totals["coalesced"] > 0, totals

    pool = Pool.from_url(redis_url, POOL)
    stats = eventually(lambda: (s := pool.stats()) and s["counts"]["running"] == 0 and s, timeout=10,
                       message="no job left running")
    counts = stats["counts"]
    assert counts["queued"] == counts["paused"] == counts["running"] == 0
    jobs = pool.list(limit=100_000)
    assert len(jobs) == totals["enqueued"] and all(j.state.terminal for j in jobs)
    assert sum(counts.values()) == totals["enqueued"]

    events = pool.events(count=1_000_000)
    assert sum(e["reason"] == "enqueued" for e in events) == totals["enqueued"], "the stream was trimmed"
    highest, final = replay(events)
    assert highest <= SLOTS, f"{highest} jobs were running at once with {SLOTS} slots"
    assert highest == SLOTS, "the test never filled the slots: it proves little"
    assert final == 0
    # Each attempt was claimed at most once, and a job's attempt counts its promotions.
    claims = Counter(e["evidence"].split(" ", 1)[1] + e["job"] for e in events if e["reason"] == "claimed")
    assert max(claims.values()) == 1
    promotions = Counter(e["job"] for e in events if e["reason"] == "promoted")
    assert all(promotions[j.id] == j.attempt for j in jobs)
    assert sum(totals[k] for k in totals if k.startswith("finished_")) == totals["claimed"]


def test_replay_counts_only_transitions_into_and_out_of_running() -> None:
    ev = [
        {"job": "a", "from": "", "to": "queued"}, {"job": "a", "from": "queued", "to": "running"},
        {"job": "a", "from": "running", "to": "running"},  # claimed, adopted, redispatched: no change
        {"job": "b", "from": "queued", "to": "running"}, {"job": "", "from": "", "to": ""},
        {"job": "a", "from": "running", "to": "queued"}, {"job": "a", "from": "queued", "to": "running"},
        {"job": "b", "from": "running", "to": "succeeded"}, {"job": "a", "from": "running", "to": "failed"},
    ]
    assert replay(ev) == (2, 0)
