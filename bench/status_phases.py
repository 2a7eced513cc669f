"""Where a status read's time goes: `jobpool status --json` of a pool running `--running` jobs over
`--workers` live worker boots on `--daemons` daemons, whole and phase by phase, in this process.

Seeds the pool as bench/scrape.py does (its `live_workers`, `run_more` and `publish`: boot records written by
a worker's beat, jobs claimed through the scripts, every inventory fresh) on a private redis-server, then
times `read_status` + `to_dict` + `json.dumps` whole, and each of its phases alone (jobpool/status/read.py
`_read`: the store reads and the report's parts, in the order it runs them), median of `--repeat` each.
bench/scrape.py measures the same read against another tree's code in the same run; this says where the time
of one goes.

    python3 -m bench.status_phases [--running 10000] [--workers 1000] [--daemons N] [--repeat 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.scrape import live_workers, publish, run_more
from jobpool import Pool
from jobpool.config import Settings
from jobpool.status import read as st
from tests.support.servers import RedisServer


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--running", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--daemons", type=int, help="the workers' Docker daemons (default: a tenth of them)")
    ap.add_argument("--repeat", type=int, default=40)
    args = ap.parse_args()
    daemons = args.daemons or max(1, args.workers // 10)
    rs = RedisServer()
    try:
        rs.start()
        pool = Pool.from_settings(Settings(redis_url=rs.url, pool="phases"))
        boots = live_workers(pool, args.workers, daemons)
        pool.set_slots(0)
        run_more(pool, args.running, boots, daemons)
        publish(pool, daemons)
        store = pool.store
        whole = median_ms(lambda: json.dumps(st.read_status(store).to_dict()), args.repeat)
        now, _, head_boots, head, _, _, _ = store.status_head(st.MAX_BOOTS)
        ids = [b for b, _ in head_boots]
        records, _ = store.status_rows(ids, head)
        inventories = store.inventories()
        where = st._Placement.read(store, ids)
        report = st.read_status(store)
        doc = report.to_dict()
        phases: list[tuple[str, Callable[[], Any]]] = [
            ("state counts (stats)", store.stats),
            ("head: time, boots index, queue head", lambda: store.status_head(st.MAX_BOOTS)),
            ("boot records (status_rows)", lambda: store.status_rows(ids, head)),
            ("placement: jobs and daemon counts", lambda: st._Placement.read(store, ids)),
            ("inventories", store.inventories),
            ("daemons section", lambda: st._daemons(store, where, inventories, now)),
            ("strays", lambda: st._strays(store, inventories, now)),
            ("standing collisions", lambda: st._shared(store)),
            ("limits", lambda: tuple(store.limits())),
            ("Worker objects", lambda: st._workers(head_boots, records, where.jobs_of, now)),
            ("to_dict", report.to_dict),
            ("json.dumps", lambda: json.dumps(doc)),
        ]
        print(f"status --json with {args.running:,} running, {args.workers:,} workers, {daemons} daemons: "
              f"{whole:.2f} ms median ({len(json.dumps(doc)):,} bytes)")
        for name, fn in phases:
            print(f"  {name:40s} {median_ms(fn, args.repeat):6.2f} ms")
        return 0
    finally:
        rs.close()


if __name__ == "__main__":
    sys.exit(main())
