"""Memory: resident set size of a supervisor and of an idle worker, against baselines from the same run.

    python3 -m bench.memory

Baselines: a bare Python interpreter (`python -c` sleeping) and RQ's own idle `rq worker` on the same Redis.
Each process is measured (VmRSS from /proc) once it has settled: the supervisor after several sweeps over
200 running rows, the workers after they registered and sat idle. Printed in MiB and as ratios to RQ's worker.
An idle jobpool worker has one child, its standby horse (jobpool/workers/horses.py), forked from it and so
sharing most of its pages: it is printed on its own, and the pair's proportional set size (PSS: each shared
page counted once across them) is printed against RQ's worker's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from jobpool import Pool
from jobpool.workers.attempt import Attempt
from tests.support.procs import JobpoolProcess, children
from tests.support.servers import DockerDaemon, RedisServer


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def pss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no Pss for {pid}")


def settle(check: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit("memory: a process did not settle in time")
        time.sleep(0.1)


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="jobpool-mem-"))
    redis_server, daemon = RedisServer(), DockerDaemon()
    started: list[subprocess.Popen[bytes]] = []
    jp: list[JobpoolProcess] = []
    try:
        redis_server.start()
        daemon.start()
        env = {**os.environ, "JOBPOOL_REDIS_URL": redis_server.url, "JOBPOOL_POOL": "mem",
               "DOCKER_HOST": daemon.host, "JOBPOOL_SWEEP_INTERVAL_SECS": "0.5",
               "JOBPOOL_STATE_DIR": str(root)}
        pool = Pool.from_env(env=env)
        pool.set_slots(200)
        for _ in range(200):  # 200 running rows, owned by a live lease, for the supervisor to sweep
            job = pool.enqueue("jobpool-test:busybox", ["true"])
            Attempt(pool.store, job.id, "bench-boot", 1).claim()
        # claimed already: nothing for the worker, which stays idle
        pool.store.client.delete(pool.keys.rq_queue)
        bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(root / "rq.log", "wb") as rq_log:
            rq = subprocess.Popen(["rq", "worker", "--url", redis_server.url, "rq-baseline"],
                                  stdout=rq_log, stderr=subprocess.STDOUT)
        started += [bare, rq]
        sup = JobpoolProcess("jobpool.cli", env, root / "supervisor.log", ("supervisor",))
        wrk = JobpoolProcess("jobpool.cli", env, root / "worker.log", ("worker",))
        jp += [sup, wrk]
        settle(lambda: "Listening on rq-baseline" in (root / "rq.log").read_text())
        settle(lambda: pool.store.client.zcard(pool.keys.boots) == 1)
        sweeps: Callable[[], object] = lambda: (pool.store.client.get(pool.keys.last_sweep) or "")  # noqa: E731
        first = sweeps()
        settle(lambda: sweeps() and sweeps() != first)
        time.sleep(3)  # several more sweeps and idle heartbeats, so caches and pools have grown
        (standby,) = children(wrk.pid)
        figures = {"python (bare)": rss_mib(bare.pid), "rq worker (idle)": rss_mib(rq.pid),
                   "jobpool worker (idle)": rss_mib(wrk.pid),
                   "its standby horse": rss_mib(standby),
                   "jobpool supervisor (200 rows)": rss_mib(sup.pid)}
        base = figures["rq worker (idle)"]
        print("memory: VmRSS, MiB (ratio to RQ's idle worker)")
        for name, mib in figures.items():
            print(f"  {name:32s} {mib:6.1f}  ({mib / base:.2f}x)")
        pair, rq_pss = pss_mib(wrk.pid) + pss_mib(standby), pss_mib(rq.pid)
        print(f"  PSS: jobpool worker + standby {pair:.1f} MiB, rq worker {rq_pss:.1f} MiB "
              f"({pair / rq_pss:.2f}x)")
    finally:
        for p in jp:
            p.stop(timeout=15)
        for proc in started:
            proc.kill()
            proc.wait(10)
        daemon.close()
        redis_server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
