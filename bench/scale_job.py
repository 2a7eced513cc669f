"""bench/scale.py's parts about one job: Redis's time for a whole job's life, jobpool against RQ (part 2), and
a queue of 1,000,000 jobs (part 5).

Part 2 runs real workers on private redis-servers of their own, side by side: jobpool workers (the subprocess
executor: no Docker, the same scripts for a job's life) and RQ's own `rq worker` (JSON serializer), each given
jobs that sleep `--job-secs` (60 by default: twelve heartbeats at the default period), enqueued through the
public calls (`Pool.enqueue`, `rq.Queue.enqueue`). Each server logs every command while the jobs run
(SLOWLOG at threshold 0: bench/scale_redis.py); what a job cost is the top-level commands of that window, less
two kinds of idle work, shown on their own lines: the boot records jobpool's workers keep whether or not they
run a job, and the dequeue polls (LMOVE, BLMOVE) of both. Server CPU over the same window is printed too.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from rq import Queue
from rq.job import JobStatus
from rq.serializers import JSONSerializer

from jobpool import Pool
from jobpool.store import redispolicy
from tests.support.procs import JobpoolProcess
from tests.support.servers import RedisServer

from . import scale_redis as sr

ROOT = Path(__file__).resolve().parents[1]
#: The fleet the per-job figures are scaled to (issue #27's).
FLEET_RUNNING = 10_000
#: The commands that are a worker's idle upkeep, not a job's: dequeue polls.
POLLS = ("LMOVE", "BLMOVE", "BRPOPLPUSH", "RPOPLPUSH", "BLPOP", "LPOP")


@dataclass
class JobCost:
    """What `jobs` jobs cost one server: top-level commands by label, split job / idle upkeep, and CPU."""

    system: str
    jobs: int
    per_job: dict[str, tuple[int, int]]
    upkeep: dict[str, tuple[int, int]]
    cpu_secs: float
    window_secs: float
    entries: int
    truncated: bool
    #: Who the job's commands were for: jobpool's scripts, RQ's own keys (rq:*), the rest: (calls, usec).
    owners: dict[str, tuple[int, int]]
    scripts: dict[str, tuple[int, int, int, int]]

    @property
    def usec_per_job(self) -> float:
        return sum(u for _, u in self.per_job.values()) / self.jobs

    @property
    def calls_per_job(self) -> float:
        return sum(c for c, _ in self.per_job.values()) / self.jobs


def owner(e: sr.Entry, names: Mapping[str, str]) -> str:
    """Whose work a command is: one of jobpool's scripts, RQ's bookkeeping (its own keys), or else."""
    if e.command == "EVALSHA":
        return "jobpool's scripts"
    if e.first_key().startswith("rq:") or e.command in ("MULTI", "WATCH", "UNWATCH"):
        return "RQ's keys (and transactions)"
    return "the rest"


def cost(system: str, jobs: int, entries: list[sr.Entry], is_upkeep: Callable[[sr.Entry], bool],
         cpu: float, window: float, max_len: int) -> JobCost:
    """What the window's top-level commands say a job cost, the idle upkeep apart."""
    names = sr.script_names()
    top = sr.top_level(entries)
    job = [e for e in top if not is_upkeep(e)]
    idle = [e for e in top if is_upkeep(e)]
    return JobCost(system, jobs, sr.profile(job, names), sr.profile(idle, names), cpu, window, len(entries),
                   len(entries) >= max_len, sr.profile(job, names, owner), sr.script_split(entries, names))


class Warmer:
    """Keeps a server from idling between a few jobs' calls, as a large fleet's traffic would (`--warm`):
    `rate` trivial script calls a second, spaced evenly, on a connection SLOWLOG profiles leave out
    (scale_redis.ADMIN_NAME). bench/cold_calls.py shows why it matters: a call after 50 ms of quiet costs
    the server several times what one 0.5 ms after another does."""

    def __init__(self, url: str, rate: float) -> None:
        self.url, self.rate, self.sent = url, rate, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        client = sr.admin(self.url)
        sha = client.script_load("return redis.call('EXISTS', KEYS[1])")
        step, due = 1.0 / self.rate, time.monotonic()
        while not self._stop.is_set():
            client.evalsha(sha, 1, "bench:warm")
            self.sent += 1
            due += step
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                due = time.monotonic()  # behind: no burst to catch up

    def __enter__(self) -> Warmer:
        if self.rate > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)


