"""Benchmark: `/metrics` scrapes and `jobpool status --json` reads of a pool that retains 100,000 finished
jobs and runs `--running` jobs over `--workers` live worker boots on `--daemons` Docker daemons, against a
scrape of an empty pool on the same redis-server, and (`--baseline DIR`) against another tree's code, in the
same run.

Starts its own redis-server (tests/support/servers.py). The loaded pool gets its first jobs through the
scripts (enqueue, claim, finish: succeeded, failed with assorted exit codes, cancelled), so its counters and
histograms are populated as a real pool's are; the rest of the retained rows are copies of those rows added
in bulk (a scrape never reads a finished row: it counts indexes). Its running jobs are enqueued, promoted and
claimed through the scripts, as workers leave them: each by one of the live worker boot records, on that
worker's daemon, whose inventory its publisher keeps fresh (`publish_inventory`); a queue of 100 waits behind
a paused promotion.

Each tree serves both pools from a process of its own (`PYTHONPATH` set to the tree: this one, and with
`--baseline DIR` a checkout of the code before, e.g. /work/main or `git archive main | tar -x -C DIR`), with
the supervisor's own metrics server (jobpool/exporter.py, `MetricsServer`), scraped over HTTP, and reads the
status report as `jobpool status --json` does (`read_status`, `to_dict`, `json.dumps`) on command. The trees
alternate, `--repeat` scrapes and status reads each per round. Redis commands per scrape and per status read
are counted from INFO commandstats, at three points: with a tenth of the running jobs, with all of them, and
with the retained rows added. Goals: a scrape with 100,000 retained jobs within 50 ms at p95; commands per
scrape and per status read that do not grow with the running jobs; a scrape within 20 ms median (issue #27:
10,000 running jobs and 1,000 workers).

    python3 -m bench.scrape [--retained 100000] [--running 64] [--workers 8] [--daemons N] [--repeat 50]
                            [--baseline DIR]
    python3 -m bench.scrape --running 10000 --workers 1000 --baseline /work/main
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

from bench._common import TreeChild
from jobpool import Pool
from jobpool.config import Settings
from jobpool.fleet.inventory import FORGET_MS, encode
from jobpool.workers.attempt import Attempt
from tests.support.servers import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[1]
THROUGH_SCRIPTS = 1000
BULK = 5000
LEAD_MS = 600_000
POOLS = ("empty", "loaded")

#: One tree's server of both pools' /metrics, and its status reads on command ("status POOL N": N reads,
#: replying with each one's ms; "quit").
CHILD = r"""
import json, sys, time
from jobpool.config import Settings
from jobpool.exporter import MetricsServer
from jobpool.status import read_status
from jobpool.store.calls import Store

cfg = json.loads(sys.argv[1])
servers, stores = {}, {}
for name, port in cfg["ports"].items():
    settings = Settings(redis_url=cfg["url"], pool=name, metrics_port=port)
    servers[name], stores[name] = MetricsServer(settings), Store.from_settings(settings)
print(json.dumps({name: s.url for name, s in servers.items()}), flush=True)
for line in sys.stdin:
    words = line.split()
    if not words or words[0] == "quit":
        break
    name, n = words[1], int(words[2])
    times, size = [], 0
    for _ in range(n):
        t = time.perf_counter()
        size = len(json.dumps(read_status(stores[name]).to_dict()))
        times.append((time.perf_counter() - t) * 1000)
    print(json.dumps({"ms": times, "bytes": size}), flush=True)
for s in servers.values():
    s.close()
for s in stores.values():
    s.close()
"""


def _term_to_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


class Child(TreeChild):
    """One tree's process: both pools' metrics servers, and status reads on command."""

    def __init__(self, name: str, tree: Path, url: str) -> None:
        super().__init__(name, tree, CHILD, {"url": url, "ports": {p: free_port() for p in POOLS}}, 30)
        self.urls: dict[str, str] = self.hello

    def status(self, pool: str, n: int) -> tuple[list[float], int]:
        """`n` status reads of `pool`: each one's ms, and the size of its JSON document."""
        reply = self.ask(f"status {pool} {n}")
        return list(reply["ms"]), int(reply["bytes"])


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


def daemon_of(worker: int, daemons: int) -> str:
    """The identity of worker `worker`'s Docker daemon (jobpool/fleet/daemonid.py's form)."""
    return f"jpd1:{worker % daemons:032x}@bench-host-{worker % daemons}"


