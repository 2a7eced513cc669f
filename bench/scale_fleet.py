"""bench/scale.py's parts about a large fleet: the supervisor's sweep over 10,000 and 100,000 running rows
(part 1), `status --json` and `/metrics` with 10,000 running jobs and 1,000 workers (part 4), an idle fleet's
load on Redis (part 3), and the check that a simulated worker makes the calls a real one makes (calibrate).

The fleet of parts 1 and 4 is seeded through the scripts, as workers leave it: 1,000 worker boot records
(`Boot.beat`), spread over `--daemons` Docker daemons (identities as jobpool/fleet/daemonid.py makes them);
every row enqueued (`Pool.enqueue_many`), promoted, claimed by one of the boots on its daemon and its
container recorded (`Attempt.claim`, `Attempt.set_container`); each daemon's inventory published by the real
publisher of one of its workers (workers/inventory.py `InventoryPublisher.tick`) over a stand-in for the
daemon listing those containers running (bench/scale_sim.py `StandInProber`). The supervisor is on the first
of those daemons: the rows there are judged from its own listing, one list call of the same stand-in (no
containers run: the issue's "no containers"), the others from the inventories.
Most owners hold their lease (seeded for an hour); `ORPHANS` of the rows have lost theirs while their
container runs on: the first sweep asks for their adoption, and the sweeps after find it pending. That is the
steady state: sweeping it again changes nothing.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import random
import statistics
import time
import urllib.request
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobpool import Pool
from jobpool.config import Settings
from jobpool.exporter import MetricsServer
from jobpool.store import redispolicy
from jobpool.supervisor import Supervisor
from jobpool.workers.attempt import Attempt
from jobpool.workers.boot import Boot
from jobpool.workers.routedqueue import routed_poll_secs
from tests.support.procs import JobpoolProcess
from tests.support.servers import DockerDaemon, RedisServer, free_port

from . import scale_redis as sr
from .scale_sim import SimFleet, SimPublisher, StandInProber, identity, summary

ROOT = Path(__file__).resolve().parents[1]
POOL = "fleet"
IMAGE = "jobpool-test:busybox"
#: The seeding workers' leases and boot records hold for the whole run.
SEED_LEASE_SECS = 3600
#: The share of rows whose owner's lease is gone (their containers run on: adoption requested, then pending).
ORPHANS = 0.005
#: Part 1's goals: a steady sweep's wall time (ms) by running rows.
SWEEP_GOAL_MS = {10_000: 150.0, 100_000: 1500.0}
#: Part 4's goal: the median of a scrape and of a status read (ms).
OBSERVE_GOAL_MS = 20.0
#: Part 3's goal: an idle fleet's Redis CPU, % of one core.
IDLE_GOAL_PCT = 5.0


@dataclass
class Fleet:
    """The seeded fleet: its daemons, its worker boots (boot i on daemon i % daemons) and running rows."""

    daemons: list[str]
    boots: list[Boot]
    rows: dict[str, tuple[int, str]] = field(default_factory=dict)  # job id -> (boot index, container id)
    publishers: list[SimPublisher] = field(default_factory=list)
    #: What the supervisor's own daemon (the first) lists: its one list call per sweep.
    local: StandInProber = field(default_factory=lambda: StandInProber(""))
    orphans: int = 0


def make_fleet(seed_pool: Pool, store_pool: Pool, workers: int, daemons: int, rng: random.Random) -> Fleet:
    """`workers` live boot records over `daemons` daemons, and one publisher per daemon (its first
    worker's)."""
    ids = [identity(rng) for _ in range(daemons)]
    boots = [Boot(seed_pool.store, "docker", ids[i % daemons]) for i in range(workers)]
    fleet = Fleet(ids, boots)
    for b in boots:
        b.beat()
    fleet.publishers = [SimPublisher(store_pool.store, boots[d].id, StandInProber(ids[d]))
                        for d in range(daemons)]
    fleet.local = StandInProber(ids[0])
    return fleet


def grow(pool: Pool, fleet: Fleet, n: int, rng: random.Random) -> float:
    """Running rows up to `n`, seeded through the scripts (see the module); the seconds it took."""
    t = time.perf_counter()
    have = len(fleet.rows)
    if n <= have:
        return 0.0
    store = pool.store
    pool.set_slots(n)
    jobs = pool.enqueue_many([{"image": IMAGE, "command": ["sleep", "3600"]} for _ in range(n - have)],
                             batch_size=1000)
    while store.promote_all("bench"):
        pass
    store.client.delete(pool.keys.rq_queue)  # the workers took every delivery
    new = {}
    for i, job in enumerate(jobs, start=have):
        new[job.id] = (i % len(fleet.boots), uuid.uuid4().hex + uuid.uuid4().hex)

    def launch(job_id: str) -> None:
        b, cid = new[job_id]
        boot = fleet.boots[b]
        daemon = str(boot.fields["daemon_id"])
        att = Attempt(store, job_id, boot.id, 1)
        att.claim("docker", daemon)
        att.set_container(cid, daemon)

    with ThreadPoolExecutor(6) as ex:
        list(ex.map(launch, new))
    fleet.rows.update(new)
    orphans = set(rng.sample(sorted(new), max(1, round(ORPHANS * len(new)))))
    local = sorted(j for j, (b, _) in new.items() if b % len(fleet.daemons) == 0)
    orphans |= set(local[:max(1, round(ORPHANS * len(local)))])  # some for the supervisor's own listing
    store.client.delete(*[pool.keys.lease(j) for j in orphans])  # their owner died; their containers run on
    fleet.orphans += len(orphans)
    by_daemon: dict[str, list[dict[str, Any]]] = {d: [] for d in fleet.daemons}
    for job_id, (b, cid) in fleet.rows.items():
        boot = fleet.boots[b]
        by_daemon[str(boot.fields["daemon_id"])].append(summary(POOL, job_id, boot.id, cid))
    for p in fleet.publishers:
        assert isinstance(p.prober, StandInProber)
        p.prober.containers = by_daemon[p.prober.identity]
    fleet.local.containers = by_daemon[fleet.local.identity]
    return time.perf_counter() - t


def publish(fleet: Fleet) -> None:
    """One period of every daemon's publisher (the real tick); each must publish."""
    for p in fleet.publishers:
        said = p.tick()
        if not said.startswith("published"):
            raise RuntimeError(f"inventory of {p.boot_id} not published: {said}")


def beat(fleet: Fleet) -> None:
    for b in fleet.boots:
        b.beat()


def _median_ms(fn: Any, repeat: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t) * 1000)
    return statistics.median(runs), sorted(runs)[int(0.9 * (len(runs) - 1))]


