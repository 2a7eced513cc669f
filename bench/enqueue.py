"""Benchmark: `Pool.enqueue` against `rq.Queue.enqueue`, bulk enqueue against RQ's, and promotion, on one
private redis-server.

Starts its own redis-server (tests/support/servers.py) and measures, in the same run, medians of several
rounds:

- `Pool.enqueue` with no free slot (the job stays queued: one script call, row + event);
- `Pool.enqueue` with free slots (the same call also promotes it: RQ hash written, id pushed on RQ's list);
- `rq.Queue.enqueue` with RQ's JSON serializer and a trivial function by dotted path (the baseline: what a
  plain RQ user pays to make a job visible to workers);
- promotion: N queued jobs promoted into N free slots by `Pool.promote()` (batches of 32 candidates);
- bulk: `Pool.enqueue_many` of --bulk-n jobs (no free slot; batches of --batch-size per script call) against
  `rq.Queue.enqueue_many` of as many `Queue.prepare_data` jobs on one pipeline (RQ's bulk enqueue, one round
  trip);
  both timings include building the input (the spec dicts; RQ's prepare_data).

Each round starts from an empty database (FLUSHALL, not timed); the order of the contenders alternates
between rounds. Goals: `Pool.enqueue` at least 2.0x the jobs/s of `rq.Queue.enqueue`, and
`Pool.enqueue_many` at least 2.0x the jobs/s of `rq.Queue.enqueue_many` (pipelined). A ratio is the median
of the rounds' own ratios: each pairs two contenders timed within a second of each other, so a burst of load
from elsewhere on the host moves one round's ratio, not the median (a ratio of medians pairs times taken
minutes apart).

    python3 -m bench.enqueue [--n 2000] [--bulk-n 20000] [--rounds 5] [--batch-size 100] [--profile]

--profile adds a cProfile of `Pool.enqueue` (no free slot), to show where its time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from jobpool import Pool
from jobpool.config import Settings
from jobpool.store.redisurl import connect
from tests.support.servers import RedisServer

#: The RQ baseline's job function, by dotted path (RQ does not import it at enqueue time).
TRIVIAL_FUNC = "os.getpid"
GOAL = 2.0
POOL_QUEUED = "Pool.enqueue (stays queued)"
POOL_PROMOTED = "Pool.enqueue (promoted at once)"
RQ = "rq.Queue.enqueue (JSON serializer)"
PROMOTE = "Pool.promote (into N free slots)"
BULK = "Pool.enqueue_many (stays queued)"
RQ_BULK = "rq.Queue.enqueue_many (pipelined)"


@dataclass(frozen=True)
class Measure:
    """One timed batch: jobs/s (wall), and per job the client's CPU and the server's command time."""

    rate: float
    client_cpu_us: float
    server_us: float


def fresh(raw: redis.Redis) -> None:
    """An empty database and zeroed command statistics (not timed)."""
    raw.flushall()
    raw.config_resetstat()


def server_usec(raw: redis.Redis) -> int:
    """Microseconds the server spent in commands since `fresh` (nested script calls counted once)."""
    stats = raw.info("commandstats")
    if "cmdstat_evalsha" in stats:  # a script's redis.call()s are inside its own time
        return int(stats["cmdstat_evalsha"]["usec"])
    return sum(int(v["usec"]) for k, v in stats.items() if k not in ("cmdstat_flushall", "cmdstat_config"))


def time_calls(raw: redis.Redis, n: int, call: Callable[[int], object]) -> Measure:
    """`n` calls of `call(i)`, timed."""
    before = server_usec(raw)
    cpu, start = time.process_time(), time.perf_counter()
    for i in range(n):
        call(i)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return Measure(n / wall, cpu / n * 1e6, (server_usec(raw) - before) / n)


def bench_pool_enqueue(url: str, raw: redis.Redis, n: int, free_slots: bool) -> Measure:
    fresh(raw)
    settings = Settings(redis_url=url, pool="bench", max_concurrent_jobs=n if free_slots else 0)
    pool = Pool(connect(url), settings)
    pool.store.client.ping()  # connect before timing
    try:
        rate = time_calls(raw, n, lambda i: pool.enqueue(image="busybox", command=["echo", str(i)]))
        expected = "running" if free_slots else "queued"
        assert pool.stats()["counts"][expected] == n, "the benchmark did not do what it says"
        return rate
    finally:
        pool.store.client.close()


def bench_rq_enqueue(url: str, raw: redis.Redis, n: int) -> Measure:
    fresh(raw)
    client = redis.Redis.from_url(url)
    queue = Queue("bench", connection=client, serializer=JSONSerializer)
    client.ping()
    try:
        rate = time_calls(raw, n, lambda i: queue.enqueue(TRIVIAL_FUNC, "echo", str(i)))
        assert queue.count == n, "the benchmark did not do what it says"
        return rate
    finally:
        client.close()


def bench_promote(url: str, raw: redis.Redis, n: int) -> Measure:
    fresh(raw)
    pool = Pool(connect(url), Settings(redis_url=url, pool="bench", max_concurrent_jobs=0))
    try:
        for i in range(n):
            pool.enqueue(image="busybox", command=["echo", str(i)])
        pool.store.client.hset(pool.keys.config, "max_concurrent_jobs", n)  # free slots, nothing promoted yet
        promoted: list[int] = []
        m = time_calls(raw, 1, lambda _: promoted.append(pool.promote()))
        assert promoted == [n] and pool.slots() == (n, n), "the benchmark did not do what it says"
        return Measure(m.rate * n, m.client_cpu_us / n, m.server_us / n)
    finally:
        pool.store.client.close()


def bench_pool_bulk(url: str, raw: redis.Redis, n: int, batch_size: int) -> Measure:
    fresh(raw)
    pool = Pool(connect(url), Settings(redis_url=url, pool="bench", max_concurrent_jobs=0))
    pool.store.client.ping()
    try:
        def bulk(_: int) -> None:
            jobs = pool.enqueue_many([{"image": "busybox", "command": ["echo", str(i)]} for i in range(n)],
                                     batch_size=batch_size)
            assert len(jobs) == n
        m = time_calls(raw, 1, bulk)
        assert pool.stats()["counts"]["queued"] == n, "the benchmark did not do what it says"
        return Measure(m.rate * n, m.client_cpu_us / n, m.server_us / n)
    finally:
        pool.close()


def bench_rq_bulk(url: str, raw: redis.Redis, n: int) -> Measure:
    fresh(raw)
    client = redis.Redis.from_url(url)
    queue = Queue("bench", connection=client, serializer=JSONSerializer)
    client.ping()
    try:
        def bulk(_: int) -> None:
            datas = [Queue.prepare_data(TRIVIAL_FUNC, ("echo", str(i))) for i in range(n)]
            with client.pipeline() as pipe:
                queue.enqueue_many(datas, pipeline=pipe)
                pipe.execute()
        m = time_calls(raw, 1, bulk)
        assert queue.count == n, "the benchmark did not do what it says"
        return Measure(m.rate * n, m.client_cpu_us / n, m.server_us / n)
    finally:
        client.close()


def profile_pool_enqueue(url: str, raw: redis.Redis, n: int) -> str:
    fresh(raw)
    pool = Pool(connect(url), Settings(redis_url=url, pool="bench", max_concurrent_jobs=0))
    pool.store.client.ping()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        pool.enqueue(image="busybox", command=["echo", str(i)])
    prof.disable()
    pool.store.client.close()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(25)
    stats.sort_stats("tottime").print_stats(15)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="jobs per round (default 2000)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; medians are reported (default 5)")
    ap.add_argument("--bulk-n", type=int, default=20000,
                    help="jobs per round of the bulk contenders (default 20000: a round of 2000 lasts a "
                         "tenth of a second, short enough for one burst of load elsewhere to decide it)")
    ap.add_argument("--batch-size", type=int, default=100, help="Pool.enqueue_many's batch (default 100)")
    ap.add_argument("--profile", action="store_true", help="also cProfile Pool.enqueue")
    args = ap.parse_args(argv)

    with RedisServer() as server:
        server.start()
        raw = redis.Redis.from_url(server.url)
        url = server.url
        contenders: dict[str, Callable[[], Measure]] = {
            POOL_QUEUED: lambda: bench_pool_enqueue(url, raw, args.n, free_slots=False),
            POOL_PROMOTED: lambda: bench_pool_enqueue(url, raw, args.n, free_slots=True),
            RQ: lambda: bench_rq_enqueue(url, raw, args.n),
            PROMOTE: lambda: bench_promote(url, raw, args.n),
            BULK: lambda: bench_pool_bulk(url, raw, args.bulk_n, args.batch_size),
            RQ_BULK: lambda: bench_rq_bulk(url, raw, args.bulk_n),
        }
        for run in contenders.values():  # warm-up (script loading, imports, connections), not reported
            run()
        results: dict[str, list[Measure]] = {name: [] for name in contenders}
        names = list(contenders)
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else reversed(names):
                results[name].append(contenders[name]())
        profile = profile_pool_enqueue(url, raw, args.n) if args.profile else ""
        raw.close()
    report(results, args.n, args.bulk_n, args.rounds)
    if profile:
        print(profile)
    return 0


def report(results: dict[str, list[Measure]], n: int, bulk_n: int, rounds: int) -> None:
    def med(name: str, attr: str) -> float:
        middle: float = statistics.median(getattr(m, attr) for m in results[name])
        return middle

    print(f"private redis-server, N={n} jobs per round ({bulk_n} for the bulk contenders), {rounds} rounds; "
          "medians (min..max of jobs/s)")
    print(f"  {'':34s} {'jobs/s':>9s}   {'':17s} {'client CPU/job':>14s} {'server/job':>11s}")
    for name, ms in results.items():
        rates = [m.rate for m in ms]
        print(f"  {name:34s} {med(name, 'rate'):9.0f}   ({min(rates):6.0f}..{max(rates):6.0f})"
              f" {med(name, 'client_cpu_us'):11.0f} us {med(name, 'server_us'):8.0f} us")
    def ratios(name: str, base: str) -> list[float]:
        """Each round's jobs/s of `name` over `base`'s in that round."""
        return [m.rate / b.rate for m, b in zip(results[name], results[base], strict=True)]

    def said(rs: list[float]) -> str:
        return f"{statistics.median(rs):.2f} (rounds {min(rs):.2f}..{max(rs):.2f})"

    queued, promoted = ratios(POOL_QUEUED, RQ), ratios(POOL_PROMOTED, RQ)
    verdict = "meets" if statistics.median(queued) >= GOAL else "BELOW"
    print(f"ratio Pool.enqueue / rq.Queue.enqueue (jobs/s, median of the rounds' ratios): {said(queued)} "
          f"queued, {said(promoted)} promoted at once -- {verdict} the goal of {GOAL:.1f}")
    bulk = ratios(BULK, RQ_BULK)
    verdict = "meets" if statistics.median(bulk) >= GOAL else "BELOW"
    print(f"ratio Pool.enqueue_many / rq.Queue.enqueue_many pipelined (jobs/s): {said(bulk)}"
          f" -- {verdict} the goal of {GOAL:.1f}")


if __name__ == "__main__":
    sys.exit(main())
