"""Slot handoff: time from one job's container exit to the next job's container start, 1 slot, 2 workers.

Both ends are the Docker daemon's own event timestamps (`die`, then the next job's `start`, `timeNano`), so
no client-side clock or polling is in the measure. The goal is stated against a bare SDK loop's own handoff
(wait for the container, run the next, remove the old one), measured the same way in the same run: jobpool's
handoff is a queue hop (container exit -> watcher -> `finish` script -> RQ -> the next worker's claim ->
launch) against a loop with no hop, and the difference of the medians is what that hop costs. For reference,
a bare SDK `containers.run(...)` is timed from its request to its `start` event too.

The three are interleaved in rounds (bare runs, a burst of queued jobs, a bare loop), so a change in the
machine's load during the run weighs on all of them alike.

    python3 -m bench.handoff [--jobs 30] [--bare 20] [--rounds 5] [--keep-logs]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bench._common import IMAGE, EventRecorder, bed, loadavg, median, ms, pct
from jobpool.contract import LABEL_JOB, LABEL_POOL

#: jobpool's handoff minus a bare SDK loop's own handoff (medians): goal, and stretch goal.
GOAL_MS = 30.0
STRETCH_MS = 15.0
JOB_CMD = ["sh", "-c", "sleep 0.2"]
POOL = "bench-handoff"
STAGES = ("die->finish", "finish->claim", "finish->rq_start", "rq_start->claim", "claim->create",
          "create->start")


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (k < total % parts) for k in range(parts)]


def bare_runs(client: Any, n: int) -> list[tuple[str, int]]:
    """`n` bare create+start requests; (container id, request wall-clock ns) each. Removed afterwards."""
    out = []
    for _ in range(n):
        t_req = time.time_ns()
        c = client.containers.run(IMAGE, ["true"], detach=True, network_mode="none",
                                  labels={"jobpool-bench": "bare"})
        out.append((c.id, t_req))
        c.wait(timeout=30)
        c.remove(force=True)
    return out


def bare_loop_handoffs(client: Any, n: int) -> list[tuple[str, str]]:
    """A bare client doing what one slot does: wait for a container, start the next at once, then remove
    the old one. Returns (exited id, next id) pairs; the daemon's events give die -> next start."""
    pairs = []
    prev = client.containers.run(IMAGE, JOB_CMD, detach=True, network_mode="none",
                                 labels={"jobpool-bench": "loop"})
    for _ in range(n):
        prev.wait(timeout=30)
        nxt = client.containers.run(IMAGE, JOB_CMD, detach=True, network_mode="none",
                                    labels={"jobpool-bench": "loop"})
        prev.remove(force=True)
        pairs.append((prev.id, nxt.id))
        prev = nxt
    prev.wait(timeout=30)
    prev.remove(force=True)
    return pairs


def iso_ns(s: str) -> int | None:
    """RQ's ISO-8601 UTC timestamps (microseconds) as epoch ns."""
    if not s:
        return None
    dt = datetime.fromisoformat(s.rstrip("Z") + "+00:00")
    return int(dt.timestamp() * 1_000_000) * 1000


@dataclass
class Run:
    bare_reqs: list[tuple[str, int]] = field(default_factory=list)
    loop_pairs: list[tuple[str, str]] = field(default_factory=list)
    bursts: list[list[Any]] = field(default_factory=list)  # per round, the jobs' final rows in queue order
    rq_started: dict[str, int | None] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    jobpool_wall: float = 0.0
    load: tuple[str, str] = ("?", "?")


def measure(b: Any, jobs: int, bare: int, rounds: int) -> Run:
    run = Run()
    client = b.client()
    load_before = loadavg()
    recorder = EventRecorder(client)
    bare_runs(client, 3)  # warm-up: the first containers on a fresh daemon are slower
    pool = b.pool(slots=1)
    b.start_workers(2, pool)
    # Warm-up: each worker imports the job path on its first job; not what a handoff costs.
    for j in [pool.enqueue(IMAGE, ["true"]) for _ in range(3)]:
        pool.wait(j.id, timeout=60)

    for n_bare, n_handoffs in zip(split(bare, rounds), split(jobs, rounds), strict=True):
        run.bare_reqs += bare_runs(client, n_bare)
        # Slot full and jobs queued: n_handoffs + 1 jobs enqueued at once through 1 slot.
        t0 = time.monotonic()
        queued = [pool.enqueue(IMAGE, JOB_CMD) for _ in range(n_handoffs + 1)]
        done = [pool.wait(j.id, timeout=120) for j in queued]
        run.jobpool_wall += time.monotonic() - t0
        bad = [j for j in done if j.state.value != "succeeded"]
        if bad:
            raise RuntimeError(f"{len(bad)} job(s) did not succeed: {bad[0]}")
        run.bursts.append(done)
        run.loop_pairs += bare_loop_handoffs(client, n_bare)
    run.events = recorder.stop()
    run.load = (load_before, loadavg())
    for j in (j for burst in run.bursts for j in burst):
        run.rq_started[j.id] = iso_ns(pool.store.client.hget(f"rq:job:{j.id}", "started_at") or "")
    client.close()
    return run


