"""Benchmark: one `/metrics` scrape of a pool that retains 100,000 finished jobs, against a scrape of an
empty pool on the same redis-server in the same run.

Starts its own redis-server (tests/support/servers.py). The loaded pool gets its first jobs through the
scripts (enqueue, claim, finish: succeeded, failed with assorted exit codes, cancelled), so its counters and
histograms are populated as a real pool's are; the rest of the retained rows are copies of those rows added
in bulk (a scrape never reads a finished row: it counts indexes), then `--running` claimed rows held by
`--workers` live worker boot records. Each pool is served by the supervisor's own server
(jobpool/exporter.py, `MetricsServer`) and scraped over HTTP, alternating, `--repeat` times.
Redis commands per scrape are counted from INFO commandstats, before and after the bulk rows are added: they
grow with the running rows and live workers (at most the slots and the boots the status report reads), never
with the retained jobs.
Goal: a scrape with 100,000 retained jobs within 50 ms.

    python3 -m bench.scrape [--retained 100000] [--running 64] [--workers 8] [--repeat 50]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
import urllib.request
from typing import Any, cast

from jobpool import Pool
from jobpool.config import Settings
from jobpool.exporter import MetricsServer
from jobpool.workers.attempt import Attempt
from tests.support.servers import RedisServer, free_port

THROUGH_SCRIPTS = 1000
BULK = 5000


def _term_to_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def through_scripts(pool: Pool, n: int) -> list[str]:
    """`n` jobs run to an end through the scripts: most succeed, some fail (exit 1..9), some are cancelled."""
    ids = []
    for i in range(n):
        job = pool.enqueue(image="busybox", command=["true"])
        ids.append(job.id)
        if i % 10 == 9:
            pool.cancel(job.id)
            continue
        att = Attempt(pool.store, job.id, "bench-boot", pool.get(job.id).attempt)
        att.claim()
        att.finish("exit", 0 if i % 10 < 7 else i % 9 + 1, log_tail="done\n")
    return ids


def bulk_rows(pool: Pool, templates: list[str], total: int) -> None:
    """Copies of the finished rows `templates` until the pool retains `total` finished jobs."""
    rows = [cast("dict[str, str]", pool.store.client.hgetall(pool.keys.job(t))) for t in templates]
    have = sum(pool.store.client.zcard(pool.keys.state_index(s))
               for s in ("succeeded", "failed", "cancelled"))
    now = int(time.time() * 1000)
    n = 0
    while have + n < total:
        pipe = pool.store.client.pipeline(transaction=False)
        for _ in range(min(BULK, total - have - n)):
            row: dict[Any, Any] = dict(rows[n % len(rows)])
            job_id = f"bulk{n:08d}"
            row["id"] = job_id
            pipe.hset(pool.keys.job(job_id), mapping=row)
            pipe.zadd(pool.keys.state_index(row["state"]), {job_id: now - total + n})
            n += 1
        pipe.execute()


def live_fleet(pool: Pool, running: int, workers: int) -> None:
    """`running` claimed rows spread over `workers` boot records that are alive (heartbeat now)."""
    pool.set_slots(running)
    boots = [f"boot{i:04d}" for i in range(workers)]
    now = int(time.time() * 1000)
    for b in boots:
        pool.store.client.hset(pool.keys.boot(b), mapping={"host": "bench", "pid": "1", "executor": "docker",
                                                      "started_at": now, "role": "worker"})
        pool.store.client.zadd(pool.keys.boots, {b: now})
    for i in range(running):
        job = pool.enqueue(image="busybox", command=["sleep", "3600"])
        Attempt(pool.store, job.id, boots[i % workers], pool.get(job.id).attempt).claim()
    pool.pause(None, reason="bench")
    for _ in range(100):  # a queue behind them
        pool.enqueue(image="busybox", command=["true"])


def commands(pool: Pool) -> int:
    stats = pool.store.client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def scrape(url: str) -> float:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as reply:
        body = reply.read()
    ms = (time.perf_counter() - t) * 1000
    assert b"jobpool_transitions_total" in body or b"jobpool_slots_max" in body
    return ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--retained", type=int, default=100_000)
    ap.add_argument("--running", type=int, default=64)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _term_to_exit)
    rs = RedisServer()
    servers: list[MetricsServer] = []
    try:
        rs.start()
        pools = {}
        for name in ("empty", "loaded"):
            settings = Settings(redis_url=rs.url, pool=name, metrics_port=free_port())
            servers.append(MetricsServer(settings))
            pools[name] = Pool.from_settings(settings)
        loaded = pools["loaded"]
        t = time.perf_counter()
        ids = through_scripts(loaded, min(THROUGH_SCRIPTS, args.retained))
        live_fleet(loaded, args.running, args.workers)
        scrape(servers[1].url)
        before = commands(loaded)
        scrape(servers[1].url)
        few = commands(loaded) - before
        bulk_rows(loaded, ids, args.retained)
        report = loaded.status()
        version = loaded.store.client.info("server")["redis_version"]
        print(f"seeded in {time.perf_counter() - t:.0f} s: {dict(report.counts)}, {args.workers} live "
              f"workers (redis-server {version})", flush=True)
        urls = {name: s.url for name, s in zip(pools, servers, strict=True)}
        for url in urls.values():
            scrape(url)  # warm-up: connections, script-free first reads
        per_scrape = {}
        for name, pool in pools.items():
            before = commands(pool)
            scrape(urls[name])
            per_scrape[name] = commands(pool) - before
        runs: dict[str, list[float]] = {name: [] for name in pools}
        for _ in range(args.repeat):
            for name in pools:
                runs[name].append(scrape(urls[name]))
        med = {name: statistics.median(r) for name, r in runs.items()}
        p95 = {name: sorted(r)[int(0.95 * (len(r) - 1))] for name, r in runs.items()}
        for name in pools:
            print(f"  {name:6} pool: median {med[name]:.2f} ms, p95 {p95[name]:.2f} ms, "
                  f"{per_scrape[name]} redis commands per scrape", flush=True)
        print(f"  redis commands per scrape of the loaded pool: {few} with {len(ids):,} retained jobs, "
              f"{per_scrape['loaded']} with {args.retained:,} (they grow with running rows and workers only)",
              flush=True)
        ratio = med["loaded"] / med["empty"]
        ok = p95["loaded"] <= 50.0
        print(f"scrape with {args.retained:,} retained jobs: {med['loaded']:.2f} ms median "
              f"({ratio:.2f}x an empty pool's {med['empty']:.2f} ms); goal <= 50 ms at p95: "
              f"{'met' if ok else 'NOT met'} ({p95['loaded']:.2f} ms)", flush=True)
        return 0 if ok else 1
    finally:
        for s in servers:
            s.close()
        rs.close()


if __name__ == "__main__":
    sys.exit(main())