def _top_level_of(admin: Any, fn: Any) -> list[sr.Entry]:
    with sr.slowlog_all(admin, 1_000_000) as entries:
        fn()
    return sr.top_level(entries)


def observe(pool: Pool, admin: Any, server: MetricsServer, running: int, workers: int,
            repeat: int) -> dict[str, Any]:
    """Part 4 at one size: `status --json`'s work (`Pool.status`, to JSON) and a `/metrics` scrape over HTTP:
    top-level Redis commands of one call (SLOWLOG), median and p90 ms of `repeat` calls."""

    def status() -> None:
        json.dumps(pool.status().to_dict(), sort_keys=True)

    def scrape() -> None:
        with urllib.request.urlopen(server.url, timeout=60) as reply:
            reply.read()

    out: dict[str, Any] = {"running": running, "workers": workers}
    for name, fn in (("status", status), ("scrape", scrape)):
        fn()  # warm: connections, scripts
        top = _top_level_of(admin, fn)
        prof = sr.profile(top, sr.script_names(), sr.label_key)
        med, p90 = _median_ms(fn, repeat)
        out[name] = {"commands": len(top), "server_us": sum(e.usec for e in top), "ms": med, "p90": p90,
                     "top": list(prof.items())[:5]}
        most = ", ".join(f"{k} {c}x {u / 1000:.1f} ms" for k, (c, u) in list(prof.items())[:4])
        print(f"  {name:6} with {running:>6,} running jobs, {workers} workers: {len(top):5d} Redis commands "
              f"({sum(e.usec for e in top) / 1000:.1f} ms of server time), median {med:6.1f} ms, p90 "
              f"{p90:6.1f} ms; most: {most}")
    return out


