"""Benchmark: order and limits (docs/architecture.md, "Order and limits") on one private redis-server.

Two questions, each answered as a ratio of contenders measured in the same run, rounds alternating:

- Does promotion cost grow with what cannot start? With --queued jobs queued, promoting into one free slot
  is timed (`Pool.promote()`, one slot freed before each, not timed) when none is blocked, and when the
  first --blocked of them use a named limit that is full (their parking, once, is timed apart: the scripts
  park a job that cannot start and do not read it again until its limit gives a unit back). Goal: the
  blocked case costs at most 2.0x the plain one, in the server's time per promotion and in wall time.
- `Pool.enqueue` with a priority, a group and a named limit set, against `rq.Queue.enqueue` (JSON serializer,
  a trivial function by dotted path), as bench/enqueue.py measures the plain one. Goal: at least 2.0x.

    python3 -m bench.order [--queued 100000] [--blocked 10000] [--promotes 200] [--n 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import redis

from bench.enqueue import RQ, Measure, bench_rq_enqueue, fresh, server_usec, time_calls
from jobpool import Pool
from jobpool.config import Settings
from jobpool.store.redisurl import connect
from tests.support.servers import RedisServer

GOAL_PROMOTE = 2.0
GOAL_ENQUEUE = 2.0
LIMIT = "dataset:sales"
PLAIN = "promote into a free slot, none blocked"
BLOCKED = "promote into a free slot, the first ones blocked"
ORDERED = "Pool.enqueue (priority, group, uses)"


def fill(pool: Pool, queued: int, blocked: int) -> None:
    """`queued` jobs, the first `blocked` of them using LIMIT (not timed)."""
    batch = 1000
    for start in range(0, queued, batch):
        specs = [{"image": "busybox", "command": ["echo", str(i)],
                  **({"uses": {LIMIT: 1}} if i < blocked else {})}
                 for i in range(start, min(queued, start + batch))]
        pool.enqueue_many(specs, batch_size=batch)


def bench_promotes(url: str, raw: redis.Redis, queued: int, blocked: int,
                   promotes: int) -> tuple[Measure, float]:
    """Per promotion into one free slot (after the parking, when any); and the parking's seconds."""
    fresh(raw)
    pool = Pool(connect(url), Settings(redis_url=url, pool="bench", max_concurrent_jobs=0))
    try:
        pool.set_limit(LIMIT, 0)  # full: nothing that uses it can start
        fill(pool, queued, blocked)
        pool.store.client.hset(pool.keys.config, "max_concurrent_jobs", 1)
        start = time.perf_counter()
        assert pool.promote() == 1, "the benchmark did not do what it says"  # parks the blocked, once
        parking = time.perf_counter() - start
        assert int(raw.zcard(pool.keys.blocked)) == blocked, "the blocked were not parked"

        def one(_: int) -> None:
            pool.store.client.hincrby(pool.keys.config, "max_concurrent_jobs", 1)
            assert pool.promote() == 1
        before = server_usec(raw)
        cpu, start = time.process_time(), time.perf_counter()
        for i in range(promotes):
            one(i)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        # The HINCRBYs' own server time is a few microseconds each, on both sides alike.
        return Measure(promotes / wall, cpu / promotes * 1e6, (server_usec(raw) - before) / promotes), parking
    finally:
        pool.close()


def bench_ordered_enqueue(url: str, raw: redis.Redis, n: int) -> Measure:
    fresh(raw)
    pool = Pool(connect(url), Settings(redis_url=url, pool="bench", max_concurrent_jobs=0))
    pool.set_limit("dataset:*", 1)
    try:
        m = time_calls(raw, n, lambda i: pool.enqueue(
            image="busybox", command=["echo", str(i)], priority=i % 7, group=f"tenant-{i % 5}",
            uses={f"dataset:{i % 50}": 1}))
        assert pool.stats()["counts"]["queued"] == n, "the benchmark did not do what it says"
        return m
    finally:
        pool.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queued", type=int, default=100_000, help="jobs queued (default 100000)")
    ap.add_argument("--blocked", type=int, default=10_000, help="of them, first, on a full limit (10000)")
    ap.add_argument("--promotes", type=int, default=200, help="promotions timed per round (default 200)")
    ap.add_argument("--n", type=int, default=2000, help="enqueues per round (default 2000)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported (default 3)")
    args = ap.parse_args(argv)
    results: dict[str, list[Measure]] = {PLAIN: [], BLOCKED: [], ORDERED: [], RQ: []}
    parkings: list[float] = []
    with RedisServer() as server:
        server.start()
        raw = redis.Redis.from_url(server.url)
        url = server.url
        bench_ordered_enqueue(url, raw, 100)  # warm-up: scripts loaded, imports, connections
        for r in range(args.rounds):
            pair = [(PLAIN, 0), (BLOCKED, args.blocked)]
            for name, blocked in pair if r % 2 == 0 else reversed(pair):
                m, parking = bench_promotes(url, raw, args.queued, blocked, args.promotes)
                results[name].append(m)
                if blocked:
                    parkings.append(parking)
            for name in (ORDERED, RQ) if r % 2 == 0 else (RQ, ORDERED):
                results[name].append(bench_ordered_enqueue(url, raw, args.n) if name == ORDERED
                                     else bench_rq_enqueue(url, raw, args.n))
        raw.close()
    report(results, parkings, args)
    return 0


def report(results: dict[str, list[Measure]], parkings: list[float], args: argparse.Namespace) -> None:
    def med(name: str, attr: str) -> float:
        middle: float = statistics.median(getattr(m, attr) for m in results[name])
        return middle

    print(f"private redis-server; {args.queued} queued, {args.blocked} of them first on a full limit; "
          f"{args.promotes} promotions and {args.n} enqueues per round, {args.rounds} rounds; medians")
    print(f"  {'':48s} {'per s':>9s} {'client CPU':>11s} {'server':>9s}")
    for name, ms in results.items():
        if ms:
            print(f"  {name:48s} {med(name, 'rate'):9.0f} {med(name, 'client_cpu_us'):8.0f} us "
                  f"{med(name, 'server_us'):6.0f} us")
    print(f"  parking the {args.blocked} blocked, once: {statistics.median(parkings):.2f} s")
    server = [b.server_us / p.server_us for b, p in zip(results[BLOCKED], results[PLAIN], strict=True)]
    wall = [p.rate / b.rate for b, p in zip(results[BLOCKED], results[PLAIN], strict=True)]
    verdict = "meets" if max(statistics.median(server), statistics.median(wall)) <= GOAL_PROMOTE else "ABOVE"
    print(f"promotion cost, blocked / none blocked: server time {statistics.median(server):.2f}x, wall "
          f"{statistics.median(wall):.2f}x -- {verdict} the goal of at most {GOAL_PROMOTE:.1f}x")
    ratio = [o.rate / r.rate for o, r in zip(results[ORDERED], results[RQ], strict=True)]
    verdict = "meets" if statistics.median(ratio) >= GOAL_ENQUEUE else "BELOW"
    print(f"ratio Pool.enqueue (priority, group, uses) / rq.Queue.enqueue (jobs/s): "
          f"{statistics.median(ratio):.2f} (rounds {min(ratio):.2f}..{max(ratio):.2f}) -- {verdict} the goal "
          f"of {GOAL_ENQUEUE:.1f}")


if __name__ == "__main__":
    sys.exit(main())
