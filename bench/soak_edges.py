"""The soak's faults at the fleet's edges (drawn with `--daemons 3`, beside the host faults), run by the
injectors of bench/soak_faults.py:

- `claim_lost_worker_killed`: Redis forgets an acknowledged claim after the claiming worker died, as a
  failover to a lagging replica does: the AOF is copied, a worker claims a job and starts it, the worker is
  SIGKILLed (its watcher with it), redis-server comes back from the copy. The attempt is claimed again, and
  the first container is a stray its daemon's workers must stop (docs/architecture.md, "Strays").
- `daemon_forgotten_returns`: every worker of an idle daemon hangs (SIGSTOP) until its inventory is stale,
  the operator declares it gone (`forget_daemon`), and the workers wake: the daemon publishes again and must
  lift the declaration, so that a later stale inventory of it is unknown again, never absent.
- `redis_restart_in_launch`: the held worker's next create reply is held (the container exists, its fence
  has not landed), redis-server is SIGKILLed, stays down past a lease and comes back (AOF): no actor may take
  the lapsed lease as proof and remove the created container (jobpool/redistrust.py).
- `cloned_data_root`: a daemon's data root is copied (it is stopped meanwhile, as for a backup) onto a new
  daemon on this kernel, which so carries its identity, and a worker starts there: the two must be told
  apart (their workers' marks, jobpool/fleet/daemonmark.py), both refuse claims and `status` names them; the
  report stands after the clone's worker stops and the clone is gone, until the soak, as the operator, clears
  it (`forget_collision`); then the first daemon's workers claim again.
- `worker_without_daemon`: a worker whose DOCKER_HOST names a socket nothing serves runs for a few
  seconds beside the fleet: it must take no delivery (one it took would be dropped before its claim); the
  deliveries it dequeued are counted (`swallowed`, a zero).
- `frozen_standby`: a worker's forked child (its idle standby, or the horse running its job) is
  stopped (SIGSTOP): the worker must replace a standby that does not take its job within a deadline, kill a
  horse stopped past the lease, and go on taking work.
- `checkpoint_root_read_only`: the fleet's shared `JOBPOOL_CHECKPOINT_ROOT` (a bind mount, drawn only when
  this fault is: bench/soak.py) is remounted read-only for 1-3 s, as NFS and CephFS remount on errors: a
  launch meanwhile is handed back, never charged to its job, and the workers claim again once it is writable
  (docs/architecture.md, "Host faults").
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from typing import Any

from bench.soak_fleet import all_events
from jobpool import errors, forget_collision, forget_daemon
from jobpool.fleet import markrecords
from tests.support.procs import children, other_boot
from tests.support.servers import DockerDaemon

EDGE_FAULTS = ("claim_lost_worker_killed", "daemon_forgotten_returns", "redis_restart_in_launch",
               "checkpoint_root_read_only", "cloned_data_root", "worker_without_daemon", "frozen_standby")
#: Edge faults armed now and met later.
EDGE_ARMED = ("redis_restart_in_launch",)
_BOOT = re.compile(r"boot ([0-9a-f]{32})")
#: RQ's line for a job its worker dequeued ("Worker <name>: <queue>: jobpool <id> (<image>) (<id>)").
_DEQUEUED = re.compile(r"rq\.worker INFO Worker [^:]+: [^:]+: jobpool [0-9a-f]{32} ")


class EdgeFaults:
    """The edge faults of one soak, on the injectors `chaos` (bench/soak_faults.py `Chaos`) and its fleet."""

    def __init__(self, chaos: Any) -> None:
        self.chaos = chaos
        self._restart_thread: threading.Thread | None = None
        self._restart_met = False

    @property
    def fleet(self) -> Any:
        return self.chaos.fleet

    def _boot_of(self, i: int) -> str:
        w = self.fleet.workers[i]
        found = _BOOT.search(w.log()) if w is not None else None
        return found.group(1) if found else ""

    # ---- claim_lost_worker_killed -----------------------------------------------------------------------

    def claim_lost_worker_killed(self) -> bool:
        with self.chaos.hold_events():
            return self._claim_lost()

    def _claim_lost(self) -> bool:
        chaos = self.chaos
        taken = chaos._take_copy()
        if taken is None:
            return False
        aof, copy, mark = taken
        boots = {self._boot_of(i): i for i in range(len(self.fleet.workers))}
        deadline = time.monotonic() + 5
        victim = None
        while victim is None and time.monotonic() < deadline and not chaos._ending.is_set():
            try:
                claims = [e for e in all_events(chaos.pool, mark) if e.get("reason") == "claimed"]
            except errors.JobpoolError:
                claims = []
            victim = next((boots[e["actor"]] for e in claims if e.get("actor") in boots), None)
            time.sleep(0.05)
        if victim is None:
            chaos._back_from_copy(aof, copy, mark)  # nothing claimed meanwhile: a plain rollback
            return False
        time.sleep(0.7)  # the claim's launch goes on to start its container
        chaos.note("claim_lost_worker_killed", f"SIGKILL {chaos._worker(victim)} (it claimed after the copy)")
        w, self.fleet.workers[victim] = self.fleet.workers[victim], None
        if w is not None:
            w.kill_with_children()
        took_back: int = chaos._back_from_copy(aof, copy, mark)
        self.fleet.start_worker(victim)
        return took_back > 0

    # ---- daemon_forgotten_returns -----------------------------------------------------------------------

    def daemon_forgotten_returns(self) -> bool:
        chaos, fleet = self.chaos, self.fleet
        idle = [d for d in range(len(fleet.daemons)) if not chaos._running_on(d)]
        if not idle:
            return False
        d = chaos.rng.choice(idle)
        workers = [i for i in fleet.workers_on(d) if fleet.workers[i] is not None]
        identity = next((x for i in workers if (x := self._identity_of(i))), "")
        if not identity:
            return False
        pids = [p for i in workers if (w := fleet.workers[i]) is not None for p in (w.pid, *children(w.pid))]
        for pid in pids:
            _signal(pid, signal.SIGSTOP)
        try:
            if chaos._running_on(d):
                return False  # a job started there meanwhile: forgetting it would be the operator's error
            chaos.note("daemon_forgotten_returns", f"daemon {d + 1}: workers hung, to forget {identity}")
            if not self._forget(identity):
                return False
            chaos.note("daemon_forgotten_returns", f"daemon {d + 1} declared gone; its workers wake")
        finally:
            for pid in pids:
                _signal(pid, signal.SIGCONT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not chaos._ending.is_set():
            try:
                if not chaos.pool.store.client.hexists(chaos.pool.keys.gone_daemons, identity):
                    chaos.note("daemon_forgotten_returns", f"daemon {d + 1} published: declaration lifted")
                    return True
            except Exception:  # noqa: BLE001 - Redis restarting: asked again
                pass
            time.sleep(0.2)
        chaos.note("daemon_forgotten_returns", f"daemon {d + 1}: declaration NOT lifted within 20s")
        return True  # met all the same: what it left is judged by the zeros

    def _identity_of(self, i: int) -> str:
        boot = self._boot_of(i)
        try:
            pool = self.chaos.pool
            return str(pool.store.client.hget(pool.keys.boot(boot), "daemon_id") or "") if boot else ""
        except Exception:  # noqa: BLE001 - Redis away: not now
            return ""

    def _forget(self, identity: str) -> bool:
        """`forget_daemon` once its lead has lapsed and its inventory is stale (refused until then)."""
        env = self.fleet.env
        wait = 3 * float(env["JOBPOOL_INVENTORY_STALE_SECS"]) + 10
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not self.chaos._ending.is_set():
            try:
                forget_daemon(self.chaos.pool, identity, note="soak: daemon_forgotten_returns")
                return True
            except errors.JobpoolError:
                time.sleep(0.2)
        return False

    # ---- cloned_data_root -------------------------------------------------------------------------------

    def cloned_data_root(self) -> bool:
        chaos, fleet = self.chaos, self.fleet
        d = chaos.rng.randrange(1, len(fleet.daemons))  # not daemon 1: its launches go through the proxy
        # A daemon whose host a `host_reboot` "rebooted" has workers that read another boot id than this
        # kernel's: its clone's worker reads the same one (a clone on the same host), or the two would rightly
        # be two identities. (A fault that can never meet would be drawn again at every turn.)
        boot = fleet.boots.get(d)
        daemon = fleet.daemons[d]
        chaos.note("cloned_data_root", f"daemon {d + 1} stopped while its data root is copied")
        daemon.stop()
        clone = DockerDaemon(copy_of=daemon)
        worker = None
        try:
            try:
                clone.start()
            finally:
                daemon.start()
            worker = fleet._spawn(f"clone-of-d{d + 1}-worker", {"JOBPOOL_REDIS_URL": fleet.redis_proxy.url,
                                                                 "DOCKER_HOST": clone.host}, ("worker",),
                                  other_boot(*boot) if boot else ())
            deadline = time.monotonic() + 30
            seen = False
            while time.monotonic() < deadline and not chaos._ending.is_set():
                try:
                    seen = bool(chaos.pool.status().shared_daemons)
                except errors.JobpoolError:
                    seen = False
                if seen:
                    break
                time.sleep(0.2)
            chaos.note("cloned_data_root", f"daemon {d + 1} and its clone: "
                       + ("one identity reported, claims refused" if seen else "NOT reported within 30s"))
            return seen  # a clone never told apart is drawn again: the fault never counts as met
        finally:
            if worker is not None:
                worker.stop(timeout=20)
            clone.close()
            chaos.note("cloned_data_root", f"the clone of daemon {d + 1} is gone")
            self._clear_collisions()

    def _clear_collisions(self) -> None:
        """The operator's part, once the clone is gone: the collision stands until cleared (one reported
        after the clone's worker stopped, by a round in flight then, is cleared too). Deadline: 30 s."""
        chaos = self.chaos
        deadline = time.monotonic() + 30
        quiet_since = None
        while time.monotonic() < deadline and not chaos._ending.is_set():
            try:
                for identity in markrecords.read_standing(chaos.pool.store):
                    forget_collision(chaos.pool, identity, actor="soak", note="clone removed")
                    chaos.note("cloned_data_root", f"collision on {identity} cleared by the operator")
                shared = chaos.pool.status().shared_daemons
            except errors.JobpoolError as exc:
                chaos.note("cloned_data_root", f"clearing the collision: {exc}")
                shared = {"?": ""}
            if shared:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= 2.0:
                return  # nothing reported for two seconds: the first daemon's workers claim again
            time.sleep(0.2)
        chaos.note("cloned_data_root", "a collision still reported 30s after the clone went: NOT cleared")

    # ---- worker_without_daemon, frozen_standby ------------------------------------------------------------

    def worker_without_daemon(self) -> bool:
        chaos, fleet = self.chaos, self.fleet
        try:
            counts = chaos.pool.stats()["counts"]
        except errors.JobpoolError:
            return False
        if not counts["queued"] + counts["running"]:
            return False
        nowhere = f"unix://{fleet.root}/no-daemon-here.sock"
        worker = fleet._spawn("worker-without-daemon", {"JOBPOOL_REDIS_URL": fleet.redis_proxy.url,
                                                        "DOCKER_HOST": nowhere}, ("worker",))
        up = chaos.rng.uniform(3.0, 6.0)  # the fault itself: how long it runs beside the fleet
        chaos.note("worker_without_daemon", f"a worker on {nowhere} for {up:.1f}s")
        try:
            chaos._ending.wait(up)
        finally:
            worker.stop(timeout=20)
        taken = len(_DEQUEUED.findall(worker.log()))
        chaos.figures.swallowed += taken
        chaos.note("worker_without_daemon", f"stopped; it took {taken} deliveries")
        return True

    def frozen_standby(self) -> bool:
        chaos, fleet = self.chaos, self.fleet
        live = [(i, w) for i, w in enumerate(fleet.workers) if w is not None and w.proc.poll() is None
                and children(w.pid)]
        if not live:
            return False
        i, w = chaos.rng.choice(live)
        child = children(w.pid)[0]
        chaos.note("frozen_standby", f"SIGSTOP child {child} of {chaos._worker(i)}")
        _signal(child, signal.SIGSTOP)
        return True

    # ---- checkpoint_root_read_only ------------------------------------------------------------------------

    def checkpoint_root_read_only(self) -> bool:
        root = self.chaos.checkpoint_root
        if root is None:
            return False
        try:
            counts = self.chaos.pool.stats()["counts"]
        except errors.JobpoolError:
            return False
        if not counts["running"] + counts["queued"]:
            return False
        outage = self.chaos.rng.uniform(1.0, 3.0)  # the fault itself: its length is what is being tested
        self.chaos.note("checkpoint_root_read_only", f"{root.path} read-only for {outage:.1f}s")
        root.read_only()
        try:
            self.chaos._ending.wait(outage)
        finally:
            root.writable()
        self.chaos.note("checkpoint_root_read_only", "writable again")
        return True

    # ---- redis_restart_in_launch (armed) ------------------------------------------------------------------

    def arm(self, kind: str) -> None:
        self.chaos.note(kind, "armed: the held worker's next create")
        self._restart_met = False
        self._restart_thread = threading.Thread(target=self._restart_during_launch, daemon=True)
        self._restart_thread.start()

    def poll(self) -> list[str]:
        t = self._restart_thread
        if "redis_restart_in_launch" in self.chaos.armed and t is not None and not t.is_alive():
            del self.chaos.armed["redis_restart_in_launch"]
            if self._restart_met:
                return ["redis_restart_in_launch"]
        return []

    def _restart_during_launch(self) -> None:
        chaos = self.chaos
        proxy = self.fleet.docker_proxy
        proxy.held.clear()
        proxy.hold("create")
        try:
            deadline = time.monotonic() + 60
            while not proxy.held.wait(0.2):
                if chaos._ending.is_set() or time.monotonic() > deadline:
                    return
            jobs = chaos._created_on_daemon1()
            down = float(self.fleet.env["JOBPOOL_LEASE_SECS"]) + 0.5
            chaos.note("redis_restart_in_launch", f"a create of {jobs or '?'} held; redis down {down:.1f}s")
            chaos.redis_server.kill()
            time.sleep(down)  # the outage itself: a lease lapses meanwhile
            chaos.redis_server.start(appendonly=True)
            time.sleep(0.5)  # the publishers list and publish again before the fence lands
            self._restart_met = True
            chaos.figures.held_launches += jobs
            chaos.note("redis_restart_in_launch", "redis back; the create's reply released")
        finally:
            proxy.release()

    def join(self) -> None:
        if self._restart_thread is not None:
            self._restart_thread.join(15)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
