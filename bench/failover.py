"""Failure detection: SIGKILL a worker mid-job -> its slot is freed -> the next queued job starts.

    python3 -m bench.failover [--rounds 5] [--lease 3] [--sweep 2]

slots = 1, two workers, a supervisor; job A runs, job B waits. At t0 the worker running A is SIGKILLed with
its work horse and A's container is removed (a crashed host: nothing of A survives). The supervisor may free
A's slot only once A's lease has lapsed and a sweep has seen the container absent, so the bound is
lease + sweep interval (+ the time to start B). Printed: time from t0 to B's container start (the daemon's
own event time), median and max, and the ratio to that bound. A second figure is the live-orphan path: the
container is left running and a live worker adopts it (time from t0 to the `adopted` event).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import docker

from jobpool import Pool
from tests.support.procs import JobpoolProcess
from tests.support.servers import DockerDaemon, RedisServer

IMAGE = "jobpool-test:busybox"


T = TypeVar("T")


def _wait(pred: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.02)
    raise SystemExit(f"failover: timed out waiting for {what}")


def one_round(pool: Pool, client: docker.DockerClient, workers: list[JobpoolProcess], remove: bool) -> float:
    a = pool.enqueue(IMAGE, ["sh", "-c", "sleep 600"])
    b = pool.enqueue(IMAGE, ["sh", "-c", "sleep 600"])
    row = _wait(lambda: r if (r := pool.get(a.id)).container_id else None, 60, "A started")
    owner = next(w for w in workers if row.owner_boot and w.pid in _boot_pids(pool, row.owner_boot))
    since = int(time.time())
    t0 = time.time()
    owner.kill_with_children()
    if remove:
        client.containers.get(row.container_id).remove(force=True)
    if remove:
        events = client.events(decode=True, since=since, filters={"label": f"jobpool.job_id={b.id}",
                                                                   "event": "start"})
        try:
            ev = next(iter(events))
        finally:
            events.close()
        took: float = ev["timeNano"] / 1e9 - t0
    else:
        adopted = _wait(lambda: [e for e in pool.events(a.id) if e["reason"] == "adopted"], 60, "adoption")
        took = int(adopted[0]["at"]) / 1000 - t0
    # Clean up for the next round: both jobs cancelled, their containers gone, a fresh worker in place.
    workers[workers.index(owner)] = owner.respawn()
    for j in (a, b):
        if not pool.get(j.id).state.terminal:
            pool.cancel(j.id)
        pool.wait(j.id, timeout=60)
    _wait(lambda: not client.containers.list(all=True, sparse=True, filters={"label": "jobpool.pool=bench"}),
          60, "the round's containers removed by their workers")
    return took


def _boot_pids(pool: Pool, boot_id: str) -> set[int]:
    pid = pool.store.client.hget(pool.keys.boot(boot_id), "pid")
    return {int(pid)} if pid else set()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lease", type=float, default=3.0)
    ap.add_argument("--sweep", type=float, default=2.0)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="jobpool-failover-"))
    redis_server, daemon = RedisServer(), DockerDaemon()
    workers: list[JobpoolProcess] = []
    supervisor: JobpoolProcess | None = None
    try:
        redis_server.start()
        daemon.start()
        daemon.import_busybox_image(IMAGE)
        env = {**os.environ, "JOBPOOL_REDIS_URL": redis_server.url, "JOBPOOL_POOL": "bench",
               "DOCKER_HOST": daemon.host, "JOBPOOL_HEARTBEAT_SECS": str(args.lease / 4),
               "JOBPOOL_LEASE_SECS": str(args.lease), "JOBPOOL_SWEEP_INTERVAL_SECS": str(args.sweep),
               "JOBPOOL_RECOVERY_BUDGET": "0", "JOBPOOL_STOP_GRACE_SECS": "0", "JOBPOOL_STATE_DIR": str(root)}
        pool = Pool.from_env(env=env)
        pool.set_slots(1)
        workers += [JobpoolProcess("jobpool.cli", env, root / f"worker-{i}.log", ("worker",))
                    for i in range(2)]
        supervisor = JobpoolProcess("jobpool.cli", env, root / "supervisor.log", ("supervisor",))
        client = docker.DockerClient(base_url=daemon.host)
        results = {}
        for remove, name in ((True, "slot freed, next job started"), (False, "live orphan adopted")):
            took = [one_round(pool, client, workers, remove) for _ in range(args.rounds)]
            results[name] = took
        bound = args.lease + args.sweep
        print(f"failover: lease {args.lease:g}s + sweep interval {args.sweep:g}s = bound {bound:g}s, "
              f"{args.rounds} rounds each")
        for name, took in results.items():
            med = statistics.median(took)
            print(f"  {name:30s} median {med:.2f}s  max {max(took):.2f}s  median/bound {med / bound:.2f}")
        client.close()
    finally:
        for p in [*workers, supervisor]:
            if p is not None:
                p.stop(timeout=15)
        daemon.close()
        redis_server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