def _wait_until(done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


def jobpool_lifecycle(jobs: int, secs: float, work: Path, warm: float = 0) -> JobCost:
    """`jobs` jobs of `secs` seconds through `jobs` jobpool workers on a private redis-server (kept busy by
    `warm` trivial calls a second: `Warmer`)."""
    pool_name = "scalejob"
    procs: list[JobpoolProcess] = []
    with RedisServer() as rs:
        rs.start()
        pool = Pool.from_url(rs.url, pool_name, max_concurrent_jobs=jobs)
        pool.set_slots(jobs)
        env = {"JOBPOOL_REDIS_URL": rs.url, "JOBPOOL_POOL": pool_name, "JOBPOOL_EXECUTOR": "subprocess",
               "JOBPOOL_STATE_DIR": str(work / "state"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
        try:
            for i in range(jobs):
                procs.append(JobpoolProcess("jobpool.workers", env, work / f"jobpool-worker-{i}.log"))
            rq_workers = f"rq:workers:{pool.keys.rq_queue_name}"
            _wait_until(lambda: pool.store.client.scard(rq_workers) >= jobs
                        and pool.store.client.zcard(pool.keys.boots) >= jobs, 60, "jobpool workers to start")
            admin = sr.admin(rs.url)

            def run(command: list[str], timeout: float) -> None:
                ids = [pool.enqueue(image="busybox", command=command).id for _ in range(jobs)]
                _wait_until(lambda: all(admin.hget(pool.keys.job(j), "state") == "succeeded" for j in ids),
                            timeout, "the jobpool jobs to succeed")

            run(["true"], 60)  # a first job each: every script loaded, every horse's connections made
            time.sleep(1)
            boot_prefix = pool.keys.boot("")
            t0, cpu0 = time.monotonic(), sr.cpu_secs(admin)
            with sr.slowlog_all(admin, 2_000_000) as entries, Warmer(rs.url, warm):
                run(["sleep", f"{secs:g}"], secs + 120)
            cpu, window = sr.cpu_secs(admin) - cpu0, time.monotonic() - t0

            def upkeep(e: sr.Entry) -> bool:
                key = e.first_key()
                return e.command in POLLS or key.startswith(boot_prefix) or key == pool.keys.boots

            return cost("jobpool", jobs, entries, upkeep, cpu, window, 2_000_000)
        finally:
            for p in procs:
                p.stop(timeout=20)


def rq_lifecycle(jobs: int, secs: float, work: Path, warm: float = 0) -> JobCost:
    """`jobs` jobs of `secs` seconds through `jobs` of RQ's own workers (`rq worker`, JSON serializer), the
    server kept busy as jobpool's is (`Warmer`)."""
    procs: list[subprocess.Popen[bytes]] = []
    with RedisServer() as rs:
        rs.start()
        conn = redis.Redis.from_url(rs.url)
        queue = Queue("scalejob", connection=conn, serializer=JSONSerializer)
        try:
            for i in range(jobs):
                with open(work / f"rq-worker-{i}.log", "wb") as log:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "rq.cli", "worker", "--url", rs.url, "--serializer",
                         "rq.serializers.JSONSerializer", "scalejob"],
                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=work))
            _wait_until(lambda: conn.scard("rq:workers:scalejob") >= jobs, 60, "rq workers to start")
            admin = sr.admin(rs.url)

            def run(job_secs: float, timeout: float) -> None:
                ids = [queue.enqueue("time.sleep", job_secs).id for _ in range(jobs)]
                _wait_until(lambda: all(admin.hget(f"rq:job:{j}", "status") == JobStatus.FINISHED.value
                                        for j in ids), timeout, "the RQ jobs to finish")

            run(0, 60)  # a first job each, as jobpool's
            time.sleep(1)
            t0, cpu0 = time.monotonic(), sr.cpu_secs(admin)
            with sr.slowlog_all(admin, 2_000_000) as entries, Warmer(rs.url, warm):
                run(secs, secs + 120)
            cpu, window = sr.cpu_secs(admin) - cpu0, time.monotonic() - t0
            return cost("rq", jobs, entries, lambda e: e.command in POLLS, cpu, window, 2_000_000)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            conn.close()


