"""A daemon mark's period (scripts/daemon_mark_round.lua) as a steady fleet sends it, this tree against a
baseline tree, in the same run: Redis's CPU, the bytes it appends to its append-only file, and each call's
server time.

Ten processes on one daemon identity (a host's workers) each send their round at `--rate` rounds a second in
all, for `--secs`, against a private redis-server running with its append-only file synced every second (as
`jobpool up` and the compose files run it). Each tree's rounds are sent by a process of its own that imports
that tree's jobpool (`PYTHONPATH`), so the baseline is any checkout, `git archive` of a commit; the trees
alternate `--runs` times on the same server, flushed between runs. Printed per run: INFO cpu's used time as a
share of a core, `aof_current_size`'s growth per round, and SLOWLOG's median server time of a round (threshold
0, the scripts' own commands left out); then each figure's median for each tree and this tree's ratio to the
baseline's.

    python3 -m bench.mark_round --baseline DIR [--rate 200] [--secs 12] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import redis

HERE = Path(__file__).resolve()
PROCESSES = 10
TTL_MS, PERIOD_MS = 15_000, 5_000


def child(url: str, rate: float, secs: float) -> None:
    """Send the rounds (run with the tree under test first on `sys.path`)."""
    from jobpool import Pool
    from jobpool.fleet.markrecords import FIELDS, digest

    pool = Pool.from_url(url, max_concurrent_jobs=1)
    store = pool.store
    ids = [f"p{i}" for i in range(PROCESSES)]

    def fields(pid: str) -> list[tuple[str, str]]:
        values = {"role": "worker", "host": "h1", "pid": "1", "docker_host": "unix:///d.sock",
                  "daemon_id": "jpd1:" + "e" * 32 + "@boot-1", "mark": "jobpool-daemon-mark-" + pid,
                  "verified": " ".join(i for i in ids if i != pid), "collision": "", "process": "x"}
        values["v"] = digest(values)
        return [(name, values[name]) for name in FIELDS]

    known: dict[str, dict[str, str]] = {i: {} for i in ids}
    peers: dict[str, tuple[str, ...]] = {i: () for i in ids}
    for pid in ids:  # registered, and a first round each: every later round is a steady one
        store.daemon_mark(pid, TTL_MS, 10 * TTL_MS, fields(pid), PERIOD_MS)
    for pid in ids:
        got = store.daemon_mark_round(pid, TTL_MS, 10 * TTL_MS, fields(pid), PERIOD_MS, [])
        peers[pid] = tuple(i for i in got.ids if i != pid)
        known[pid] = {i: dict(fields(i))["v"] for i in peers[pid]}
    print("ready", flush=True)
    sys.stdin.readline()  # the parent reads its starting figures, then says go
    gap, start, n = 1.0 / rate, time.monotonic(), 0
    while time.monotonic() - start < secs:
        pid = ids[n % PROCESSES]
        store.daemon_mark_round(pid, TTL_MS, 10 * TTL_MS, fields(pid), PERIOD_MS,
                                [(i, known[pid][i]) for i in peers[pid]])
        n += 1
        time.sleep(max(0.0, start + n * gap - time.monotonic()))
    print(n, flush=True)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def one_run(admin: redis.Redis, url: str, tree: Path, rate: float, secs: float) -> dict[str, float]:
    admin.flushall()
    admin.slowlog_reset()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([sys.executable, str(HERE), "--child", url, str(rate), str(secs)], cwd=tree,
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit(f"the rounds of {tree} did not start")
    admin.slowlog_reset()
    cpu0, aof0, t0 = admin.info("cpu"), admin.info("persistence")["aof_current_size"], time.monotonic()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    rounds = int(proc.stdout.readline())
    cpu1, aof1, t1 = admin.info("cpu"), admin.info("persistence")["aof_current_size"], time.monotonic()
    proc.wait()
    used = sum(cpu1[k] - cpu0[k] for k in ("used_cpu_sys", "used_cpu_user"))
    calls = [e["duration"] for e in admin.slowlog_get(1_000_000)
             if _text(e.get("client_address", "")) != "?:0"  # a script's own command
             and _text(e["command"]).upper().startswith("EVALSHA")]
    return {"cpu %": 100 * used / (t1 - t0), "aof bytes a round": (aof1 - aof0) / rounds,
            "server us a round": statistics.median(calls) if calls else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="a tree to compare with (git archive of it)")
    ap.add_argument("--rate", type=float, default=200.0, help="rounds a second (1,000 workers: about 200)")
    ap.add_argument("--secs", type=float, default=12.0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE.parent.parent))
    from jobpool.store import redispolicy
    from tests.support.servers import RedisServer

    trees = {"baseline": args.baseline.resolve(), "this": HERE.parent.parent}
    got: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with RedisServer(extra_args=redispolicy.APPEND_ONLY_ARGS) as rs:  # as `jobpool up` runs it
        rs.start()
        admin = redis.Redis.from_url(rs.url)
        admin.config_set("slowlog-log-slower-than", 0)
        admin.config_set("slowlog-max-len", 1_000_000)
        for run in range(args.runs):
            for name, tree in trees.items():
                figures = one_run(admin, rs.url, tree, args.rate, args.secs)
                got[name].append(figures)
                print(f"run {run + 1} {name:8}  " + "  ".join(f"{k} {v:,.1f}" for k, v in figures.items()),
                      flush=True)
    print()
    for key in got["this"][0]:
        base = statistics.median(f[key] for f in got["baseline"])
        this = statistics.median(f[key] for f in got["this"])
        print(f"{key:18}  baseline {base:10,.1f}   this {this:10,.1f}   ratio {this / base:.2f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
    else:
        main()
