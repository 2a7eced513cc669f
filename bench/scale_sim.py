"""Simulated workers for bench/scale.py: many idle jobpool workers in a few processes, each making the Redis
calls a real idle Docker worker makes, at the default periods (jobpool/config.py).

What one idle worker sends (read from jobpool/workers/__init__.py `run_worker` and the threads it starts, and
checked against a real worker by `bench.scale --parts calibrate`):

- its boot record, every `heartbeat_secs` (workers/boot.py `Boot.beat`: one MULTI of four commands): the real
  `Boot.beat`;
- its daemon mark's round, every `heartbeat_secs` (fleet/daemonmark.py `Marker._round`): its own record
  refreshed, then its identity's index of marks, the records of the processes there and the standing
  collision on its daemon read, in one script (scripts/daemon_mark_round.lua; a process new to the index
  read apart), which gives one process a period the turn to index records of an earlier release
  (`index_unindexed`: the pool-wide index and one HMGET per record): through the real Marker;
- its inventory publisher's period, every `inventory_secs` (workers/inventory.py `InventoryPublisher.tick`):
  the real `tick`, with a stand-in for the Docker daemon it lists (`StandInProber`: the daemon's identity and
  the containers it is given, no calls); the first worker of a daemon to ask holds the lead and publishes,
  the others follow;
- its RQ dequeue loop (workers/routedqueue.py `RoutedQueue._dequeue_routed`): an LMOVE of its daemon's queue,
  then rounds of a BLMOVE of the pool's queue blocking at most a round (`routed_poll_secs`) and, in the same
  round trip, an LMOVE of its daemon's queue again; sent on a lean asyncio connection per worker, as those are
  the most frequent calls of all.

Left out, being rarer than once a minute per worker: RQ's worker heartbeat (every 405 s, between two dequeue
timeouts), RQ's registry maintenance (every 10 min), the publisher's look for leftover checkpoint volumes
(every 5 min) and the mark sweep's look for marks of gone processes (every minute, Docker calls only).

    python3 -m bench.scale_sim CONFIG_JSON     # one child process; bench/scale.py starts them
"""

from __future__ import annotations

import asyncio
import heapq
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import hiredis
from rq.intermediate_queue import IntermediateQueue

from jobpool.config import Settings
from jobpool.contract import LABEL_ATTEMPT, LABEL_BOOT, LABEL_JOB, LABEL_POOL
from jobpool.fleet import daemonmark
from jobpool.fleet.daemonid import PREFIX
from jobpool.store.calls import Store
from jobpool.supervisor.probes import ContainerProber
from jobpool.workers.boot import Boot
from jobpool.workers.inventory import InventoryPublisher
from jobpool.workers.routedqueue import routed_poll_secs

ROOT = Path(__file__).resolve().parents[1]


def identity(rng: random.Random) -> str:
    """A daemon identity as jobpool/fleet/daemonid.py makes them (its uuid, then its host's kernel boot
    id)."""
    return f"{PREFIX}{uuid.UUID(int=rng.getrandbits(128)).hex}@{uuid.UUID(int=rng.getrandbits(128))}"


def encode(*args: Any) -> bytes:
    """One command in Redis's protocol (RESP), as every client sends it."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def summary(pool: str, job_id: str, boot: str, container_id: str) -> dict[str, Any]:
    """A running container as the Docker API's sparse list shows it (what `ContainerProber.list_pool`
    returns)."""
    return {"Id": container_id, "State": "running", "Status": "Up 5 minutes", "Created": int(time.time()),
            "Labels": {LABEL_POOL: pool, LABEL_JOB: job_id, LABEL_ATTEMPT: "1", LABEL_BOOT: boot}}


class _NoDaemonApi:
    """What the publisher's look for leftover checkpoint volumes reads of its daemon: nothing there."""

    def containers(self, **_: Any) -> list[Any]:
        return []

    def volumes(self, **_: Any) -> dict[str, Any]:
        return {"Volumes": []}


class _NoDaemon:
    api = _NoDaemonApi()


