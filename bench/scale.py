"""Benchmark: one Redis under a large fleet (10,000 running jobs on 1,000 workers over 100 hosts), against a
real redis-server, at the default periods (jobpool/config.py). No containers run: the fleet's workers and
inventory publishers are simulated (bench/scale_sim.py: each makes the Redis calls a real one makes, through
jobpool's own store and scripts; `calibrate` compares one with a real worker), and the supervisor's own daemon
is a private dockerd with nothing on it. Redis's time is read from Redis (INFO cpu, INFO commandstats, SLOWLOG
at threshold 0: bench/scale_redis.py), never from the client's clock. The parts, each printing its goal:

1. sweep: a steady sweep over 10,000 and 100,000 running rows on 100 daemons' inventories: wall time, per
   row, its phases, daemon calls (goals: <= 150 ms and <= 1.5 s, linear, one call per daemon it sees);
2. job: Redis's time for one job's whole life (a 60 s job at the default heartbeat period), real jobpool
   workers against RQ's own workers, side by side (goal: at most 2x RQ's) (bench/scale_job.py);
3. idle: 1,000 idle workers and their 100 inventory publishers: Redis CPU, % of one core (goal <= 5 %);
4. observe: `status --json` and a `/metrics` scrape with 10,000 running jobs and 1,000 workers: Redis
   commands per call, at 1,000 and 10,000 running jobs, and the median time (goals: commands flat, <= 20 ms);
5. deep: enqueue and promotion with 1,000,000 jobs queued against an empty queue (goal within 1.2x), and
   Redis's memory per queued job (goal <= 1 KB);
6. handoff: bench/handoff.py and bench/throughput.py as they are (stretch: +15 ms over the bare SDK loop,
   worker CPU per job at most 2x the bare loop's client);
calibrate: one real idle worker and one simulated, alone, their calls a minute side by side.

Every goal missed is profiled where it is measured: Redis's time by command and by script (with each
script's own Lua work apart from the commands it ran), and a cProfile of the sweep.

    python3 -m bench.scale [--quick] [--parts sweep,observe,job,idle,deep,handoff,calibrate]
    python3 -m bench.scale --parts idle --workers 1000 --idle-secs 60
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import scale_fleet, scale_job
from .sweep import valid_daemon

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("calibrate", "sweep", "observe", "job", "idle", "deep", "handoff")


def _term_to_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def run_bench(argv: list[str]) -> str:
    """Another benchmark as it is, its output shown as it comes; the output."""
    print(f"  $ python3 -m bench.{' '.join(argv)}", flush=True)
    proc = subprocess.Popen([sys.executable, "-m", f"bench.{argv[0]}", *argv[1:]], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)
        print("    " + line, end="", flush=True)
    proc.wait()
    return "".join(out)


def part_handoff(quick: bool) -> dict[str, Any]:
    """Part 6: bench/handoff.py (the hop against the bare loop's) and bench/throughput.py (CPU per job)."""
    out: dict[str, Any] = {}
    text = run_bench(["handoff", "--jobs", "6", "--bare", "6", "--rounds", "2"] if quick
                     else ["handoff", "--jobs", "15"])
    m = re.search(r"handoff overhead = .*? = (-?[\d.]+) ms", text)
    out["overhead_ms"] = float(m.group(1)) if m else None
    text = run_bench(["throughput", "--jobs", "20", "--blocks", "2"] if quick
                     else ["throughput", "--jobs", "60", "--blocks", "3"])
    cpu = dict(re.findall(r"(bare client|jobpool workers) ([\d.]+)", text))
    if cpu:
        out["bare_client_cpu_ms"] = float(cpu.get("bare client", "nan"))
        out["workers_cpu_ms"] = float(cpu.get("jobpool workers", "nan"))
    return out


def summary(res: dict[str, Any]) -> None:
    """The goals, one line each."""
    print("\n== summary (goal: figure: met?)")

    def line(goal: str, figure: str, met: bool | None) -> None:
        print(f"  {goal:<58} {figure:<44} {'-' if met is None else 'met' if met else 'NOT met'}")

    for n, s in sorted(res.get("fleet", {}).get("sweep", {}).items()):
        goal = scale_fleet.SWEEP_GOAL_MS.get(n)
        line(f"1. sweep, {n:,} rows" + (f" <= {goal:g} ms" if goal else ""),
             f"{s['ms']:.0f} ms, {s['us_per_row']:.1f} us/row, {s['calls']:g} daemon call(s)",
             s["ms"] <= goal if goal else None)
        line(f"1. sweep, {n:,} rows: one call per daemon it sees", f"{s['calls']:g} call(s) a sweep",
             s["calls"] <= 1)
    sweeps = res.get("fleet", {}).get("sweep", {})
    if len(sweeps) >= 2:
        lo, hi = min(sweeps), max(sweeps)
        growth = sweeps[hi]["us_per_row"] / sweeps[lo]["us_per_row"]
        line(f"1. sweep linear ({lo:,} -> {hi:,} rows)", f"per row {growth:.2f}x", growth <= 1.3)
    if "job" in res:
        j = res["job"]
        line("2. Redis per job <= 2x RQ's",
             f"{j['jobpool_us']:.0f} us vs {j['rq_us']:.0f} us = {j['ratio']:.1f}x", j["ratio"] <= 2)
    if "idle" in res:
        i = res["idle"]
        line(f"3. idle fleet Redis CPU <= {scale_fleet.IDLE_GOAL_PCT:g} % of a core",
             f"{i['cpu_pct']:.1f} % (at the full call rate {i['cpu_pct_at_full_rate']:.1f} %)",
             i["cpu_pct_at_full_rate"] <= scale_fleet.IDLE_GOAL_PCT)
    obs = res.get("fleet", {}).get("observe", {})
    if obs:
        lo, hi = min(obs), max(obs)
        for name in ("status", "scrape"):
            a, b = obs[lo][name], obs[hi][name]
            line(f"4. {name}: commands flat ({lo:,} -> {hi:,} running)",
                 f"{a['commands']} -> {b['commands']}", b["commands"] <= a["commands"] * 1.05 + 2)
            line(f"4. {name}: median <= {scale_fleet.OBSERVE_GOAL_MS:g} ms at {hi:,} running",
                 f"{b['ms']:.1f} ms", b["ms"] <= scale_fleet.OBSERVE_GOAL_MS)
    if "deep" in res:
        d = res["deep"]
        line("5. enqueue, deep queue / empty <= 1.2x", f"{d['enqueue_ratio']:.2f}x",
             d["enqueue_ratio"] <= 1.2)
        line("5. promotion, deep queue / empty <= 1.2x", f"{d['promote_ratio']:.2f}x",
             d["promote_ratio"] <= 1.2)
        line("5. memory per queued job <= 1 KB", f"{d['bytes_per_job']:,.0f} B", d["bytes_per_job"] <= 1024)
    if "handoff" in res:
        h = res["handoff"]
        if h.get("overhead_ms") is not None:
            line("6. handoff over the bare loop <= 15 ms (stretch)", f"{h['overhead_ms']:+.1f} ms",
                 h["overhead_ms"] <= 15)
        if h.get("workers_cpu_ms"):
            ratio = h["workers_cpu_ms"] / h["bare_client_cpu_ms"]
            line("6. worker CPU per job <= 2x the bare client's (stretch)",
                 f"{h['workers_cpu_ms']:.0f} vs {h['bare_client_cpu_ms']:.0f} ms = {ratio:.1f}x", ratio <= 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes and shorter windows (about 3 min)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--rows", help="sweep sizes, comma-separated (default 10000,100000; quick 10000)")
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--daemons", type=int, default=100)
    ap.add_argument("--procs", type=int, default=4, help="processes simulating the idle fleet")
    ap.add_argument("--appendonly", action="store_true",
                    help="the idle fleet's Redis keeps its append-only file, as `jobpool up` runs it")
    ap.add_argument("--idle-secs", type=float, help="idle fleet's measured window (default 60; quick 10)")
    ap.add_argument("--job-secs", type=float, help="the job's length in part 2 (default 60; quick 10)")
    ap.add_argument("--jobs", type=int, default=3, help="jobs (and workers) each side in part 2")
    ap.add_argument("--warm", type=float, default=0,
                    help="part 2: trivial calls a second keeping each server busy, as a fleet's traffic "
                         "would (not counted; default 0: the servers idle between the jobs' calls)")
    ap.add_argument("--queued", type=int, help="part 5's deep queue (default 1000000; quick 100000)")
    ap.add_argument("--repeat", type=int, default=5, help="steady sweeps per round (3 rounds)")
    ap.add_argument("--no-profile", action="store_true", help="no cProfile of the sweep")
    args = ap.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown part(s): {', '.join(unknown)}")
    q = args.quick
    rows = [int(r) for r in (args.rows or ("10000" if q else "10000,100000")).split(",")]
    idle_secs = args.idle_secs or (10.0 if q else 60.0)
    job_secs = args.job_secs or (10.0 if q else 60.0)
    queued = args.queued or (100_000 if q else 1_000_000)
    signal.signal(signal.SIGTERM, _term_to_exit)
    logging.basicConfig(level=logging.ERROR)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"bench.scale: parts {', '.join(parts)}; load average {load} on {os.cpu_count()} CPUs", flush=True)
    res: dict[str, Any] = {}
    work = Path(tempfile.mkdtemp(prefix="jp-scale-"))
    started = time.monotonic()
    try:
        if "calibrate" in parts:
            print("\n== calibrate: a simulated idle worker against a real one", flush=True)
            with valid_daemon() as dd:
                dd.start()
                res["calibrate"] = scale_fleet.calibrate(dd, 10.0 if q else 30.0, work)
        if {"sweep", "observe"} & set(parts):
            print("\n== parts 1 and 4: the sweep, `status --json` and `/metrics` over a seeded fleet",
                  flush=True)
            res["fleet"] = scale_fleet.part_fleet(
                rows if "sweep" in parts else [], [1000, 10_000] if "observe" in parts else [],
                args.workers, args.daemons, 2 if q else 3, args.repeat, 10 if q else 30, not args.no_profile)
        if "job" in parts:
            res["job"] = scale_job.part_job(args.jobs, job_secs, args.warm)
        if "idle" in parts:
            print(f"\n== part 3: an idle fleet: {args.workers} workers on {args.daemons} daemons", flush=True)
            res["idle"] = scale_fleet.part_idle(args.workers, args.daemons, args.procs, 6.0 if q else 10.0,
                                                idle_secs, args.appendonly)
        if "deep" in parts:
            res["deep"] = scale_job.part_deep(queued, 4 if q else 6, 1000 if q else 2000)
        if "handoff" in parts:
            print("\n== part 6: the slot handoff (stretch), the existing benchmarks as they are", flush=True)
            res["handoff"] = part_handoff(q)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary(res)
    print(f"\nbench.scale took {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
