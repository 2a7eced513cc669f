"""Shared plumbing for the benchmarks: private servers, real workers, daemon events, cleanup, statistics.

Every benchmark starts its own redis-server and dockerd (tests/support/servers.py) and its own worker
processes (tests/support/procs.py), and stops each by the pid it started, whatever happens: a benchmark leaves
nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from jobpool import Pool
from tests.support.procs import JobpoolProcess
from tests.support.servers import DockerDaemon, RedisServer

ROOT = Path(__file__).resolve().parents[1]

IMAGE = "jobpool-test:busybox"
# dockerd lives in /usr/sbin, which a non-login PATH may lack.
os.environ["PATH"] = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"


def _term_to_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


@dataclass
class Bed:
    """One private redis-server, one private dockerd with the test image, and the workers started on them."""

    pool_name: str
    work_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="jp-bench-")))
    redis: RedisServer = field(default_factory=RedisServer)
    daemon: DockerDaemon = field(default_factory=DockerDaemon)
    workers: list[JobpoolProcess] = field(default_factory=list)

    def start(self) -> None:
        self.redis.start()
        self.daemon.start()
        self.daemon.import_busybox_image(IMAGE)

    def client(self) -> docker.DockerClient:
        return self.daemon.client()

    def pool(self, slots: int) -> Pool:
        pool = Pool.from_url(self.redis.url, name=self.pool_name, max_concurrent_jobs=slots)
        pool.set_slots(slots)
        return pool

    def worker_env(self, **extra: str) -> dict[str, str]:
        return {
            "JOBPOOL_REDIS_URL": self.redis.url, "JOBPOOL_POOL": self.pool_name, "JOBPOOL_EXECUTOR": "docker",
            "DOCKER_HOST": self.daemon.host, "JOBPOOL_STATE_DIR": str(self.work_dir / "state"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
            **extra,
        }

    def start_workers(self, n: int, pool: Pool, timeout: float = 30.0, module: str = "jobpool.workers",
                      **extra_env: str) -> None:
        """Start `n` workers and wait until each has registered its boot record and is listening on RQ."""
        for _ in range(n):
            log = self.work_dir / f"worker-{len(self.workers)}.log"
            self.workers.append(JobpoolProcess(module, self.worker_env(**extra_env), log))
        deadline = time.monotonic() + timeout
        rq_workers_key = f"rq:workers:{pool.keys.rq_queue_name}"
        while True:
            boots = pool.store.client.zcard(pool.keys.boots)
            listening = pool.store.client.scard(rq_workers_key)
            if boots >= n and listening >= n:
                return
            dead = [w for w in self.workers if w.proc.poll() is not None]
            if dead:
                raise RuntimeError(f"worker exited while starting:\n{dead[0].log()[-2000:]}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{boots}/{n} workers registered after {timeout}s")
            time.sleep(0.05)

    def close(self) -> None:
        for w in self.workers:
            with contextlib.suppress(Exception):
                w.stop(timeout=20)
        with contextlib.suppress(Exception):
            self.daemon.close()
        with contextlib.suppress(Exception):
            self.redis.close()


@contextlib.contextmanager
def bed(pool_name: str, keep_logs: bool = False) -> Iterator[Bed]:
    """A started `Bed`, closed on the way out (also on Ctrl-C or SIGTERM)."""
    old = signal.signal(signal.SIGTERM, _term_to_exit)
    b = Bed(pool_name)
    try:
        b.start()
        yield b
    finally:
        b.close()
        signal.signal(signal.SIGTERM, old)
        if keep_logs:
            print(f"worker logs kept in {b.work_dir}")
        else:
            shutil.rmtree(b.work_dir, ignore_errors=True)


class EventRecorder:
    """Container events streamed live from the daemon (its replay buffer keeps only the last 256 events,
    far fewer than a benchmark makes), each with the daemon's own `timeNano`."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.events: list[dict[str, Any]] = []
        self._stream = client.events(since=time.time(), decode=True, filters={"type": "container"})
        self._thread = threading.Thread(target=self._run, name="docker-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(Exception):  # the stream ends with an error when closed
            for e in self._stream:
                self.events.append(e)

    def stop(self, settle: float = 0.3) -> list[dict[str, Any]]:
        """Stop after `settle` seconds (so the last events arrive); the events, oldest first."""
        time.sleep(settle)
        self._stream.close()
        self._thread.join(5)
        return sorted(self.events, key=lambda e: int(e["timeNano"]))


def ms(ns: float) -> float:
    return ns / 1e6


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cpu_secs(pid: int, children: bool = True) -> float:
    """CPU seconds (user + system) used so far by `pid`, and with `children` by its reaped children (a
    worker's work horses); 0.0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    ticks = sum(int(f) for f in fields[11:15 if children else 13])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


class TreeChild:
    """A process of its own running `code` (python -c) over the jobpool of source `tree` (the code before a
    change, or after it), driven by lines: it is sent a command line, it answers one JSON line. The baseline
    and the change run side by side this way in bench/scrape.py and bench/sweep_fleet.py."""

    def __init__(self, name: str, tree: Path, code: str, cfg: dict[str, Any], close_secs: float = 60) -> None:
        self.name, self.close_secs = name, close_secs
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(cfg)], cwd=tree, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello: Any = self.read()

    def read(self) -> Any:
        """The child's next JSON line."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}'s process exited ({self.proc.wait()})")
        return json.loads(line)

    def ask(self, command: str) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=self.close_secs)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