class StandInProber(ContainerProber):
    """A simulated host's Docker daemon as its publisher sees it: its identity and the containers it is given;
    no Docker call is made (there is no daemon)."""

    def __init__(self, daemon: str, containers: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(None, timeout=1)
        self.identity = daemon
        self.containers = [dict(c) for c in containers]

    def daemon_id(self) -> str:
        return self.identity

    def list_pool(self, pool: str) -> list[dict[str, Any]]:
        self.list_calls += 1
        self.api_calls += 1  # what the daemon would have been asked: one list call
        return list(self.containers)

    def client(self) -> Any:
        return _NoDaemon()

    def close(self) -> None:
        pass


class SimPublisher(InventoryPublisher):
    """The real publisher, its daemon a stand-in (its stray stopper's too)."""

    def new_prober(self) -> ContainerProber:
        assert isinstance(self.prober, StandInProber)
        return StandInProber(self.prober.identity, self.prober.containers)


class SimWorker:
    """One idle worker's Redis side: its boot, its mark record and its inventory publisher."""

    def __init__(self, store: Store, daemon: str, peers_on_daemon: Callable[[], Sequence[str]],
                 containers: Sequence[Mapping[str, Any]] = ()) -> None:
        self.store = store
        self.daemon = daemon
        self.boot = Boot(store, "docker", daemon)
        self.id = self.boot.id
        self.publisher = SimPublisher(store, self.boot.id, StandInProber(daemon, containers))
        self.publisher.on_earlier_boot = lambda _identity: None  # a worker listens on those queues
        self.peers_on_daemon = peers_on_daemon
        # The worker's real Marker, its Docker side left out (listing and making marks: no Redis calls).
        self.marker = daemonmark.Marker(store, "worker", self.id, docker_host="unix:///var/run/docker.sock")
        self.marker.daemon_id = daemon

    def register(self) -> None:
        """What `run_worker` writes first: its mark record, then its boot record."""
        self.marker._register()
        self.boot.beat()

    def tick(self) -> None:
        self.publisher.tick()

    def mark_round(self) -> None:
        """`Marker._round`'s Redis calls: its record refreshed and its identity's records and standing
        collision read (one script), and its record written again when its `verified` (the other processes
        on its daemon, whose marks it found there) changed."""
        self.marker._refresh_and_read(self.daemon)
        verified = frozenset(p for p in self.peers_on_daemon() if p != self.id)
        if verified != self.marker._verified:
            self.marker._verified = verified
            self.marker._register()


async def poll(host: str, port: int, queues: Sequence[str], end: float, counts: Counter[str],
               block_secs: int) -> None:
    """One worker's RQ dequeue loop, idle: LMOVE of each queue but the last, then rounds of a BLMOVE of the
    last for at most `block_secs` with those LMOVEs again in the same round trip (workers/routedqueue.py
    `RoutedQueue._dequeue_routed` and `RoutedQueue.lmove`), until `end` (epoch seconds)."""
    reader, writer = await asyncio.open_connection(host, port)
    parser = hiredis.Reader()
    looks = [encode("LMOVE", q, IntermediateQueue.get_intermediate_queue_key(q), "LEFT", "RIGHT")
             for q in queues[:-1]]
    last = queues[-1]
    block = [encode("BLMOVE", last, IntermediateQueue.get_intermediate_queue_key(last), "LEFT", "RIGHT",
                    block_secs), *looks]

    async def reply() -> Any:
        while True:
            got = parser.gets()
            if got is not False:
                return got
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("redis closed the connection")
            parser.feed(data)

    # Each worker's rounds start at a phase of their own, as a fleet's workers do (started at once, every
    # worker's BLMOVE would time out in the same instant).
    await asyncio.sleep(random.uniform(0, block_secs))
    try:
        for command in looks:
            writer.write(command)
            await reply()
        while time.time() < end:
            writer.write(b"".join(block))
            for _ in block:
                await reply()
            counts["poll rounds"] += 1
    finally:
        writer.close()


def run_pollers(host: str, port: int, queues: Sequence[Sequence[str]], end: float,
                counts: Counter[str], block_secs: int) -> None:
    async def main() -> None:
        await asyncio.gather(*(poll(host, port, q, end, counts, block_secs) for q in queues))

    asyncio.run(main())


class Scheduler:
    """Periodic tasks, each run `period` after its last run ended (as the workers' threads wait between runs),
    on a few threads; counts what ran and how late."""

    def __init__(self, threads: int) -> None:
        self.heap: list[tuple[float, int, str, Callable[[], None], float]] = []
        self.lock = threading.Lock()
        self.seq = 0
        self.done: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.lag: list[float] = []
        self.pool = ThreadPoolExecutor(threads)

    def add(self, due: float, kind: str, task: Callable[[], None], period: float) -> None:
        with self.lock:
            self.seq += 1
            heapq.heappush(self.heap, (due, self.seq, kind, task, period))

    def _run(self, due: float, kind: str, task: Callable[[], None], period: float) -> None:
        self.lag.append(time.time() - due)
        try:
            task()
            self.done[kind] += 1
        except Exception:  # noqa: BLE001 - counted: a simulation that fails calls shows it in its figures
            self.failed[kind] += 1
        self.add(time.time() + period, kind, task, period)

    def run_until(self, end: float) -> None:
        while time.time() < end:
            with self.lock:
                due = self.heap[0][0] if self.heap else end
                ready = []
                while self.heap and self.heap[0][0] <= time.time():
                    ready.append(heapq.heappop(self.heap))
            for d, _, kind, task, period in ready:
                self.pool.submit(self._run, d, kind, task, period)
            time.sleep(max(0.0, min(0.02, due - time.time())))
        self.pool.shutdown(wait=True)


def child(cfg: Mapping[str, Any]) -> None:
    """One simulating process: its share of the workers (cfg: url, pool, daemons, workers as daemon indexes,
    threads, seed), registered, then run from the parent's `go <end>` until that time; prints its counts."""
    settings = Settings(redis_url=cfg["url"], pool=cfg["pool"])
    store = Store.from_settings(settings)
    url = urlparse(cfg["url"])
    host, port = url.hostname or "127.0.0.1", url.port or 6379
    rng = random.Random(cfg["seed"])
    daemons: list[str] = cfg["daemons"]
    containers: Mapping[str, Sequence[Mapping[str, Any]]] = cfg.get("containers", {})
    on_daemon: dict[str, list[str]] = {}

    def peers(d: int) -> Callable[[], list[str]]:
        return lambda: on_daemon.get(daemons[d], [])

    workers = [SimWorker(store, daemons[d], peers(d), containers.get(daemons[d], ())) for d in cfg["workers"]]
    for w in workers:
        on_daemon.setdefault(w.daemon, []).append(w.id)
        w.register()
    print(json.dumps({"ready": len(workers)}), flush=True)
    line = sys.stdin.readline().split()
    end = float(line[1])
    sched = Scheduler(cfg["threads"])
    now = time.time()
    hb, inv = settings.heartbeat_secs, settings.inventory_secs
    for w in workers:
        sched.add(now + rng.uniform(0, hb), "boot beat", w.boot.beat, hb)
        sched.add(now + rng.uniform(0, hb), "mark round", w.mark_round, hb)
        sched.add(now + rng.uniform(0, inv), "inventory tick", w.tick, inv)
    counts: Counter[str] = Counter()
    queues = [[store.keys.daemon_queue(w.daemon), store.keys.rq_queue] for w in workers]
    block = routed_poll_secs(settings.heartbeat_secs)
    pollers = threading.Thread(target=run_pollers, args=(host, port, queues, end, counts, block), daemon=True)
    pollers.start()
    sched.run_until(end)
    pollers.join(5)
    lag = sorted(sched.lag) or [0.0]
    print(json.dumps({"done": dict(sched.done), "failed": dict(sched.failed), "polls": counts["poll rounds"],
                      "lag_ms_median": 1000 * statistics.median(lag),
                      "lag_ms_p99": 1000 * lag[int(0.99 * (len(lag) - 1))],
                      "published": sum(w.publisher.published for w in workers)}), flush=True)



class SimFleet:
    """`workers` simulated idle workers spread evenly over `daemons` (a daemon's workers in one process, so
    each knows its peers there), in `procs` child processes: started (registered) by `start`, run from `go`
    for the seconds given, stopped by pid on `close`."""

    def __init__(self, url: str, pool: str, workers: int, daemons: Sequence[str], procs: int,
                 threads: int = 3, containers: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
                 seed: int = 1) -> None:
        self.url, self.pool = url, pool
        self.workers, self.daemons = workers, list(daemons)
        self.procs = max(1, min(procs, len(self.daemons)))
        self.threads, self.seed = threads, seed
        self.containers = containers or {}
        self.children: list[subprocess.Popen[str]] = []
        self.results: list[dict[str, Any]] = []

    def start(self) -> None:
        per_daemon = [i % len(self.daemons) for i in range(self.workers)]
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        for k in range(self.procs):
            mine = [d for d in per_daemon if d % self.procs == k]
            ds = sorted(set(mine))
            cfg = {"url": self.url, "pool": self.pool, "daemons": self.daemons, "workers": mine,
                   "threads": self.threads, "seed": self.seed * 1000 + k,
                   "containers": {self.daemons[d]: self.containers.get(self.daemons[d], []) for d in ds}}
            self.children.append(subprocess.Popen([sys.executable, "-m", "bench.scale_sim", json.dumps(cfg)],
                                                  cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                                  stdout=subprocess.PIPE, text=True))
        for c in self.children:
            assert c.stdout is not None
            line = c.stdout.readline()
            if not line:
                raise RuntimeError(f"a simulating process exited ({c.wait()})")

    def go(self, secs: float) -> float:
        """Run every worker for `secs` from now; returns the end (epoch seconds)."""
        end = time.time() + secs
        for c in self.children:
            assert c.stdin is not None
            c.stdin.write(f"go {end}\n")
            c.stdin.flush()
        return end

    def wait(self) -> list[dict[str, Any]]:
        for c in self.children:
            assert c.stdout is not None
            line = c.stdout.readline()
            if line:
                self.results.append(json.loads(line))
            c.wait(60)
        return self.results

    def close(self) -> None:
        for c in self.children:
            if c.poll() is None:
                c.kill()
                c.wait()

    def expected(self, secs: float, settings: Settings) -> dict[str, float]:
        """How many of each periodic call the fleet should make in `secs`."""
        hb, inv = settings.heartbeat_secs, settings.inventory_secs
        return {"boot beat": self.workers * secs / hb, "mark round": self.workers * secs / hb,
                "inventory tick": self.workers * secs / inv,
                "poll rounds": self.workers * secs / routed_poll_secs(hb)}

    def summary(self) -> dict[str, Any]:
        done: Counter[str] = Counter()
        failed: Counter[str] = Counter()
        for r in self.results:
            done.update(r["done"])
            failed.update(r["failed"])
        done["poll rounds"] = sum(r["polls"] for r in self.results)
        return {"done": dict(done), "failed": dict(failed),
                "lag_ms_p99": max((r["lag_ms_p99"] for r in self.results), default=0.0),
                "published": sum(r["published"] for r in self.results)}


if __name__ == "__main__":
    child(json.loads(sys.argv[1]))