def sweep_size(sup: Supervisor, fleet: Fleet, admin: Any, n: int, rounds: int, repeat: int,
               profile: bool) -> dict[str, Any]:
    """Part 1 at one size: `rounds` x `repeat` steady sweeps (inventories published before each round)."""
    prober = sup.prober
    publish(fleet)
    sup.sweep()  # warm
    runs: list[dict[str, Any]] = []
    for _ in range(rounds):
        publish(fleet)
        for _ in range(repeat):
            calls, lists = prober.api_calls, prober.list_calls
            t, cpu = time.perf_counter(), time.process_time()
            report = sup.sweep()
            runs.append({"ms": (time.perf_counter() - t) * 1000, "cpu": (time.process_time() - cpu) * 1000,
                         "calls": prober.api_calls - calls, "lists": prober.list_calls - lists,
                         "phases": dict(report.phases_ms or {}), "verdicts": dict(report.verdicts),
                         "rows": report.rows})
    publish(fleet)
    top = _top_level_of(admin, sup.sweep)
    names = sr.script_names()
    prof = sr.profile(top, names, sr.label_key)
    med = statistics.median(r["ms"] for r in runs)
    phases = {k: statistics.median(r["phases"].get(k, 0.0) for r in runs) for k in runs[0]["phases"]}
    res = {"rows": n, "ms": med, "cpu": statistics.median(r["cpu"] for r in runs),
           "calls": statistics.median(r["calls"] for r in runs),
           "lists": statistics.median(r["lists"] for r in runs),
           "phases": phases, "verdicts": runs[-1]["verdicts"], "redis_commands": len(top),
           "redis_ms": sum(e.usec for e in top) / 1000, "us_per_row": 1000 * med / n,
           "longest_ms": max((e.usec for e in top), default=0) / 1000}
    goal = SWEEP_GOAL_MS.get(n)
    print(f"  {n:>7,} rows: steady sweep median {med:7.1f} ms (process CPU {res['cpu']:.1f} ms), "
          f"{res['us_per_row']:.1f} us a row; daemon calls per sweep {res['calls']:g} (list calls "
          f"{res['lists']:g}); phases " + " ".join(f"{k} {v:.0f}" for k, v in phases.items())
          + f"; verdicts {res['verdicts']}" + (f"; goal <= {goal:g} ms: {'met' if med <= goal else 'NOT met'}"
                                               if goal else ""))
    print(f"    Redis per sweep: {len(top)} top-level commands, {res['redis_ms']:.1f} ms of server time, the "
          f"longest command {res['longest_ms']:.1f} ms: "
          + ", ".join(f"{k} {c}x {u / 1000:.1f} ms" for k, (c, u) in list(prof.items())[:6]))
    if profile:
        prof_c = cProfile.Profile()
        prof_c.enable()
        sup.sweep()
        prof_c.disable()
        buf = io.StringIO()
        pstats.Stats(prof_c, stream=buf).sort_stats("tottime").print_stats(14)
        lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
        start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
        print(f"    cProfile of one sweep ({n:,} rows), by own time:")
        print("\n".join("      " + ln for ln in lines[start:start + 15]))
    return res


def part_fleet(sweep_sizes: Sequence[int], observe_sizes: Sequence[int], workers: int,
               daemons: int, rounds: int, repeat: int, obs_repeat: int, profile: bool) -> dict[str, Any]:
    """Parts 1 and 4 on one seeded fleet, growing: each observed and swept size in turn."""
    results: dict[str, Any] = {"sweep": {}, "observe": {}}
    with RedisServer() as rs:
        rs.start()
        admin = sr.admin(rs.url)
        admin.config_set(redispolicy.ROW_LISTPACK_SETTING, redispolicy.ROW_LISTPACK_VALUE)  # as `up` runs it
        seed_pool = Pool.from_url(rs.url, POOL, max_concurrent_jobs=1, lease_secs=SEED_LEASE_SECS,
                                  heartbeat_secs=SEED_LEASE_SECS / 10)
        settings = Settings(redis_url=rs.url, pool=POOL, metrics_port=free_port())
        pool = Pool.from_settings(settings)
        fleet = make_fleet(seed_pool, pool, workers, daemons, random.Random(27))
        server = MetricsServer(settings)
        sup = Supervisor(pool.store, fleet.local)
        rng = random.Random(28)
        try:
            for n in sorted(set(sweep_sizes) | set(observe_sizes)):
                took = grow(seed_pool, fleet, n, rng)
                print(f"seeded {n:,} running rows on {daemons} daemons, {workers} workers, {fleet.orphans} "
                      f"of them orphans ({took:.0f} s; load {os.getloadavg()[0]:.1f})", flush=True)
                publish(fleet)
                if n in observe_sizes:
                    beat(fleet)
                    results["observe"][n] = observe(pool, admin, server, n, workers, obs_repeat)
                if n in sweep_sizes:
                    results["sweep"][n] = sweep_size(sup, fleet, admin, n, rounds, repeat, profile)
        finally:
            sup.close()
            server.close()
            pool.close()
            seed_pool.close()
    return results


