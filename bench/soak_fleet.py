"""The soak's fleet (two private dockerd daemons, workers, supervisors, the fault proxies) and its sampler.
`bench/soak.py` runs them, `bench/soak_faults.py` injects the faults; see soak.py's docstring for what is
measured.

The fleet is laid out so every fault kind meets the parts it is about:

- Two dockerd daemons (tests/support/servers.py `DockerDaemon`) that share `/etc/docker/key.json`, hence
  Docker's ID; workers alternate between them and each has its own supervisor. A supervisor judges rows
  recorded on the other daemon from that daemon's inventory (jobpool/supervisor/remote.py), and adoption
  requests go to the recording daemon's own RQ queue.
- With three daemons (`--daemons 3`, the host faults), one supervisor is attached to daemon 1 and one to no
  daemon at all: everything it knows of the containers comes from the inventories. A simulated reboot of a
  host gives its workers another kernel boot id: they run in a mount namespace of their own where a file
  is bound over the kernel's boot id (tests/support/procs.py `other_boot`), the container daemon stays the
  same.
- Every worker reaches Redis through a `RedisReplyDropper` (tests/support/proxies.py), which can drop the
  reply of the next call of one script; supervisors and the soak itself talk to Redis directly.
- Worker 0 reaches daemon 1 through a `DockerLaunchHold`, which can hold its launch longer than the lease.

The sampler only lists; what an instant is judged against (the slot limit by the jobs' weights, the named
limits by their units, two containers of one job) is bench/soak_order.py's `Judge`.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path

import docker

from jobpool import Pool
from jobpool.contract import LABEL_ATTEMPT, LABEL_JOB, LABEL_POOL
from jobpool.fleet.daemonmark import LABEL_ROLE, ROLE_MARK
from tests.support.procs import JobpoolProcess, other_boot
from tests.support.proxies import DockerLaunchHold, RedisReplyDropper
from tests.support.servers import DockerDaemon, RedisServer

IMAGE = "jobpool-test:busybox"
POOL = "soak"
#: Where the supervisor attached to no daemon looks for one: nothing answers there.
NOWHERE = "unix:///nonexistent/jobpool-soak-no-daemon.sock"
def stream_id(value: str) -> tuple[int, int]:
    ms, _, seq = value.partition("-")
    return int(ms), int(seq or 0)


def all_events(pool: Pool, after: str = "-") -> list[dict[str, str]]:
    """Every event after `after` (exclusive unless "-"), paging through the stream."""
    out: list[dict[str, str]] = []
    cursor = after if after == "-" else f"({after}"
    while True:
        batch = pool.events(after=cursor, count=5000)
        if not batch:
            return out
        out += batch
        cursor = f"({batch[-1]['id']}"


def stamp(at: float) -> str:
    return f"{time.strftime('%H:%M:%S', time.localtime(at))}.{int(at * 1000) % 1000:03d}"


def remove_path(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


class Fleet:
    """The processes under test, each restartable, all stopped by pid; and the two proxies."""

    def __init__(self, root: Path, env: dict[str, str], redis_server: RedisServer,
                 daemons: list[DockerDaemon], workers: int) -> None:
        self.root, self.env, self.daemons = root, env, daemons
        self.redis_proxy = RedisReplyDropper(redis_server.port)
        self.docker_proxy = DockerLaunchHold(daemons[0].host)
        #: Daemon index of each worker: alternating, so both daemons have workers.
        self.placement = [i % len(daemons) for i in range(max(workers, len(daemons)))]
        self.workers: list[JobpoolProcess | None] = [None] * len(self.placement)
        #: The daemon each supervisor is attached to: one per daemon with two; with more, one on daemon 1 and
        #: one on none (it judges every container from the inventories).
        self.supervisor_hosts = ([d.host for d in daemons] if len(daemons) <= 2
                                 else [daemons[0].host, NOWHERE])
        self.supervisors: list[JobpoolProcess | None] = [None] * len(self.supervisor_hosts)
        #: The boot id file and boot time of each daemon whose host was "rebooted" (`reboot`): what its
        #: workers read from then on.
        self.boots: dict[int, tuple[Path, int]] = {}
        self._n = 0
        for i in range(len(self.workers)):
            self.start_worker(i)
        for d in range(len(self.supervisors)):
            self.start_supervisor(d)

    def _spawn(self, name: str, env: dict[str, str], args: tuple[str, ...],
               prefix: tuple[str, ...] = ()) -> JobpoolProcess:
        self._n += 1
        return JobpoolProcess("jobpool.cli", {**self.env, **env}, self.root / f"{name}-{self._n}.log", args,
                              prefix)

    def start_worker(self, i: int) -> None:
        d = self.placement[i]
        held = i == 0  # the one worker whose launches can be held
        host = self.docker_proxy.host if held else self.daemons[d].host
        boot = self.boots.get(d)
        self.workers[i] = self._spawn(f"worker{i}-d{d + 1}{'-held' if held else ''}",
                                      {"JOBPOOL_REDIS_URL": self.redis_proxy.url, "DOCKER_HOST": host},
                                      ("worker",), other_boot(*boot) if boot else ())

    def start_supervisor(self, s: int) -> None:
        host = self.supervisor_hosts[s]
        name = f"supervisor-d{s + 1}" if host != NOWHERE else "supervisor-nowhere"
        self.supervisors[s] = self._spawn(name, {"DOCKER_HOST": host}, ("supervisor",))

    def workers_on(self, d: int) -> list[int]:
        return [i for i, placed in enumerate(self.placement) if placed == d]

    def stop_workers_on(self, d: int) -> None:
        """SIGKILL every worker of daemon `d` (and their horses); they stay down until `start_workers_on`."""
        for i in self.workers_on(d):
            w, self.workers[i] = self.workers[i], None
            if w is not None:
                w.kill_with_children()

    def start_workers_on(self, d: int) -> None:
        for i in self.workers_on(d):
            self.start_worker(i)

    def reboot(self, d: int, booted_at: int) -> None:
        """The host of daemon `d` booted again at `booted_at` (epoch seconds): from now on its workers read
        a new kernel boot id and that boot time."""
        path = self.root / f"boot_id-d{d + 1}-{self._n}"
        path.write_text(f"{uuid.uuid4()}\n")
        self.boots[d] = (path, booted_at)

    def kill_worker(self, i: int) -> None:
        """SIGKILL a worker and its horse, and start it again (as a service manager would)."""
        w = self.workers[i]
        if w is not None:
            w.kill_with_children()
        self.start_worker(i)

    def revive(self) -> list[str]:
        """Start again every worker or supervisor that exited on its own, as the compose file's
        `restart: unless-stopped` would; returns what exited and how (its last error line)."""
        gone = []
        for procs, start in ((self.workers, self.start_worker), (self.supervisors, self.start_supervisor)):
            for i, p in enumerate(procs):
                if p is not None and p.proc.poll() is not None:
                    lines = [ln for ln in p.log().splitlines() if ln.strip()]
                    last = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), "")
                    gone.append(f"{p.log_path.name} exited {p.proc.returncode}: {last[-200:]}")
                    start(i)
        return gone

    def leftovers(self, timeout: float = 10.0) -> list[str]:
        """What this pool left on the daemons once every job has ended: containers that are not running and
        checkpoint volumes, as "d<n> container|volume <job>". A worker removes both when its job ends, and
        the supervisor removes ended jobs' volumes (every few minutes, jobpool/supervisor/volumes.py); so a
        few seconds are given for the last cleanups."""
        deadline = time.monotonic() + timeout
        while True:
            found = []
            for n, daemon in enumerate(self.daemons, 1):
                try:
                    with contextlib.closing(docker.DockerClient(base_url=daemon.host, timeout=10)) as client:
                        label = {"label": f"{LABEL_POOL}={POOL}"}
                        found += [f"d{n} container {(c.get('Labels') or {}).get(LABEL_JOB, '')} {c['State']}"
                                  for c in client.api.containers(all=True, filters=label)
                                  if c["State"] != "running"]
                        # A live process's mark of its daemon (jobpool/fleet/daemonmark.py) is no leftover.
                        found += [f"d{n} volume {(v.get('Labels') or {}).get(LABEL_JOB, '')}"
                                  for v in client.api.volumes(filters=label).get("Volumes") or []
                                  if (v.get("Labels") or {}).get(LABEL_ROLE) != ROLE_MARK]
                except docker.errors.DockerException as exc:
                    found.append(f"d{n} unreadable: {exc}")
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.5)

    def close(self) -> None:
        self.docker_proxy.release()
        for p in [*self.workers, *self.supervisors]:
            if p is not None:
                p.stop(timeout=15)
        self.docker_proxy.close()
        self.redis_proxy.close()


class Sampler(threading.Thread):
    """Lists the job containers running at each instant on every daemon and hands each instant to `judge`
    (bench/soak_order.py's Judge: the weights against the slot limit, the named limits, two of one job).

    Daemons cannot be listed at one instant, and a job handed from one daemon to another could show in a
    naive round of listings as two (the old one listed before it stopped, the new one after it began). So
    the daemons are listed in turn, A B C A B C ..., and each listing of one daemon is judged together with
    the containers of each other daemon that both its listings around it list (running before and after, so
    at that instant too). While a daemon does not answer, what the others list is judged without it (a
    lower bound)."""

    def __init__(self, hosts: list[str], judge: Callable[[dict[str, tuple[int, str, str]]], None]) -> None:
        super().__init__(daemon=True)
        self.judge = judge
        self.clients = [docker.DockerClient(base_url=h, timeout=5) for h in hosts]
        self.halt = threading.Event()

    def _list(self, d: int) -> dict[str, tuple[int, str, str]] | None:
        """Running job containers on daemon `d`: id -> (daemon, job, attempt); None if it does not answer."""
        try:
            found = self.clients[d].api.containers(filters={"label": f"{LABEL_POOL}={POOL}",
                                                            "status": "running"})
        except Exception:  # noqa: BLE001 - the daemon is down on purpose at times: unknown then
            return None
        return {c["Id"]: (d, (c.get("Labels") or {}).get(LABEL_JOB, ""),
                          (c.get("Labels") or {}).get(LABEL_ATTEMPT, "")) for c in found}

    def run(self) -> None:
        n = len(self.clients)
        recent: deque[tuple[int, dict[str, tuple[int, str, str]] | None]] = deque(maxlen=2 * n - 1)
        k = 0
        while not self.halt.is_set():
            d = k % n
            k += 1
            recent.append((d, self._list(d)))
            if len(recent) == recent.maxlen:
                self._judge_round(list(recent), n)
            self.halt.wait(0.03)
        for client in self.clients:
            client.close()

    def _judge_round(self, recent: list[tuple[int, dict[str, tuple[int, str, str]] | None]], n: int) -> None:
        """Judge the middle listing of the last 2n-1 (each other daemon listed once before it, once after)."""
        _, middle = recent[n - 1]
        live = dict(middle or {})
        judged = middle is not None
        for before_at in range(n - 1):
            (_, before), (_, after) = recent[before_at], recent[before_at + n]  # the same daemon, n apart
            if before is not None and after is not None:
                live.update({cid: v for cid, v in before.items() if cid in after})
                judged = True
        if judged:
            self.judge(live)

    def stop(self) -> None:
        self.halt.set()
        self.join(10)
