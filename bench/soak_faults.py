"""The soak's fault injectors, run by `bench/soak.py` against the fleet of `bench/soak_fleet.py` (which puts
tests/ on the import path, so it is imported first by soak.py).

Most faults are injected at once (a process killed, a daemon or Redis restarted, a user's cancel, pause
or retry).
Three are armed and met later, when the moment they need comes: `lost_reply` (the next call of the chosen
script), `slow_launch` (a launch by the worker behind the dockerd proxy) and `shared_id_daemon` (a worker on
daemon 2 running a job). A fault counts once it met live jobs.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import shutil
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, cast

import docker
from rq.registry import StartedJobRegistry

from bench.soak_edges import EDGE_ARMED, EDGE_FAULTS, EdgeFaults
from bench.soak_fleet import POOL, Fleet, all_events, remove_path, stamp, stream_id
from jobpool import JobState, Pool
from jobpool.contract import LABEL_JOB, LABEL_POOL
from jobpool.errors import JobpoolError
from jobpool.store.luatext import script_text
from tests.support.procs import children
from tests.support.servers import RedisServer

#: Faults armed now and met later, when the moment they need comes. The others are injected at once.
ARMED = ("shared_id_daemon", "slow_launch", "lost_reply", *EDGE_ARMED)
#: Armed faults that hold a launch through the dockerd proxy: one at a time.
PROXY_HOLDERS = ("slow_launch", "redis_restart_in_launch")
#: Faults of a whole host or daemon, drawn with `--daemons 3` (bench/soak.py).
HOST_FAULTS = ("daemon_workers_killed", "daemon_containers_removed", "host_reboot")
LOST_REPLY_SCRIPTS = ("claim", "set_container", "finish")


def script_sha(name: str) -> str:
    """The SHA1 redis-py sends with EVALSHA for one of jobpool's scripts (its loaded text)."""
    return hashlib.sha1(script_text(name).encode()).hexdigest()


