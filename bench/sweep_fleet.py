"""Benchmark: the supervisor's sweep over a large fleet (10,000 and 100,000 running rows), against a baseline
tree in the same run.

The fleet is seeded through the scripts, as workers would leave it: every row enqueued, promoted, claimed by
a worker boot of its own and its container recorded (`set_container`); the rows spread over many Docker
daemons (`--per-daemon` rows each) whose inventories are in Redis, published by a worker on each
(`inventory_lead`, `publish_inventory`: jobpool/fleet/inventory.py), plus this host's real dockerd, the one
the supervisor asks. Most owners hold their lease; a few rows are orphans (`--orphans`, a fraction): their
owner's lease is gone and
- on another daemon whose inventory lists their container running: adoption requested, then pending;
- on this host's daemon, a real running labelled container: the same, from the one list call;
- on a daemon no worker publishes for (a host that went silent): unknown, the slot kept.
That is a steady state: sweeping it again changes nothing, so it is swept `--repeat` times per round.

Then the mass recovery: before each measured sweep, a fresh 1 % of the rows lose their lease and their
daemon's inventory says half of them exited 0 and lists the other half no more; that one sweep applies every
verdict (succeeded, failed: recovery budget 0).

Each tree sweeps in a process of its own (`PYTHONPATH` set to the tree; this one, and `--baseline DIR`, a
checkout of the code before, e.g. `git archive main | tar -x -C DIR`), both over the same Redis, daemon and
rows, alternating round by round; each child warms up with one sweep first. Figures: median wall and CPU ms
per sweep, daemon calls per sweep, the sweep's own phases, Redis's time per sweep (INFO commandstats, by
command) and the ratio baseline / this tree.

    python3 -m bench.sweep --fleet [--rows 10000,100000] [--baseline DIR] [--rounds 3] [--repeat 5]
    python3 -m bench.sweep --fleet --rows 10000 --profile   # cProfile of this tree's steady sweep
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import logging
import os
import pstats
import random
import statistics
import sys
import time
import uuid
from collections.abc import Set
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import redis

from jobpool import Pool, Settings
from jobpool.contract import LABEL_ATTEMPT, LABEL_BOOT, LABEL_JOB, LABEL_POOL
from jobpool.fleet.daemonid import PREFIX
from jobpool.fleet.inventory import FORGET_MS, RUNNING, Entry, encode
from jobpool.store import redispolicy
from jobpool.supervisor import ContainerProber, Supervisor
from jobpool.workers.attempt import Attempt
from tests.support.servers import DockerDaemon, RedisServer

from ._common import TreeChild
from .sweep import valid_daemon

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "jobpool-test:busybox"
POOL = "fleet"
#: Settings of every pool here: inventories that hold for the whole run, no budget (an absent row fails, so a
#: measured recovery promotes nothing into the freed slots). The seeding workers' leases hold for the whole
#: run (`SEED_LEASE_SECS`); the supervisors' lease (the time Redis's word needs to settle after redis-server
#: started, jobpool/redistrust.py, and how young an inventory must be to prove an absence) is the default.
SETTINGS: dict[str, Any] = {"heartbeat_secs": 1, "recovery_budget": 0,
                            "job_stale_seconds": 86400, "probe_timeout_secs": 30, "inventory_stale_secs": 600,
                            "claim_grace_secs": 3600}
SEED_LEASE_SECS = 3600
LEAD_MS = 3_600_000
#: What a child process runs: one warm-up sweep, then the parent's commands on stdin ("sweep N": N applied
#: sweeps, one JSON line back; "quit"). Only the API both trees have: Pool, Supervisor, ContainerProber.
CHILD = r"""
import json, logging, sys, time
logging.basicConfig(level=logging.ERROR)
from jobpool import Pool, Settings
from jobpool.supervisor import ContainerProber, Supervisor
cfg = json.loads(sys.argv[1])
pool = Pool.from_url(cfg["url"], cfg["pool"], **cfg["settings"])
prober = ContainerProber(cfg["docker_host"], timeout=30)
sup = Supervisor(pool.store, prober)
sup.sweep()
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] == "quit":
        break
    out = []
    for _ in range(int(cmd[1])):
        calls, t, cpu = prober.api_calls, time.perf_counter(), time.process_time()
        report = sup.sweep()
        out.append({"ms": (time.perf_counter() - t) * 1000, "cpu_ms": (time.process_time() - cpu) * 1000,
                    "calls": prober.api_calls - calls, "phases": report.phases_ms,
                    "verdicts": dict(report.verdicts), "rows": report.rows})
    print(json.dumps(out), flush=True)
