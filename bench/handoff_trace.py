"""Where a slot handoff's milliseconds go inside jobpool: 1 slot, 2 workers whose every step is timestamped
(bench/_traced_worker.py), N jobs of `sleep 0.2`. For each `finish` (the slot released), the median delay to
the first of each later step: the next worker's dequeue, fork, horse start, RQ's preparation in the horse,
claim, create, set_container (the fence), start; and the removal of the finished container. Also the steps
of the finishing horse from its wait's return to its finish.

The wrapping costs a file append per step (tens of microseconds), so the total reads a little high; compare
two checkouts in the same minute (run the copy of this file inside each).

    python3 -m bench.handoff_trace [--jobs 25]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

from bench._common import IMAGE, bed, loadavg

AFTER = ["dequeue<", "prep_exec<", "fork>", "horse>", "prep_job<", "run_job>", "claim>", "claim<", "create>",
         "create<", "set_container<", "start>", "start<", "remove>", "remove<"]
BEFORE = ["wait<", "inspect<", "logs>", "logs<", "candidates>", "candidates<", "finish>"]


def analyse(trace_dir: Path) -> None:
    events = sorted((float(t), what, f.stem) for f in trace_dir.glob("*.log")
                    for t, what in (line.split() for line in f.read_text().splitlines()))
    after: dict[str, list[float]] = collections.defaultdict(list)
    before: dict[str, list[float]] = collections.defaultdict(list)
    for i, (t, what, pid) in enumerate(events):
        if what != "finish<":
            continue
        seen: set[str] = set()
        for t2, what2, _ in events[i + 1:]:
            if t2 - t > 1.0:
                break
            if what2 in AFTER and what2 not in seen:
                seen.add(what2)
                after[what2].append(1000 * (t2 - t))
        for t2, what2, pid2 in reversed(events[:i]):
            if pid2 == pid and what2 in BEFORE:
                before[what2].append(1000 * (t - t2))
                if what2 == "wait<":
                    break
    print("finishing horse, before its finish was recorded (median ms before):")
    print("  " + ", ".join(f"{k} -{statistics.median(v):.1f}" for k in BEFORE if (v := before[k])))
    print("after the finish (median ms after; the next job's steps, and the old container's removal):")
    for k in AFTER:
        if after[k]:
            print(f"  {k:16} +{statistics.median(after[k]):6.1f} ms  (n={len(after[k])})")


def main() -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--jobs", type=int, default=25)
    args = ap.parse_args()
    with bed("bench-trace") as b:
        trace_dir = b.work_dir / "trace"
        trace_dir.mkdir()
        pool = b.pool(slots=1)
        b.start_workers(2, pool, module="bench._traced_worker", JP_TRACE_DIR=str(trace_dir))
        for j in [pool.enqueue(IMAGE, ["true"]) for _ in range(4)]:  # warm-up
            pool.wait(j.id, timeout=60)
        time.sleep(0.5)
        for f in trace_dir.glob("*.log"):
            f.unlink()
        load = loadavg()
        for j in [pool.enqueue(IMAGE, ["sh", "-c", "sleep 0.2"]) for _ in range(args.jobs)]:
            pool.wait(j.id, timeout=120)
        time.sleep(0.5)
        print(f"== handoff trace ({args.jobs} jobs, 1 slot, 2 workers; load avg at start {load}) ==")
        analyse(trace_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