def part_job(jobs: int, secs: float, warm: float = 0) -> dict[str, Any]:
    """Part 2: both lifecycles at once, on their own servers; prints the comparison, returns the figures.
    With `warm`, each server also serves that many trivial calls a second (`Warmer`), left out of the
    figures: a job's cost on a server that a fleet keeps busy rather than on an idle one."""
    work = Path(tempfile.mkdtemp(prefix="jp-scale-job-"))
    try:
        with ThreadPoolExecutor(2) as ex:
            jp_f = ex.submit(jobpool_lifecycle, jobs, secs, work, warm)
            rq_f = ex.submit(rq_lifecycle, jobs, secs, work, warm)
            jp, rq = jp_f.result(), rq_f.result()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratio = jp.usec_per_job / rq.usec_per_job
    busy = f"; each server kept busy by {warm:g} trivial calls/s, not counted" if warm else ""
    print(f"\n== part 2: Redis per job, a {secs:g} s job at the default heartbeat period ({jobs} jobs each, "
          f"real workers side by side{busy})")
    for c in (jp, rq):
        print(f"  {c.system}: {c.usec_per_job:8.0f} us of server time in {c.calls_per_job:6.0f} top-level "
              f"commands per job; server CPU in the window {1000 * c.cpu_secs / c.jobs:6.1f} ms per job "
              f"(window {c.window_secs:.0f} s, SLOWLOG recording on){' TRUNCATED' if c.truncated else ''}")
        print("    by whose work: " + ", ".join(f"{k} {n / c.jobs:g} calls {u / c.jobs:.0f} us"
                                               for k, (n, u) in c.owners.items()))
        print(sr.show_profile(c.per_job, c.jobs, "job", top=14))
        if c.scripts:
            print(sr.show_scripts(c.scripts))
        if c.upkeep:
            print("    idle upkeep, not counted: " + ", ".join(
                f"{k} {n / c.jobs:g}x {u / c.jobs:.0f} us" for k, (n, u) in list(c.upkeep.items())[:6]))
    print(f"  jobpool / RQ, server time per job: {ratio:.2f}x (goal <= 2.0x: "
          f"{'met' if ratio <= 2 else 'NOT met'})")
    for c in (jp, rq):  # what that is for a fleet: each running job costs this every second
        share = FLEET_RUNNING * c.usec_per_job / secs / 1e4
        print(f"  {c.system}: {FLEET_RUNNING:,} jobs running like these would send "
              f"{FLEET_RUNNING * c.calls_per_job / secs:,.0f} commands/s, {share:.0f} % of a core in "
              "commands "
              "(the workers' idle upkeep aside)")
    return {"jobpool_us": jp.usec_per_job, "rq_us": rq.usec_per_job, "ratio": ratio,
            "jobpool_calls": jp.calls_per_job, "rq_calls": rq.calls_per_job,
            "jobpool_cpu_ms": 1000 * jp.cpu_secs / jobs, "rq_cpu_ms": 1000 * rq.cpu_secs / jobs}


# ---- part 5: a deep queue -------------------------------------------------------------------------------


def _server_usec(admin: redis.Redis) -> int:
    """The server's time in scripts so far (what an enqueue or a promotion is: one script each)."""
    stats = admin.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("usec", 0))


def _enqueue_round(pool: Pool, admin: redis.Redis, n: int) -> tuple[float, float]:
    """`n` single enqueues: jobs a second, server us each."""
    u0, t0 = _server_usec(admin), time.perf_counter()
    for _ in range(n):
        pool.enqueue(image="busybox", command=["true"])
    return n / (time.perf_counter() - t0), (_server_usec(admin) - u0) / n


def _promote_round(pool: Pool, admin: redis.Redis, n: int) -> tuple[float, float]:
    """`n` free slots (the stored limit raised, as bench/enqueue.py does: nothing promoted yet), then promoted
    into by `Pool.promote`: jobs a second, server us each."""
    _, limit = pool.slots()
    admin.hset(pool.keys.config, "max_concurrent_jobs", limit + n)
    u0, t0 = _server_usec(admin), time.perf_counter()
    done = 0
    while done < n:
        got = pool.promote()
        if not got:
            break
        done += got
    wall = time.perf_counter() - t0
    return done / wall, (_server_usec(admin) - u0) / max(1, done)