def analyse(run: Run) -> dict[str, Any]:
    # Each container's first event of each kind, and its labels.
    times: dict[str, dict[str, int]] = {}
    labels: dict[str, dict[str, str]] = {}
    for e in run.events:
        cid = e["Actor"]["ID"]
        times.setdefault(cid, {}).setdefault(e["Action"], int(e["timeNano"]))
        labels.setdefault(cid, e["Actor"].get("Attributes", {}))
    by_job = {labels[c][LABEL_JOB]: t for c, t in times.items() if labels[c].get(LABEL_POOL) == POOL}

    handoff: list[float] = []
    stages: dict[str, list[float]] = {k: [] for k in STAGES}
    for prev, nxt in (pair for burst in run.bursts for pair in itertools.pairwise(burst)):
        p, n = by_job.get(prev.id, {}), by_job.get(nxt.id, {})
        if "die" not in p or "start" not in n or "create" not in n:
            raise RuntimeError(f"missing daemon events for {prev.id}/{nxt.id}: {sorted(p)} {sorted(n)}")
        handoff.append(ms(n["start"] - p["die"]))
        # finished_at / claimed_at are Redis TIME (whole ms); RQ's started_at is the horse's clock (us).
        fin, claim = prev.finished_at * 1_000_000, nxt.claimed_at * 1_000_000
        rq_start = run.rq_started[nxt.id]
        stages["die->finish"].append(ms(fin - p["die"]))
        stages["finish->claim"].append(ms(claim - fin))  # the RQ hop, both ends Redis TIME
        if rq_start is not None:
            stages["finish->rq_start"].append(ms(rq_start - fin))
            stages["rq_start->claim"].append(ms(claim - rq_start))
        stages["claim->create"].append(ms(n["create"] - claim))
        stages["create->start"].append(ms(n["start"] - n["create"]))

    bare, bare_req_create, bare_create_start = [], [], []
    for cid, t_req in run.bare_reqs:
        ev = times.get(cid, {})
        if "start" not in ev or "create" not in ev:
            raise RuntimeError(f"missing daemon events for bare container {cid[:12]}")
        bare.append(ms(ev["start"] - t_req))
        bare_req_create.append(ms(ev["create"] - t_req))
        bare_create_start.append(ms(ev["start"] - ev["create"]))
    loop = [ms(times[n]["start"] - times[p]["die"]) for p, n in run.loop_pairs
            if "die" in times.get(p, {}) and "start" in times.get(n, {})]
    return {"handoff": handoff, "stages": stages, "bare": bare, "bare_req_create": bare_req_create,
            "bare_create_start": bare_create_start, "loop": loop}


def report(run: Run, r: dict[str, Any], rounds: int) -> None:
    handoff, bare, loop = r["handoff"], r["bare"], r["loop"]
    overhead = median(handoff) - median(bare)
    print()
    print("== slot handoff (1 slot, 2 workers, docker executor) ==")
    print(f"{len(handoff)} handoffs of {' '.join(JOB_CMD)!r} jobs on {IMAGE} in {rounds} rounds "
          f"(jobpool wall {run.jobpool_wall:.1f} s); load avg at start {run.load[0]}, at end {run.load[1]}")
    print(f"handoff  die -> next start   median {median(handoff):7.1f} ms   p90 {pct(handoff, 90):7.1f} ms"
          f"   min {min(handoff):6.1f}   max {max(handoff):6.1f}")
    print(f"bare     request -> start    median {median(bare):7.1f} ms   p90 {pct(bare, 90):7.1f} ms"
          f"   (n={len(bare)}: request->create {median(r['bare_req_create']):.1f}, "
          f"create->start {median(r['bare_create_start']):.1f})")
    print(f"reference: over a bare request -> start, median(handoff) - median(bare) = {overhead:.1f} ms")
    if loop:
        hop = median(handoff) - median(loop)
        verdict = "MET" if hop <= GOAL_MS else "MISSED"
        stretch = "met" if hop <= STRETCH_MS else "missed"
        print(f"bare SDK loop's own handoff (wait, run next, remove old), die -> next start: "
              f"median {median(loop):.1f} ms, p90 {pct(loop, 90):.1f} ms (n={len(loop)})")
        print(f"handoff overhead = median(handoff) - median(bare loop handoff) = {hop:.1f} ms   "
              f"goal <= {GOAL_MS:.0f} ms: {verdict}   (stretch <= {STRETCH_MS:.0f} ms: {stretch})")
    print("where a jobpool handoff goes (medians; Redis times are whole ms):")
    for name, vals in r["stages"].items():
        if vals:
            print(f"  {name:<18} {median(vals):7.1f} ms   p90 {pct(vals, 90):7.1f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--jobs", type=int, default=30, help="jobpool handoffs to measure (default 30)")
    ap.add_argument("--bare", type=int, default=20, help="bare SDK runs, and bare loop handoffs (default 20)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaving rounds (default 5)")
    ap.add_argument("--keep-logs", action="store_true", help="keep the worker logs and print where")
    args = ap.parse_args()
    if not 1 <= args.rounds <= min(args.jobs, args.bare):
        ap.error("--rounds must be from 1 to the smaller of --jobs and --bare")
    with bed(POOL, keep_logs=args.keep_logs) as b:
        run = measure(b, args.jobs, args.bare, args.rounds)
    report(run, analyse(run), args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