class Chaos:
    """The fault injectors. `inject(kind)` injects one now (False when it could not meet live jobs) or arms
    it; `poll()` returns the armed kinds met since the last call."""

    def __init__(self, rng: random.Random, fleet: Fleet, redis_server: RedisServer, pool: Pool,
                 figures: Any, root: Path, rollback_anywhere: bool = True,
                 hold_events: Callable[[], AbstractContextManager[None]] = nullcontext) -> None:
        self.rng, self.fleet, self.redis_server, self.pool = rng, fleet, redis_server, pool
        self.figures, self.root, self.rollback_anywhere = figures, root, rollback_anywhere
        #: Holds the soak's live reader of the event stream (soak_watch.EventLog) through a rollback.
        self.hold_events = hold_events
        self.armed: dict[str, Any] = {}
        self._held_met = 0
        self._hold_thread: threading.Thread | None = None
        self._ending = threading.Event()
        self._d2 = docker.DockerClient(base_url=fleet.daemons[-1].host, timeout=5)
        #: The faults at the fleet's edges (bench/soak_edges.py), and the shared checkpoint root one of them
        #: makes read-only (tests/support/mounts.py `ReadOnly`; None when the fleet keeps checkpoints in
        #: volumes).
        self.edges = EdgeFaults(self)
        self.checkpoint_root: Any = None

    # ---- injected at once ---------------------------------------------------------------------------

    def inject(self, kind: str, job_ids: list[str]) -> bool:
        if kind in ARMED:
            busy = kind in PROXY_HOLDERS and any(k in self.armed for k in PROXY_HOLDERS)
            if kind not in self.armed and not busy:
                self._arm(kind)
            return False  # counted when met
        if kind in ("cancel", "pause_resume"):
            self._user(kind, self.rng.choice(job_ids))
            return True
        if kind == "retry":
            return self._retry(job_ids)
        if kind in EDGE_FAULTS:
            return bool(getattr(self.edges, kind)())
        return bool(getattr(self, kind)())

    def note(self, kind: str, what: str) -> None:
        """One line per fault, with the time, so a finding can be set against what was done just before."""
        print(f"soak: {stamp(time.time())} {kind}: {what}", file=sys.stderr)

    def _worker(self, i: int) -> str:
        w = self.fleet.workers[i]
        return w.log_path.name if w is not None else f"worker{i}"

    def worker_sigkill(self) -> bool:
        i = self.rng.randrange(len(self.fleet.workers))
        self.note("worker_sigkill", self._worker(i))
        self.fleet.kill_worker(i)
        return True

    def worker_sigterm(self) -> bool:
        return self._sigterm(self.rng.randrange(len(self.fleet.workers)))

    def _sigterm(self, i: int) -> bool:
        """Drain worker `i` (SIGTERM, waited for) and start it again."""
        self.note("worker_sigterm", self._worker(i))
        w = self.fleet.workers[i]
        if w is not None:
            w.stop(timeout=30)
        self.fleet.start_worker(i)
        return True

    def supervisor_restart(self) -> bool:
        d = self.rng.randrange(len(self.fleet.supervisors))
        self.note("supervisor_restart", f"daemon {d + 1}")
        s = self.fleet.supervisors[d]
        if s is not None:
            s.kill_with_children()
        self.fleet.start_supervisor(d)
        return True

    def dockerd_restart(self) -> bool:
        d = self.rng.randrange(len(self.fleet.daemons))
        daemon = self.fleet.daemons[d]
        outage = self.rng.uniform(0.5, 3.0)  # the outage itself: its length is what is being tested
        self.note("dockerd_restart", f"daemon {d + 1} stopped for {outage:.1f}s")
        daemon.stop()
        time.sleep(outage)
        daemon.start()
        self.note("dockerd_restart", f"daemon {d + 1} answers again")
        return True

    # ---- host faults (`--daemons 3`) ------------------------------------------------------------------

    def _running_on(self, d: int) -> list[str]:
        """Container ids of this pool running on daemon `d` (none while it does not answer)."""
        try:
            with contextlib.closing(docker.DockerClient(base_url=self.fleet.daemons[d].host, timeout=5)) as c:
                return [x["Id"] for x in c.api.containers(filters={"label": f"{LABEL_POOL}={POOL}",
                                                                     "status": "running"})]
        except Exception:  # noqa: BLE001 - a daemon restarting: no host fault there now
            return []

    def _busy_daemon(self, among: list[int]) -> int | None:
        busy = [d for d in among if self._running_on(d)]
        return self.rng.choice(busy) if busy else None

    def _remove_containers(self, d: int, running_only: bool) -> int:
        with contextlib.closing(docker.DockerClient(base_url=self.fleet.daemons[d].host, timeout=10)) as c:
            found = c.api.containers(all=not running_only, filters={"label": f"{LABEL_POOL}={POOL}"})
            for x in found:
                with contextlib.suppress(docker.errors.NotFound):
                    c.api.remove_container(x["Id"], force=True)
        return len(found)

    def daemon_workers_killed(self) -> bool:
        """Every worker of one daemon SIGKILLed (with their horses) while its containers run; they stay down
        until that daemon's inventory is stale (the jobs are unknown meanwhile), then start again and adopt
        them."""
        d = self._busy_daemon(list(range(len(self.fleet.daemons))))
        if d is None:
            return False
        env = self.fleet.env
        down = float(env["JOBPOOL_INVENTORY_STALE_SECS"]) + float(env["JOBPOOL_LEASE_SECS"])
        self.note("daemon_workers_killed", f"daemon {d + 1}: SIGKILL its workers, down for {down:.1f}s")
        self.fleet.stop_workers_on(d)
        self._ending.wait(down)
        self.fleet.start_workers_on(d)
        return True

    def daemon_containers_removed(self) -> bool:
        """`docker rm -f` of every running job container of one daemon, its workers alive."""
        d = self._busy_daemon(list(range(len(self.fleet.daemons))))
        if d is None:
            return False
        removed = self._remove_containers(d, running_only=True)
        self.note("daemon_containers_removed", f"daemon {d + 1}: {removed} removed")
        return removed > 0

    def host_reboot(self) -> bool:
        """The host of a daemon no supervisor is attached to reboots: its workers die, and its workers come
        back reading another kernel boot id and boot time (Fleet.reboot); the same daemon then publishes
        under a new identity, and only the boot rule (jobpool/supervisor/remote.py) frees the old boot's
        slots. Its containers are either gone (removed, as on a host re-provisioned) or kept ended, killed
        just after the new boot time, as the daemon of the new boot records the old boot's containers: those
        are recovered as `host_rebooted` (jobpool/exits.py), not failed."""
        attached = set(self.fleet.supervisor_hosts)
        d = self._busy_daemon([i for i, dd in enumerate(self.fleet.daemons) if dd.host not in attached])
        if d is None:
            return False
        self.fleet.stop_workers_on(d)
        booted = int(time.time()) + 1  # every container of the old boot started before this second
        keep = self.rng.random() < 0.5
        if keep:
            self._ending.wait(max(0.0, booted + 0.05 - time.time()))
            ended = self._kill_containers(d)
            what = f"{ended} containers killed after the new boot time"
        else:
            what = f"{self._remove_containers(d, running_only=False)} containers gone"
        self.fleet.reboot(d, booted)
        self.note("host_reboot", f"daemon {d + 1}: workers killed, {what}, new boot id")
        self.fleet.start_workers_on(d)
        return True

    def _kill_containers(self, d: int) -> int:
        with contextlib.closing(docker.DockerClient(base_url=self.fleet.daemons[d].host, timeout=10)) as c:
            found = c.api.containers(filters={"label": f"{LABEL_POOL}={POOL}", "status": "running"})
            for x in found:
                with contextlib.suppress(docker.errors.APIError):
                    c.api.kill(x["Id"])
        return len(found)

    def redis_restart(self) -> bool:
        self.note("redis_restart", "kill -9")
        self.redis_server.kill()
        self.redis_server.restart()
        return True

    def _user(self, kind: str, job_id: str) -> None:
        self.note(kind, job_id)
        try:
            if kind == "cancel":
                self.pool.cancel(job_id)
            else:
                self.pool.pause(job_id)  # the main loop resumes it a little later
        except JobpoolError:
            pass  # finished already, or Redis is restarting: a user would see the same

    def _retry(self, job_ids: list[str]) -> bool:
        """A person's `Pool.retry` of one of the soak's failed or cancelled jobs (one retention kept); met
        once one was retried. A job that waits for one that failed is refused (that one first): another is
        drawn next time."""
        mine = set(job_ids)
        try:
            ended = [j.id for state in (JobState.FAILED, JobState.CANCELLED)
                     for j in self.pool.list(state, limit=100) if j.id in mine]
        except JobpoolError:
            return False
        if not ended:
            return False
        job_id = self.rng.choice(sorted(ended))
        try:
            state = self.pool.retry(job_id).state.value
        except JobpoolError as exc:
            self.note("retry", f"{job_id} refused: {exc}")
            return False
        self.note("retry", f"{job_id}: {state}")
        return True

    def redis_rollback(self) -> bool:
        """Redis loses its last writes: the AOF directory is copied now, the fleet runs on for 0.5-2 s,
        redis-server is SIGKILLed and comes back (same port and dir) from the copy. Injected only while jobs
        run, and it met them only if it took back at least one transition (a promotion, claim, exit...).
        The events it took back are counted and logged, so a finding can be traced to them. The soak's live
        reader of the stream is held from before the copy until Redis is back, so it never keeps an event
        that was taken back."""
        with self.hold_events():
            return self._rollback()

    def _rollback(self) -> bool:
        taken = self._take_copy()
        if taken is None:
            return False
        time.sleep(self.rng.uniform(0.5, 2.0))
        return self._back_from_copy(*taken) > 0

    def _take_copy(self) -> tuple[Path, Path, str] | None:
        """Copy the AOF now (while jobs run): (the AOF, its copy, the last event id before it), or None."""
        try:
            if not self.pool.stats()["counts"]["running"]:
                return None
            last = self.pool.store.client.xrevrange(self.pool.keys.events, count=1)
        except Exception:  # noqa: BLE001 - Redis away: try again later
            return None
        mark = cast(str, last[0][0]) if last else "0-0"
        # Redis 7 keeps its AOF in a directory (base, increments, manifest); Redis 6 in one file.
        aof = self.redis_server.dir / "appendonlydir"
        if not aof.exists():
            aof = self.redis_server.dir / "appendonly.aof"
        copy = self.root / f"aof-at-{int(time.time() * 1000)}"
        if not self._copy_aof(aof, copy):
            return None
        self.note("redis_rollback", "AOF copied")
        return aof, copy, mark

    def _back_from_copy(self, aof: Path, copy: Path, mark: str) -> int:
        """SIGKILL redis-server and start it from `copy`; returns how many events (after `mark`) it took back,
        counted and logged so that a finding can be traced to them."""
        try:
            written = all_events(self.pool, mark)
        except JobpoolError:
            written = []
        self.note("redis_rollback", "kill -9, back from the copy")
        self.redis_server.kill()
        remove_path(aof)
        (shutil.copytree if copy.is_dir() else shutil.copy2)(copy, aof)
        remove_path(copy)
        self.redis_server.restart()
        try:
            back = self.pool.store.client.xrevrange(self.pool.keys.events, count=1)
        except Exception:  # noqa: BLE001 - read again below if it fails; the count is a figure only
            back = []
        restored = stream_id(cast(str, back[0][0])) if back else (0, 0)
        lost = [e for e in written if stream_id(e["id"]) > restored]
        self.figures.rolled_back_events += len(lost)
        self.figures.rollbacks.append({"at": time.time(), "restored_to": back[0][0] if back else "",
                                       "lost": lost})
        print(f"soak: redis_rollback took back {len(lost)} events: "
              + ", ".join(f"{e.get('job')}:{e.get('from')}->{e.get('to')}({e.get('reason')})" for e in lost),
              file=sys.stderr)
        return len(lost)

    def _copy_aof(self, aof: Path, copy: Path) -> bool:
        """Copy the AOF at an instant when no RQ delivery is between a worker's BLMOVE and its horse's start,
        unless `rollback_anywhere`. A rollback to such an instant leaves the job's RQ entry in RQ's
        intermediate list with its row unclaimed; RQ's own maintenance clears such an entry only every 10
        minutes per worker, so the supervisor dispatches it again once it has seen it held past the claim
        grace (jobpool/supervisor/verdicts.py, `decide_unclaimed`). Quiet means: the intermediate list empty
        and RQ's started registry the same before and after the copy (a BLMOVE during the copy creates an
        execution there before the horse takes the entry off the list)."""
        c, k = self.pool.store.client, self.pool.keys
        wip = StartedJobRegistry.key_template.format(k.rq_queue_name)
        for _ in range(200):
            try:
                before = c.llen(k.rq_intermediate), c.zrange(wip, 0, -1)
                if before[0] == 0 or self.rollback_anywhere:
                    (shutil.copytree if aof.is_dir() else shutil.copy2)(aof, copy)
                    if self.rollback_anywhere or (c.llen(k.rq_intermediate), c.zrange(wip, 0, -1)) == before:
                        return True
                    remove_path(copy)
            except Exception:  # noqa: BLE001 - Redis away: not now
                remove_path(copy)
                return False
            time.sleep(0.01)
        return False

    # ---- armed, met later ---------------------------------------------------------------------------

    def _arm(self, kind: str) -> None:
        if kind == "lost_reply":
            name = self.rng.choice(LOST_REPLY_SCRIPTS)
            sha = script_sha(name)
            self.armed[kind] = (name, sha, self.fleet.redis_proxy.dropped.get(sha, 0))
            self.fleet.redis_proxy.drop(sha, 1)
            self.note("lost_reply", f"armed: the next {name} reply")
        elif kind == "slow_launch":
            what = self.rng.choice(("create", "start"))
            hold_for = self.rng.uniform(1.5, 2.5) * float(self.fleet.env["JOBPOOL_LEASE_SECS"])
            self.armed[kind] = what
            self.note("slow_launch", f"armed: the held worker's next {what}, for {hold_for:.1f}s")
            self._hold_thread = threading.Thread(target=self._hold_one_launch, args=(what, hold_for),
                                                 daemon=True)
            self._hold_thread.start()
        elif kind == "shared_id_daemon":
            self.armed[kind] = True
        elif kind in EDGE_ARMED:
            self.armed[kind] = True
            self.edges.arm(kind)

    def _hold_one_launch(self, what: str, hold_for: float) -> None:
        """Hold the held worker's next create reply (or start request) for `hold_for` seconds, longer than
        the lease, then let it through. Gives up after a minute without a launch there."""
        proxy = self.fleet.docker_proxy
        proxy.held.clear()
        proxy.hold(what)
        try:
            deadline = time.monotonic() + 60
            while not proxy.held.wait(0.2):
                if self._ending.is_set() or time.monotonic() > deadline:
                    return
            jobs = self._created_on_daemon1()
            self.note("slow_launch", f"holding a {what} of {jobs or '?'}")
            if not self._ending.wait(hold_for):
                self._held_met += 1
                self.figures.held_launches += jobs
                self.note("slow_launch", f"released after {hold_for:.1f}s")
        finally:
            proxy.release()

    def _created_on_daemon1(self) -> list[str]:
        """The jobs with a created, never started container on daemon 1: the held launch is among them."""
        try:
            with contextlib.closing(docker.DockerClient(base_url=self.fleet.daemons[0].host, timeout=5)) as c:
                found = c.api.containers(all=True, filters={"label": f"{LABEL_POOL}={POOL}",
                                                            "status": "created"})
        except Exception:  # noqa: BLE001 - a figure for the report only
            return []
        return [(x.get("Labels") or {}).get(LABEL_JOB, "") for x in found]

    def poll(self) -> list[str]:
        met = []
        if "lost_reply" in self.armed:
            name, sha, before = self.armed["lost_reply"]
            if self.fleet.redis_proxy.dropped.get(sha, 0) > before:
                self.note("lost_reply", f"a {name} reply dropped")
                del self.armed["lost_reply"]
                self.figures.lost_replies[name] += 1
                met.append("lost_reply")
        if "slow_launch" in self.armed and self._hold_thread is not None and not self._hold_thread.is_alive():
            del self.armed["slow_launch"]
            if self._held_met:
                self._held_met -= 1
                met.append("slow_launch")
        if "shared_id_daemon" in self.armed and self._kill_busy_worker_on_daemon2():
            del self.armed["shared_id_daemon"]
            met.append("shared_id_daemon")
        return met + self.edges.poll()

    def _kill_busy_worker_on_daemon2(self) -> bool:
        """SIGKILL a daemon-2 worker (and its horse) while its horse runs a job and job containers run on
        daemon 2; it is started again. False (stay armed) until that moment comes."""
        last = len(self.fleet.daemons) - 1
        busy = [i for i, d in enumerate(self.fleet.placement)
                if d == last and (w := self.fleet.workers[i]) is not None and w.proc.poll() is None
                and children(w.pid)]
        if not busy:
            return False
        try:
            if not self._d2.api.containers(filters={"label": f"{LABEL_POOL}={POOL}", "status": "running"}):
                return False
        except Exception:  # noqa: BLE001 - daemon 2 restarting: not now
            return False
        i = self.rng.choice(busy)
        self.note("shared_id_daemon", f"SIGKILL {self._worker(i)} and its horse")
        self.fleet.kill_worker(i)
        return True

    def disarm(self) -> None:
        """Take back whatever is still armed, so the end of the soak meets no fault."""
        if "lost_reply" in self.armed:
            self.fleet.redis_proxy.drop(self.armed["lost_reply"][1], 0)
        self.armed.clear()
        self._ending.set()
        self.fleet.docker_proxy.release()
        if self._hold_thread is not None:
            self._hold_thread.join(10)
        self.edges.join()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._d2.close()
