"""Live logs: what a job's output costs its worker and Redis, against a job that prints nothing, in one run.

    python3 -m bench.livelog [--secs 10]

One worker at the default settings (heartbeat 5 s) on a private redis-server and dockerd runs, one at a time,
jobs of `--secs` seconds each:

- quiet: `sleep`, the baseline;
- flood: `yes` with a 60-byte line, as fast as the job, Docker's json-file log and the machine allow, read
  by a follower the whole time (a thread of this process following it through Redis, as `jobpool logs -f`
  does);
- chatty, unread: a line every 0.1 s, nobody reading the log;
- chatty, read: the same, followed.

For each: the worker's CPU (its process and its horses, from /proc), Redis's CPU (INFO cpu) and its
appends to the live log (its stream's entries added) and the time of each (INFO commandstats of EVALSHA, less
the quiet job's, shared among them), what Docker stored of
the job's output (its json-file log) against what reached Redis, and the longest gap between two of the
row's heartbeats. Ratios are against the quiet job of the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench._common import IMAGE, bed, cpu_secs, loadavg
from jobpool import JobState, Pool
from jobpool.livelogs import pieces

LINE = "x" * 59


@dataclass
class Run:
    name: str
    worker_cpu: float
    redis_cpu: float
    appends: int
    evalsha_usec: int
    docker_bytes: int
    sent_bytes: int
    lines: int
    beat_gap: float


def redis_cpu(pool: Pool) -> float:
    info = pool.store.client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def evalsha(pool: Pool) -> tuple[int, int]:
    stats = pool.store.client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def run(pool: Pool, worker_pid: int, name: str, command: str, follow: bool, secs: float,
        log_sizes: dict[str, int]) -> Run:
    cpu0, rcpu0, usec0 = cpu_secs(worker_pid), redis_cpu(pool), evalsha(pool)[1]
    job = pool.enqueue(IMAGE, ["sh", "-c", command])
    lines: list[str] = []
    reader = None
    if follow:
        reader = threading.Thread(target=lambda: lines.extend(pool.logs(job.id, follow=True)), daemon=True)
        reader.start()
    beats: list[int] = []
    deadline = time.monotonic() + secs + 120
    while (row := pool.get(job.id)).state is not JobState.SUCCEEDED:
        if row.heartbeat_at and (not beats or beats[-1] != row.heartbeat_at):
            beats.append(row.heartbeat_at)
        if row.state.terminal or time.monotonic() > deadline:
            raise RuntimeError(f"{name}: job ended {row.state} ({row.error_reason})")
        time.sleep(0.05)
    if reader is not None:
        reader.join(30)
    time.sleep(1)  # its horse reaped, its CPU counted in the worker's children
    usec = evalsha(pool)[1]
    sent = pieces(pool.store.log_after(job.id, 0, 100_000))
    key = pool.keys.job_log(job.id)
    client = pool.store.client
    appends = int(client.xinfo_stream(key)["entries-added"]) if client.exists(key) else 0
    return Run(name, cpu_secs(worker_pid) - cpu0, redis_cpu(pool) - rcpu0, appends, usec - usec0,
               log_sizes.get(job.id, 0), sent[-1].end if sent else 0, len(lines),
               max((b - a for a, b in itertools.pairwise(beats)), default=0) / 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--secs", type=float, default=10.0)
    args = parser.parse_args()
    secs = args.secs
    with bed("livelog") as b:
        pool = b.pool(1)
        b.start_workers(1, pool)
        pid = b.workers[0].pid
        client = b.client()
        watcher = threading.Event()
        paths: dict[str, str] = {}
        sizes: dict[str, int] = {}

        def record_log_sizes() -> None:  # Docker's json-file log of each job, its size while it exists
            while not watcher.is_set():
                for c in client.api.containers(all=True, filters={"label": "jobpool.job_id"}):
                    job_id = c["Labels"]["jobpool.job_id"]
                    with contextlib.suppress(Exception):
                        paths.setdefault(job_id, client.api.inspect_container(c["Id"])["LogPath"])
                        sizes[job_id] = max(sizes.get(job_id, 0), Path(paths[job_id]).stat().st_size)
                time.sleep(0.1)
        threading.Thread(target=record_log_sizes, daemon=True).start()
        n = int(secs * 10)
        chatty = f'i=0; while [ $i -lt {n} ]; do i=$((i+1)); echo "line $i {LINE}"; sleep 0.1; done'
        runs = [run(pool, pid, "quiet", f"sleep {secs:g}", False, secs, sizes),
                run(pool, pid, "flood, read", f"timeout {secs:g} yes {LINE} || true", True, secs, sizes),
                run(pool, pid, "chatty, unread", chatty, False, secs, sizes),
                run(pool, pid, "chatty, read", chatty, True, secs, sizes)]
        watcher.set()
    base = runs[0]
    print(f"live logs, {secs:g} s jobs, default settings; load {loadavg()}; {os.cpu_count()} CPUs")
    print(f"{'job':16} {'worker CPU s':>12} {'x quiet':>8} {'Redis CPU s':>11} {'x quiet':>8} "
          f"{'appends':>7} {'append us':>9} {'Docker log B':>13} {'sent B':>9} {'lines read':>10} "
          f"{'max beat gap s':>14}")
    for r in runs:
        print(f"{r.name:16} {r.worker_cpu:12.2f} {r.worker_cpu / base.worker_cpu:8.2f} {r.redis_cpu:11.2f} "
              f"{r.redis_cpu / max(base.redis_cpu, 0.01):8.2f} {r.appends:7d} "
              f"{(r.evalsha_usec - base.evalsha_usec) / max(r.appends, 1):9.1f} {r.docker_bytes:13,d} "
              f"{r.sent_bytes:9,d} {r.lines:10,d} {r.beat_gap:14.2f}")


if __name__ == "__main__":
    main()