def live_workers(pool: Pool, workers: int, daemons: int) -> list[str]:
    """`workers` boot records that are alive (heartbeat now), each on its daemon, each with the record of its
    mark on that daemon (jobpool/fleet/daemonmark.py: every process on a daemon marks it, and names the peers
    whose marks it found there)."""
    boots = [f"boot{i:05d}" for i in range(workers)]
    now = int(time.time() * 1000)
    for i, b in enumerate(boots):  # as a worker's beat writes them (jobpool/workers/boot.py)
        record: dict[str, str | int] = {
            "host": f"bench-host-{i % daemons}", "pid": 1, "pidns": "4026531836",
            "kernel_boot_id": f"k{i % daemons}", "daemon_id": daemon_of(i, daemons), "executor": "docker",
            "started_at": now, "draining": 0,
            "role": "worker", "cannot_claim": "", "live_restore": "1", "heartbeat_at": now, "stuck": ""}
        pool.store.beat_boot(b, record, 10 * LEAD_MS, now)
    for i, b in enumerate(boots):
        peers = " ".join(boots[j] for j in range(i % daemons, workers, daemons) if j != i)
        fields = {"role": "worker", "host": f"bench-host-{i % daemons}", "pid": "1",
                  "docker_host": "unix:///var/run/docker.sock", "daemon_id": daemon_of(i, daemons),
                  "mark": f"jobpool-daemon-mark-{b}", "verified": peers, "collision": "",
                  "process": json.dumps({"pid": 1, "start": 1, "boot_id": f"k{i % daemons}", "pidns": "p"})}
        pool.store.daemon_mark(b, LEAD_MS, 10 * LEAD_MS, list(fields.items()))
    return boots


def run_more(pool: Pool, n: int, boots: list[str], daemons: int) -> None:
    """`n` more jobs running: enqueued ahead of the queue (it holds lower priorities), promoted by as many
    more slots, each claimed by the next worker, on its daemon."""
    running = int(pool.store.client.zcard(pool.keys.running))
    jobs = pool.enqueue_many([{"image": "busybox", "command": ["sleep", "3600"]}] * n)
    pool.set_slots(running + n)
    while pool.promote():
        pass
    assert pool.store.client.zcard(pool.keys.running) == running + n

    def claim(k: int) -> None:
        w = (running + k) % len(boots)
        Attempt(pool.store, jobs[k].id, boots[w], 1).claim("docker", daemon_of(w, daemons))

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(claim, range(n)))


def publish(pool: Pool, daemons: int) -> None:
    """Every daemon's inventory, fresh, as its publisher writes it (nothing stray on it)."""
    store = pool.store
    containers, complete = encode([])
    for d in range(daemons):
        daemon = daemon_of(d, daemons)
        store.inventory_lead(daemon, f"publisher-{d}", LEAD_MS)
        store.publish_inventory(daemon, f"publisher-{d}", f"bench-host-{d}", LEAD_MS, LEAD_MS, complete,
                                containers, FORGET_MS, store.now_ms(), "")


def commands(pool: Pool) -> int:
    stats = pool.store.client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def scrape(url: str) -> float:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as reply:
        body = reply.read()
    ms = (time.perf_counter() - t) * 1000
    assert b"jobpool_transitions_total" in body or b"jobpool_slots_max" in body
    return ms


def counted(pools: dict[str, Pool], children: list[Child]) -> dict[str, dict[str, int]]:
    """Redis commands of one scrape of each pool and one status read of the loaded one, per tree (after one
    of each uncounted: a new connection's CLIENT SETINFO is no read's)."""
    out: dict[str, dict[str, int]] = {}
    loaded = pools["loaded"]
    for child in children:
        for name in POOLS:
            scrape(child.urls[name])
        child.status("loaded", 1)
        out[child.name] = {}
        for name in POOLS:
            before = commands(loaded)
            scrape(child.urls[name])
            out[child.name][f"scrape {name}"] = commands(loaded) - before
        before = commands(loaded)
        child.status("loaded", 1)
        out[child.name]["status"] = commands(loaded) - before
    return out


def p95(values: list[float]) -> float:
    return sorted(values)[int(0.95 * (len(values) - 1))]


Counts = dict[str, dict[str, int]]