# ---- part 3: an idle fleet ----------------------------------------------------------------------------


def part_idle(workers: int, daemons: int, procs: int, warm: float, window: float,
              appendonly: bool = False) -> dict[str, Any]:
    """`workers` simulated idle workers over `daemons` daemons (bench/scale_sim.py): Redis's CPU over `window`
    seconds, its commands, and one short SLOWLOG sample for what took the time. `appendonly`: Redis keeps its
    append-only file (every second), as `jobpool up` and the compose files run it."""
    # As `jobpool up` runs it (tests/support/servers.py's own append-only file syncs each write).
    with RedisServer(extra_args=redispolicy.APPEND_ONLY_ARGS if appendonly else ()) as rs:
        rs.start()
        admin = sr.admin(rs.url)
        rng = random.Random(3)
        fleet = SimFleet(rs.url, "idle", workers, [identity(rng) for _ in range(daemons)], procs)
        settings = Settings(redis_url=rs.url, pool="idle")
        try:
            t = time.perf_counter()
            fleet.start()
            print(f"  {workers} simulated workers registered in {time.perf_counter() - t:.1f} s "
                  f"({fleet.procs} processes)", flush=True)
            sample = 2.0
            run_secs = warm + window + sample + 3
            fleet.go(run_secs)
            time.sleep(warm)
            cpu0, st0, t0 = sr.cpu_secs(admin), sr.commandstats(admin), time.monotonic()
            time.sleep(window)
            cpu1, st1, t1 = sr.cpu_secs(admin), sr.commandstats(admin), time.monotonic()
            with sr.slowlog_all(admin, 2_000_000) as entries:
                time.sleep(sample)
            fleet.wait()
        finally:
            fleet.close()
        secs = t1 - t0
        pct = 100 * (cpu1 - cpu0) / secs
        delta = sr.stats_delta(st0, st1)
        got_polls = delta.get("blmove", (0, 0))[0] / secs
        top = sr.top_level(entries)
        names = sr.script_names()
        prof = sr.profile(top, names, sr.label_key)
        cmd_us = sum(u for _, u in prof.values()) / sample
        marks_us = sum(u for k, (_, u) in prof.items()
                       if k.startswith(("HGETALL daemon_mark:", "ZRANGE daemon_marks", "HMGET daemon_mark:",
                                        "script daemon_mark"))) / sample
        summary_ = fleet.summary()
        # Whether the simulation kept the pace: the mark rounds done (each a worker's period: its mark's
        # refresh and its peers' reads in one script) against those due over the whole run.
        want_rounds = fleet.expected(run_secs, settings)["mark round"]
        got_rounds = summary_["done"].get("mark round", 0)
    print(f"  Redis CPU {pct:.1f} % of one core over {secs:.0f} s (goal <= {IDLE_GOAL_PCT:g} %: "
          f"{'met' if pct <= IDLE_GOAL_PCT else 'NOT met'}); {sr.calls_of(delta) / secs:,.0f} commands/s "
          f"(scripts' own calls included)")
    print(f"  rates reached: mark rounds {got_rounds:,.0f} of {want_rounds:,.0f} due "
          f"({100 * got_rounds / want_rounds:.0f} %), dequeue polls {got_polls:,.0f}/s of "
          f"{workers / routed_poll_secs(settings.heartbeat_secs):,.0f}/s; "
          f"periodic calls done {summary_['done']}, failed {summary_['failed']}, p99 lateness "
          f"{summary_['lag_ms_p99']:.0f} ms")
    print(f"  top-level command time in a {sample:g} s SLOWLOG sample: {cmd_us / 1000:.0f} ms a second "
          f"({cmd_us / 10_000:.1f} % of a core), by command:")
    print(sr.show_profile(prof, sample, "second", top=10))
    hb = settings.heartbeat_secs
    print(f"  the daemon marks (each worker refreshes its record and reads its identity's index and its "
          f"processes' records each {hb:g} s, in one script; one process a period reads the pool-wide index "
          f"and one field of each record) take {100 * marks_us / max(cmd_us, 1):.0f} % of that time; "
          f"the rest is {(cmd_us - marks_us) / 1000:.0f} ms a second, "
          f"{(cmd_us - marks_us) * hb / workers:.0f} us per worker per {hb:g} s")
    split = sr.script_split(entries, names)
    if split:
        print("  jobpool's scripts in that sample:")
        print(sr.show_scripts(split))
    reach = got_rounds / want_rounds if want_rounds else 1.0
    return {"cpu_pct": pct, "cpu_pct_at_full_rate": pct / reach if reach < 0.95 else pct, "reach": reach,
            "commands_per_s": sr.calls_of(delta) / secs, "profile": list(prof.items())[:8],
            "command_ms_per_s": cmd_us / 1000, "marks_share": marks_us / max(cmd_us, 1),
            "rest_us_per_worker_period": (cmd_us - marks_us) * hb / workers}