def memory_by_kind(admin: redis.Redis, pool: Pool, queued: int, sample: int = 200) -> dict[str, float]:
    """Bytes per queued job by kind of key (MEMORY USAGE): a job's row and RQ's hash of it (the mean of
    `sample` of each), and each of the pool's own keys shared by its `queued` jobs."""
    ids = [str(i) for i in admin.zrange(pool.keys.queued, 0, sample - 1)]
    out: dict[str, float] = {}
    for kind, key_of in (("row", pool.keys.job), ("RQ's hash", pool.keys.rq_job)):
        sizes = [admin.memory_usage(key_of(j), samples=0) or 0 for j in ids]
        out[kind] = statistics.mean(sizes) if sizes else 0.0
    for name in ("queued", "ready", "events"):
        key = getattr(pool.keys, name, None)
        if isinstance(key, str):
            out[f"{name} (shared)"] = (admin.memory_usage(key, samples=0) or 0) / queued
    return out


def part_deep(queued: int, rounds: int, per_round: int) -> dict[str, Any]:
    """Part 5: enqueue and promotion with `queued` jobs queued against an empty queue (same server,
    alternating), and Redis's memory per queued job."""
    with RedisServer() as rs:
        rs.start()
        admin = sr.admin(rs.url)
        admin.config_set(redispolicy.ROW_LISTPACK_SETTING, redispolicy.ROW_LISTPACK_VALUE)  # as `up` runs it
        deep = Pool.from_url(rs.url, "deep", max_concurrent_jobs=0)
        empty = Pool.from_url(rs.url, "shallow", max_concurrent_jobs=0)
        for p in (deep, empty):
            p.set_slots(0)
        mem0, t0 = int(admin.info("memory")["used_memory"]), time.perf_counter()
        batch = 10_000
        for start in range(0, queued, batch):
            deep.enqueue_many([{"image": "busybox", "command": ["true"]}] * min(batch, queued - start),
                              batch_size=1000)
        fill = time.perf_counter() - t0
        per_job = (int(admin.info("memory")["used_memory"]) - mem0) / queued
        kinds = memory_by_kind(admin, deep, queued)
        print(f"\n== part 5: a deep queue: {queued:,} jobs enqueued (enqueue_many, batches of 1000) in "
              f"{fill:.0f} s "
              f"({queued / fill:,.0f} jobs/s); Redis memory {per_job:,.0f} B per queued job "
              f"(goal <= 1024: {'met' if per_job <= 1024 else 'NOT met'}; rows as `jobpool up` keeps them); "
              "by kind of key (MEMORY USAGE): " + ", ".join(f"{k} {b:,.0f} B" for k, b in kinds.items()))
        rates: dict[str, dict[str, list[float]]] = {n: {"enq": [], "enq_us": [], "pro": [], "pro_us": []}
                                                    for n in ("deep", "empty")}
        for r in range(rounds):
            for name, pool in (("deep", deep), ("empty", empty)) if r % 2 == 0 else (("empty", empty),
                                                                                   ("deep", deep)):
                rate, us = _enqueue_round(pool, admin, per_round)
                rates[name]["enq"].append(rate)
                rates[name]["enq_us"].append(us)
                rate, us = _promote_round(pool, admin, per_round)
                rates[name]["pro"].append(rate)
                rates[name]["pro_us"].append(us)
        med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in rates.items()}
        enq_ratio = med["empty"]["enq"] / med["deep"]["enq"]
        pro_ratio = med["empty"]["pro"] / med["deep"]["pro"]
        for n in ("empty", "deep"):
            m = med[n]
            print(f"  {n:5} queue: Pool.enqueue {m['enq']:7.0f} jobs/s ({m['enq_us']:5.1f} us server each); "
                  f"promotion {m['pro']:7.0f} jobs/s ({m['pro_us']:5.1f} us server each)")
        print(f"  slowdown with {queued:,} queued (medians of {rounds} rounds of {per_round}): enqueue "
              f"{enq_ratio:.2f}x, promotion {pro_ratio:.2f}x (goal <= 1.2x: "
              f"{'met' if max(enq_ratio, pro_ratio) <= 1.2 else 'NOT met'}); server time per call: enqueue "
              f"{med['deep']['enq_us'] / med['empty']['enq_us']:.2f}x, promotion "
              f"{med['deep']['pro_us'] / med['empty']['pro_us']:.2f}x")
        return {"bytes_per_job": per_job, "fill_rate": queued / fill, "enqueue_ratio": enq_ratio,
                "promote_ratio": pro_ratio, **{f"{n}_{k}": v for n, d in med.items() for k, v in d.items()}}