def show(runs: dict[tuple[str, str], list[float]], size: dict[str, int],
         counts: tuple[Counts, Counts, Counts], args: argparse.Namespace, first: int) -> int:
    """Each tree's figures, the ratios, and the goals of this tree (0 when all are met)."""
    few, all_running, per = counts
    med = {k: statistics.median(v) for k, v in runs.items()}
    high = {k: p95(v) for k, v in runs.items()}
    for n in dict.fromkeys(name for name, _ in runs):
        for name in POOLS:
            print(f"  {n:9} {name:6} pool: scrape median {med[(n, name)]:.2f} ms, p95 "
                  f"{high[(n, name)]:.2f} ms, {per[n][f'scrape {name}']} redis commands per scrape")
        print(f"  {n:9} status --json of the loaded pool: median {med[(n, 'status')]:.2f} ms, p95 "
              f"{high[(n, 'status')]:.2f} ms, {per[n]['status']} redis commands, {size[n]:,} bytes")
        print(f"  {n:9} redis commands per scrape of the loaded pool / per status read: "
              f"{few[n]['scrape loaded']} / {few[n]['status']} with {first:,} running, "
              f"{all_running[n]['scrape loaded']} / {all_running[n]['status']} with {args.running:,} "
              "running, "
              f"{per[n]['scrape loaded']} / {per[n]['status']} with {args.retained:,} retained")
    me, base = "this tree", "baseline"
    if args.baseline:
        print(f"  baseline / this tree: scrape {med[(base, 'loaded')] / med[(me, 'loaded')]:.2f}x median, "
              f"status {med[(base, 'status')] / med[(me, 'status')]:.2f}x median; commands "
              f"{per[base]['scrape loaded'] / per[me]['scrape loaded']:.1f}x per scrape, "
              f"{per[base]['status'] / per[me]['status']:.1f}x per status read")
    ratio = med[(me, "loaded")] / med[(me, "empty")]
    retained_ok = high[(me, "loaded")] <= 50.0
    print(f"scrape with {args.retained:,} retained jobs: {med[(me, 'loaded')]:.2f} ms median "
          f"({ratio:.2f}x an empty pool's {med[(me, 'empty')]:.2f} ms); goal <= 50 ms at p95: "
          f"{'met' if retained_ok else 'NOT met'} ({high[(me, 'loaded')]:.2f} ms)")
    flat = all(few[me][k] == all_running[me][k] for k in ("scrape loaded", "status"))
    print(f"redis commands per scrape and per status read, {first:,} running against {args.running:,}: the "
          f"same: {'met' if flat else 'NOT met'}")
    fast = med[(me, "loaded")] <= 20.0
    print(f"scrape with {args.running:,} running and {args.workers:,} workers: goal <= 20 ms median: "
          f"{'met' if fast else 'NOT met'} ({med[(me, 'loaded')]:.2f} ms)", flush=True)
    return 0 if retained_ok and flat and fast else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--retained", type=int, default=100_000)
    ap.add_argument("--running", type=int, default=64)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--daemons", type=int, help="the workers' Docker daemons (default: a tenth of them)")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--baseline", help="a checkout of the code to compare with (its root directory)")
    args = ap.parse_args()
    daemons = args.daemons or max(1, args.workers // 10)
    signal.signal(signal.SIGTERM, _term_to_exit)
    rs = RedisServer()
    children: list[Child] = []
    pools: dict[str, Pool] = {}
    try:
        rs.start()
        pools = {name: Pool.from_settings(Settings(redis_url=rs.url, pool=name)) for name in POOLS}
        trees = [("this tree", ROOT)] + ([("baseline", Path(args.baseline))] if args.baseline else [])
        children = [Child(name, tree, rs.url) for name, tree in trees]
        loaded = pools["loaded"]
        t = time.perf_counter()
        ids = through_scripts(loaded, min(THROUGH_SCRIPTS, args.retained))
        boots = live_workers(loaded, args.workers, daemons)
        loaded.set_slots(0)
        loaded.enqueue_many([{"image": "busybox", "command": ["true"], "priority": -1}] * 100)  # a queue
        first = max(1, args.running // 10)
        run_more(loaded, first, boots, daemons)
        publish(loaded, daemons)
        few = counted(pools, children)
        run_more(loaded, args.running - first, boots, daemons)
        publish(loaded, daemons)
        all_running = counted(pools, children)
        bulk_rows(loaded, ids, args.retained)
        report = loaded.status()
        version = loaded.store.client.info("server")["redis_version"]
        print(f"seeded in {time.perf_counter() - t:.0f} s: {dict(report.counts)}, {args.workers} live "
              f"workers on {daemons} daemon(s) (redis-server {version})", flush=True)
        publish(loaded, daemons)
        per = counted(pools, children)
        runs = {(c.name, p): cast("list[float]", []) for c in children for p in (*POOLS, "status")}
        size: dict[str, int] = {}
        rounds = 5
        for rnd in range(rounds):
            publish(loaded, daemons)  # the publishers' period: inventories stay fresh
            for child in children if rnd % 2 == 0 else children[::-1]:
                for _ in range(max(1, args.repeat // rounds)):
                    for name in POOLS:
                        runs[(child.name, name)].append(scrape(child.urls[name]))
                ms, size[child.name] = child.status("loaded", max(1, args.repeat // rounds))
                runs[(child.name, "status")] += ms
        return show(runs, size, (few, all_running, per), args, first)
    finally:
        for child in children:
            child.close()
        for pool in pools.values():
            pool.store.client.close()
        rs.close()


if __name__ == "__main__":
    sys.exit(main())