# ---- calibration: a simulated worker against a real one ------------------------------------------------


def calibrate(dd: DockerDaemon, window: float, work: Path) -> dict[str, Any]:
    """One real idle Docker worker (`python -m jobpool.workers`), then one simulated worker, each alone on the
    same private redis-server for `window` seconds from 5 s after its start: their calls a minute side by side
    (commandstats, scripts named from SLOWLOG)."""
    per_min: dict[str, dict[str, float]] = {}
    with RedisServer() as rs:
        rs.start()
        admin = sr.admin(rs.url)
        names = sr.script_names()

        def measure(what: str) -> None:
            st0 = sr.commandstats(admin)
            with sr.slowlog_all(admin, 1_000_000) as entries:
                time.sleep(window)
            delta = sr.stats_delta(st0, sr.commandstats(admin))
            rates = {k: c * 60 / window for k, (c, _) in delta.items()
                     if k not in ("evalsha", "slowlog|reset", "slowlog|get", "config|set", "config|get")}
            for label, (c, _) in sr.profile(sr.top_level(entries), names).items():
                if label.startswith("script "):
                    rates[label] = c * 60 / window
            per_min[what] = rates

        env = {"JOBPOOL_REDIS_URL": rs.url, "JOBPOOL_POOL": "cal", "JOBPOOL_EXECUTOR": "docker",
               "DOCKER_HOST": dd.host, "JOBPOOL_STATE_DIR": str(work / "state"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
        real = JobpoolProcess("jobpool.workers", env, work / "calibrate-worker.log")
        try:
            pool = Pool.from_url(rs.url, "cal")
            deadline = time.monotonic() + 60
            while pool.store.client.zcard(pool.keys.boots) < 1:
                if time.monotonic() > deadline or real.proc.poll() is not None:
                    raise RuntimeError(f"the real worker did not start:\n{real.log()[-2000:]}")
                time.sleep(0.1)
            time.sleep(5)
            measure("real worker")
        finally:
            real.stop(timeout=20)
        sim = SimFleet(rs.url, "cal-sim", 1, [identity(random.Random(5))], 1)
        try:
            sim.start()
            sim.go(window + 8)
            time.sleep(5)
            measure("simulated")
            sim.wait()
        finally:
            sim.close()
    labels = sorted(set(per_min["real worker"]) | set(per_min["simulated"]))
    print(f"  calls a minute of one idle worker alone, measured over {window:g} s (commandstats: a script's "
          "own calls counted too; scripts by name from SLOWLOG):")
    off = []
    for label in labels:
        a, b = per_min["real worker"].get(label, 0.0), per_min["simulated"].get(label, 0.0)
        mark = "" if abs(a - b) <= max(2.0, 0.25 * max(a, b)) else "   <- differs"
        if mark:
            off.append(label)
        print(f"    {label:<28} real {a:7.1f}   simulated {b:7.1f}{mark}")
    print(f"  {'every call matches' if not off else 'differ: ' + ', '.join(off)}")
    return {"differs": off, "per_min": per_min}

