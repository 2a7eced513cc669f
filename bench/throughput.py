"""Throughput: N short `true` jobs through jobpool (2 slots, 2 workers, docker executor) vs a bare two-lane
loop doing the same container work with the SDK (create, start, wait, remove), in one run.

jobpool's wall runs from the first enqueue until every job is `succeeded`; the bare loop's from its first
create until both lanes are done. Goal: bare wall / jobpool wall >= 0.90. Each side is warmed up first.
jobpool's jobs say they keep no checkpoint (`checkpoint=False`: `true` never checkpoints), so their containers
get no volume, as the bare loop's get none; `--checkpoint` runs them with the default volume instead. They
keep jobpool's default init process (the bare loop's containers have none).
CPU per job (workers with their work horses, the bare client, dockerd, redis-server) is printed too: on a
2-core machine shared with dockerd, CPU spent per job is wall time taken from container starts.

    python3 -m bench.throughput [--jobs 200] [--blocks 1] [--workers 2] [--checkpoint] [--keep-logs]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

import docker

from bench._common import IMAGE, Bed, bed, cpu_secs, loadavg
from jobpool import Pool

GOAL = 0.90
LANES = 2


def bare_loop(b: Bed, n: int) -> float:
    """Two lanes, each running containers one after another until `n` are done; the wall time."""
    clients = [b.client() for _ in range(LANES)]
    for c in clients:
        c.ping()  # connect and learn the API version before the clock starts
    next_index = iter(range(n))
    take = threading.Lock()
    errors: list[BaseException] = []

    def lane(client: docker.DockerClient) -> None:
        try:
            while True:
                with take:
                    i = next(next_index, None)
                if i is None:
                    return
                c = client.containers.create(IMAGE, ["true"], network_mode="none",
                                             labels={"jobpool-bench": "bare", "jobpool-bench.i": str(i)})
                c.start()
                code = c.wait(timeout=60)["StatusCode"]
                c.remove(force=True)
                if code != 0:
                    raise RuntimeError(f"bare container exited {code}")
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=lane, args=(c,), name=f"lane-{k}") for k, c in enumerate(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    for c in clients:
        c.close()
    if errors:
        raise errors[0]
    return wall


def start_jobpool(b: Bed, workers: int, spec: dict[str, Any]) -> Pool:
    pool = b.pool(slots=LANES)
    b.start_workers(workers, pool)
    # Warm-up: each worker's first job pays one-off imports; not what steady throughput costs.
    warm = [pool.enqueue(IMAGE, ["true"], **spec) for _ in range(2 * LANES)]
    for j in warm:
        pool.wait(j.id, timeout=60)
    return pool


def jobpool_run(pool: Pool, n: int, spec: dict[str, Any]) -> tuple[float, float]:
    """(wall from first enqueue to all succeeded, time spent enqueueing)."""
    base = pool.stats()["counts"]["succeeded"]
    t0 = time.monotonic()
    for _ in range(n):
        pool.enqueue(IMAGE, ["true"], **spec)
    t_enq = time.monotonic() - t0
    deadline = t0 + 600
    while True:
        counts = pool.stats()["counts"]
        if counts["succeeded"] - base >= n:
            break
        if counts["failed"] or counts["cancelled"]:
            bad = pool.list("failed", limit=1) or pool.list("cancelled", limit=1)
            raise RuntimeError(f"a job did not succeed: {bad[0] if bad else counts}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not all jobs succeeded in 600 s: {counts}")
        time.sleep(0.01)
    return time.monotonic() - t0, t_enq


def main() -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--jobs", type=int, default=200, help="jobs per side (default 200)")
    ap.add_argument("--blocks", type=int, default=1,
                    help="alternate bare and jobpool in this many blocks of jobs/blocks each and sum the "
                         "walls (evens out load drift on a shared machine; default 1: one run of each)")
    ap.add_argument("--workers", type=int, default=LANES,
                    help=f"jobpool workers (default {LANES}, as many as slots; more shows the cost of a "
                         "worker's post-finish cleanup)")
    ap.add_argument("--checkpoint", action="store_true",
                    help="run jobpool's jobs with the default checkpoint volume (by default they say they "
                         "keep none, as `true` needs none)")
    ap.add_argument("--keep-logs", action="store_true", help="keep the worker logs and print where")
    args = ap.parse_args()
    if args.jobs < 1 or not 1 <= args.blocks <= args.jobs or args.workers < 1:
        ap.error("--jobs and --workers must be at least 1, and --blocks from 1 to --jobs")
    spec = {} if args.checkpoint else {"checkpoint": False}
    sizes = [args.jobs // args.blocks + (k < args.jobs % args.blocks) for k in range(args.blocks)]

    with bed("bench-tput", keep_logs=args.keep_logs) as b:
        load_before = loadavg()
        bare_loop(b, 2 * LANES)  # warm-up: first containers on a fresh daemon are slower
        pool = None
        bare = jp = t_enq = 0.0
        cpu = {"bare client": 0.0, "jobpool workers": 0.0, "dockerd (bare)": 0.0, "dockerd (jobpool)": 0.0,
               "redis-server (jobpool)": 0.0}
        per_block: list[tuple[float, float]] = []  # (bare, jobpool) wall of each block
        for size in sizes:
            c0, d0 = cpu_secs(os.getpid(), children=False), cpu_secs(b.daemon.pid, children=False)
            bare_wall = bare_loop(b, size)
            bare += bare_wall
            cpu["bare client"] += cpu_secs(os.getpid(), children=False) - c0
            cpu["dockerd (bare)"] += cpu_secs(b.daemon.pid, children=False) - d0
            if pool is None:
                load_mid = loadavg()
                pool = start_jobpool(b, args.workers, spec)
            w0 = sum(cpu_secs(w.pid) for w in b.workers)
            d0, r0 = cpu_secs(b.daemon.pid, False), cpu_secs(b.redis.pid)
            wall, enq = jobpool_run(pool, size, spec)
            jp, t_enq = jp + wall, t_enq + enq
            per_block.append((bare_wall, wall))
            cpu["jobpool workers"] += sum(cpu_secs(w.pid) for w in b.workers) - w0
            cpu["dockerd (jobpool)"] += cpu_secs(b.daemon.pid, children=False) - d0
            cpu["redis-server (jobpool)"] += cpu_secs(b.redis.pid) - r0
        load_after = loadavg()

    ratio = bare / jp
    verdict = "MET" if ratio >= GOAL else "MISSED"
    print()
    blocks = f", alternating in {args.blocks} blocks" if args.blocks > 1 else ""
    print(f"== throughput ({args.jobs} x 'true' on {IMAGE}, {LANES} slots, {args.workers} workers, "
          f"docker executor{blocks}; jobpool's jobs {'with' if args.checkpoint else 'without'} a checkpoint "
          "volume) ==")
    print(f"bare two-lane SDK loop (create, start, wait, remove): {bare:7.2f} s   "
          f"{args.jobs / bare:6.2f} jobs/s   {1000 * LANES * bare / args.jobs:6.1f} ms/job/lane")
    print(f"jobpool, first enqueue -> all succeeded:               {jp:7.2f} s   "
          f"{args.jobs / jp:6.2f} jobs/s   {1000 * LANES * jp / args.jobs:6.1f} ms/job/slot"
          f"   (enqueueing took {t_enq:.2f} s)")
    print(f"bare wall / jobpool wall = {ratio:.3f}   goal >= {GOAL:.2f}: {verdict}")
    print("CPU per job (user+sys, ms; contended, indicative): "
          + ", ".join(f"{k} {1000 * v / args.jobs:.1f}" for k, v in cpu.items()))
    if len(per_block) > 1:  # a block far from the others is a stall of one side, not its steady cost
        print("per block, bare / jobpool wall: " + " ".join(f"{bw:.1f}/{jw:.1f}s" for bw, jw in per_block))
    print(f"load avg: start {load_before} | after first bare {load_mid} | end {load_after}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