sup.close()
"""


@dataclass
class Fleet:
    """The seeded rows: which daemon each is on, its boot and container, and which are orphans."""

    local_daemon: str
    daemons: list[str]
    silent: str
    rows: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # id -> (daemon, boot, container)
    orphans: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)  # ended by a mass recovery
    local_containers: list[str] = field(default_factory=list)


def identity() -> str:
    return f"{PREFIX}{uuid.uuid4().hex}@{uuid.uuid4()}"


def seed(pool: Pool, dclient: docker.DockerClient, local_daemon: str, n: int, per_daemon: int,
         orphans: float, local: int, rng: random.Random) -> Fleet:
    """`n` running rows as a fleet of workers leaves them (see the module's docstring)."""
    store = pool.store
    t = time.perf_counter()
    ids = [job.id for job in pool.enqueue_many(
        [{"image": IMAGE, "command": ["sleep", "3600"], "env": {"SHARD": str(i % 97)}} for i in range(n)],
        batch_size=1000)]
    while store.promote_all("bench"):
        pass
    store.client.delete(pool.keys.rq_queue)  # the workers took every delivery
    remote = [identity() for _ in range(max(1, n // per_daemon))]
    fleet = Fleet(local_daemon, remote, identity())
    n_orphans = max(3, round(n * orphans))
    n_silent = max(1, n_orphans // 4)
    for i, job_id in enumerate(ids):
        if i < local:
            daemon = local_daemon
        elif i < local + n_silent:
            daemon = fleet.silent
        else:
            daemon = remote[i % len(remote)]
        boot = f"boot-{i:06d}-{uuid.uuid4().hex[:8]}"  # one worker per running job, as in a real fleet
        fleet.rows[job_id] = (daemon, boot, uuid.uuid4().hex + uuid.uuid4().hex)

    def launch(job_id: str) -> None:
        daemon, boot, cid = fleet.rows[job_id]
        att = Attempt(store, job_id, boot, 1)
        att.claim("docker", daemon)
        if daemon == local_daemon:
            c = dclient.containers.run(IMAGE, ["sleep", "3600"], detach=True, network_mode="none", labels={
                LABEL_POOL: POOL, LABEL_JOB: job_id, LABEL_ATTEMPT: "1", LABEL_BOOT: boot})
            cid = str(c.id)
            fleet.rows[job_id] = (daemon, boot, cid)
            fleet.local_containers.append(cid)
        att.set_container(cid, daemon)

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(launch, ids))
    publish(pool, fleet)
    remote_rows = [j for j in ids[local + n_silent:]]
    fleet.orphans = set(ids[:local + n_silent]) | set(rng.sample(remote_rows, n_orphans - n_silent))
    store.client.delete(*[pool.keys.lease(j) for j in fleet.orphans])
    print(f"seeded {n} running rows on {len(remote)} daemons with inventories + this host's ({local} "
          f"containers) + 1 silent; {len(fleet.orphans)} orphans ({local} local, {n_silent} on the silent "
          f"daemon); in {time.perf_counter() - t:.1f} s", flush=True)
    return fleet


def publish(pool: Pool, fleet: Fleet, exited: Set[str] = frozenset(), absent: Set[str] = frozenset()) -> None:
    """Every remote daemon's inventory, as its publisher writes it: its rows' containers running, except
    `exited` (ended 0) and `absent` (not listed), and the rows recovered before (`fleet.gone`)."""
    store = pool.store
    by_daemon: dict[str, list[Entry]] = {d: [] for d in fleet.daemons}
    for job_id, (daemon, _, cid) in fleet.rows.items():
        if daemon in by_daemon and job_id not in absent and job_id not in fleet.gone:
            by_daemon[daemon].append(Entry(job_id, 1, "exited" if job_id in exited else RUNNING,
                                           0 if job_id in exited else None, cid))
    for daemon, entries in by_daemon.items():
        publisher = f"publisher-{daemon[-12:]}"
        store.inventory_lead(daemon, publisher, LEAD_MS)
        containers, complete = encode(entries)
        now = store.now_ms()
        store.publish_inventory(daemon, publisher, daemon.split("@", 1)[1], LEAD_MS, LEAD_MS, complete,
                                containers, FORGET_MS, now, "")


def recovery_set(pool: Pool, fleet: Fleet, share: float, rng: random.Random) -> tuple[set[str], set[str]]:
    """A fresh `share` of the leased remote rows loses its lease; half exited 0, half gone from their
    inventory (republished)."""
    leased = sorted(j for j, (d, _, _) in fleet.rows.items()
                    if d in fleet.daemons and j not in fleet.orphans and j not in fleet.gone)
    chosen = rng.sample(leased, max(2, round(len(fleet.rows) * share)))
    exited, absent = set(chosen[::2]), set(chosen[1::2])
    pool.store.client.delete(*[pool.keys.lease(j) for j in chosen])
    publish(pool, fleet, exited, absent)
    fleet.gone |= exited | absent
    return exited, absent


class Child(TreeChild):
    """A supervisor of one tree in a process of its own, swept on command."""

    def __init__(self, name: str, tree: Path, cfg: dict[str, Any]) -> None:
        super().__init__(name, tree, CHILD, cfg)
        assert self.hello["ready"]

    def sweep(self, n: int) -> list[dict[str, Any]]:
        return list(self.ask(f"sweep {n}"))


def commandstats(pool: Pool) -> dict[str, tuple[int, int]]:
    """Redis's (calls, usec) per command so far."""
    info = pool.store.client.info("commandstats")
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in info.items()}


def redis_cost(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
               sweeps: int) -> tuple[float, str]:
    """Redis's ms per sweep between two readings, and the commands that took it."""
    diff = {k: (c - before.get(k, (0, 0))[0], u - before.get(k, (0, 0))[1]) for k, (c, u) in after.items()}
    diff = {k: v for k, v in diff.items() if v[0] and k not in ("info",)}
    total = sum(u for _, u in diff.values()) / 1000 / sweeps
    top = sorted(diff.items(), key=lambda kv: -kv[1][1])[:6]
    return total, ", ".join(f"{k} {c / sweeps:g}x {u / 1000 / sweeps:.1f} ms" for k, (c, u) in top)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    phases = {k: statistics.median(r["phases"].get(k, 0) for r in runs) for k in runs[0]["phases"]}
    return {"ms": statistics.median(r["ms"] for r in runs),
            "cpu_ms": statistics.median(r["cpu_ms"] for r in runs),
            "calls": statistics.median(r["calls"] for r in runs), "phases": phases,
            "verdicts": runs[-1]["verdicts"], "rows": runs[-1]["rows"]}


def fmt(s: dict[str, Any]) -> str:
    phases = " ".join(f"{k} {v:.0f}" for k, v in s["phases"].items())
    return (f"{s['ms']:.1f} ms (CPU {s['cpu_ms']:.1f}), {s['calls']:g} daemon call(s); phases [{phases}]; "
            f"{1000 * s['ms'] / max(1, s['rows']):.1f} us a row")


def profile(pool: Pool, dd: DockerDaemon, repeat: int) -> None:
    """cProfile of this tree's steady sweep, in this process (the top functions, by own and by cumulative
    time), and Redis's time per sweep by command."""
    prober = ContainerProber(dd.host, timeout=30)
    sup = Supervisor(pool.store, prober)
    sup.sweep()
    prof = cProfile.Profile()
    before = commandstats(pool)
    prof.enable()
    for _ in range(repeat):
        sup.sweep()
    prof.disable()
    total, top = redis_cost(before, commandstats(pool), repeat)
    sup.close()
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(25)
        print(out.getvalue())
    print(f"Redis per sweep: {total:.1f} ms ({top})")


def run_size(rs: RedisServer, dd: DockerDaemon, dclient: docker.DockerClient, n: int,
             args: argparse.Namespace) -> dict[str, Any]:
    """Seed `n` rows, then measure (or profile) the trees on them; what each tree measured."""
    with contextlib.closing(redis.Redis.from_url(rs.url)) as r:
        r.flushall()  # the size before's rows
    rng = random.Random(n)
    pool = Pool.from_url(rs.url, POOL, max_concurrent_jobs=n, lease_secs=SEED_LEASE_SECS, **SETTINGS)
    local_daemon = ContainerProber(dd.host).daemon_id()
    fleet = seed(pool, dclient, local_daemon, n, args.per_daemon, args.orphans, args.local, rng)
    try:
        if args.profile:
            profile(pool, dd, args.repeat)
            return {}
        settle = Settings().lease_secs  # the children's lease: the default
        while int(pool.store.client.info("server")["uptime_in_seconds"]) <= settle:
            time.sleep(0.5)  # redis-server's word settles (jobpool/redistrust.py): absences are applied
        cfg = {"url": rs.url, "pool": POOL, "settings": {"max_concurrent_jobs": n, **SETTINGS},
               "docker_host": dd.host}
        trees = [("this tree", ROOT)] + ([("baseline", Path(args.baseline))] if args.baseline else [])
        children = [Child(name, tree, cfg) for name, tree in trees]
        try:
            out = measure(pool, fleet, children, args, rng)
        finally:
            for child in children:
                child.close()
        show(out, n, len(fleet.orphans), args)
        return out
    finally:
        pool.store.client.close()


def measure(pool: Pool, fleet: Fleet, children: list[Child], args: argparse.Namespace,
            rng: random.Random) -> dict[str, Any]:
    """The steady sweeps, then the recoveries, each tree in turn, the order alternating round by round."""
    steady: dict[str, list[dict[str, Any]]] = {c.name: [] for c in children}
    redis_ms: dict[str, list[float]] = {c.name: [] for c in children}
    redis_top: dict[str, str] = {}
    recovery: dict[str, list[dict[str, Any]]] = {c.name: [] for c in children}
    for rnd in range(args.rounds):
        for child in children if rnd % 2 == 0 else children[::-1]:
            publish(pool, fleet)  # the publishers' period: inventories stay fresh
            before = commandstats(pool)
            steady[child.name] += child.sweep(args.repeat)
            ms, redis_top[child.name] = redis_cost(before, commandstats(pool), args.repeat)
            redis_ms[child.name].append(ms)
    for rnd in range(args.rounds):
        for child in children if rnd % 2 == 0 else children[::-1]:
            exited, absent = recovery_set(pool, fleet, 0.01, rng)
            recovery[child.name] += child.sweep(1)
            states = pool.store.client.pipeline(transaction=False)
            for j in sorted(exited | absent):
                states.hget(pool.keys.job(j), "state")
            left = sum(s == "running" for s in states.execute())
            if left:
                print(f"  {child.name}: {left} of {len(exited | absent)} recovered rows still running!")
    return {name: {"steady": summarize(runs), "recovery": summarize(recovery[name]),
                   "redis_ms": statistics.median(redis_ms[name]), "redis_top": redis_top[name]}
            for name, runs in steady.items()}


def show(out: dict[str, Any], n: int, orphans: int, args: argparse.Namespace) -> None:
    print(f"\n{n} running rows ({orphans} orphans), {args.rounds} rounds of {args.repeat} steady sweeps "
          "each, alternating:")
    for name, res in out.items():
        s, r = res["steady"], res["recovery"]
        print(f"  {name:9}: steady {fmt(s)}; Redis {res['redis_ms']:.1f} ms a sweep ({res['redis_top']}); "
              f"verdicts {s['verdicts']}")
        print(f"  {'':9}  recovery of 1% ({r['verdicts']}): {fmt(r)}")
    if "baseline" in out:
        b, a = out["baseline"], out["this tree"]
        print(f"  baseline / this tree: steady {b['steady']['ms'] / a['steady']['ms']:.2f}x wall, "
              f"{b['steady']['cpu_ms'] / a['steady']['cpu_ms']:.2f}x CPU, Redis "
              f"{b['redis_ms'] / max(a['redis_ms'], 1e-9):.2f}x; recovery "
              f"{b['recovery']['ms'] / a['recovery']['ms']:.2f}x wall")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleet", action="store_true", help="(the flag bench.sweep hands this mode)")
    ap.add_argument("--rows", default="10000,100000", help="comma-separated fleet sizes")
    ap.add_argument("--per-daemon", type=int, default=100, help="rows per daemon")
    ap.add_argument("--orphans", type=float, default=0.005, help="share of rows whose owner's lease is gone")
    ap.add_argument("--local", type=int, default=5,
                    help="orphans with a real container on this host's daemon")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5, help="steady sweeps per round")
    ap.add_argument("--baseline", help="a checkout of the code to compare with (its root directory)")
    ap.add_argument("--profile", action="store_true", help="cProfile this tree's steady sweep instead")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    sizes = [int(s) for s in args.rows.split(",")]
    goals = {10_000: 150.0, 100_000: 1500.0}
    with RedisServer() as rs, valid_daemon() as dd:
        rs.start()
        with contextlib.closing(redis.Redis.from_url(rs.url)) as r:  # rows as `jobpool up` keeps them
            r.config_set(redispolicy.ROW_LISTPACK_SETTING, redispolicy.ROW_LISTPACK_VALUE)
        dd.start()
        dd.import_busybox_image(IMAGE)
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"load average at start: {load} on {os.cpu_count()} CPU(s)", flush=True)
        with contextlib.closing(dd.client(timeout=60)) as dclient:
            results = {}
            for n in sizes:
                results[n] = run_size(rs, dd, dclient, n, args)
                for c in dclient.containers.list(all=True, filters={"label": f"{LABEL_POOL}={POOL}"}):
                    c.remove(force=True)
        for n, res in results.items():
            if res and n in goals:
                ms = res["this tree"]["steady"]["ms"]
                print(f"goal, {n} rows: steady sweep <= {goals[n]:g} ms: {ms:.0f} ms, "
                      f"{'met' if ms <= goals[n] else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
