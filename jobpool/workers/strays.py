"""Finding and stopping the stray containers of this worker's daemon (jobpool/fleet/strays.py has the rule;
docs/architecture.md, "Strays").

Run by the holder of the daemon's inventory lead, once per period, on the containers it just listed. The rows
are read after the listing, then Redis's word is checked to be settled (jobpool/redistrust.py: a row read
just after a restart or a failover may be one it is about to contradict, and a live watcher re-fences
anyway), and a candidate is asked again whether it still runs (a job that ended between the listing and the
read is no stray). Strays are stopped (their stop signal, the stop grace, then killed: Docker's stop) by a
small pool of threads with their own Docker clients, all at once, so that neither a long grace nor many
strays delay the next inventory or each other; just before a stop the row is read and judged again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import JobpoolError, NotFound
from ..fleet.inventory import RUNNING, Entry
from ..fleet.strays import ROW_FIELDS, Stray, why_stray
from ..redistrust import RedisTrust
from ..store.calls import Store
from ..supervisor.probes import ContainerProber
from ..supervisor.stopper import ContainerStopper

log = logging.getLogger("jobpool.worker")

#: Strays stopped at once, each on a thread and Docker client of its own.
STOPPERS = 8


class StrayKeeper:
    """The strays of one daemon: found each period, stopped once each, shown until gone."""

    def __init__(self, store: Store, boot_id: str, new_prober: Callable[[], ContainerProber],
                 trust: RedisTrust) -> None:
        self.store = store
        self.boot_id = boot_id
        self.trust = trust
        self.grace = store.settings.stop_grace_secs
        #: Makes a stopping thread's own client of this daemon (a stop blocks for the stop grace).
        self._new_prober = new_prober
        #: Container id -> the stray as first found (its `since` kept while it stays one).
        self.known: dict[str, Stray] = {}
        self._stopping: set[str] = set()
        #: The strays whose stop is recorded in their job's history (once each, however many tries it takes).
        self._recorded: set[str] = set()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._probers: list[ContainerProber] = []

    def find(self, entries: Sequence[Entry], daemon: str, listed_at_ms: int, launched_by: Mapping[str, str],
             still_running: Callable[[str], bool]) -> list[Stray]:
        """The strays among `entries` (this daemon's listing; `launched_by`: container id -> the boot of its
        label); none judged while Redis's state settles, none that no longer runs."""
        running = [e for e in entries if e.state == RUNNING and e.container_id]
        if not running:
            self.known = {}
            return []
        rows, known = self._read([e.job_id for e in running], [launched_by.get(e.container_id, "")
                                                               for e in running])
        if self.trust.settling():
            return list(self.known.values())  # shown as they were; none judged, none stopped
        found: dict[str, Stray] = {}
        for entry, row, ours in zip(running, rows, known, strict=True):
            if isinstance(row, Exception):
                continue  # that row cannot be read: no verdict on its container
            why = why_stray(row, entry.attempt, entry.container_id, ours)
            if not why or not still_running(entry.container_id):
                continue
            old = self.known.get(entry.container_id)
            found[entry.container_id] = old if old is not None else Stray(
                entry.job_id, entry.attempt, entry.container_id, why, listed_at_ms, daemon)
            self._submit(found[entry.container_id], ours)
        self.known = found
        with self._lock:
            self._recorded &= set(found)
        return list(found.values())

    def _read(self, job_ids: Sequence[str], boots: Sequence[str]) -> tuple[list[Any], list[bool]]:
        """Each job's `ROW_FIELDS` (all None for no row) or the error its read met, and whether each launching
        boot is one this pool's Redis knows (in its `boots` index), in one round trip."""
        return self.store.rows_and_boots(job_ids, ROW_FIELDS, boots)

    def _submit(self, stray: Stray, ours: bool) -> None:
        with self._lock:
            if stray.container_id in self._stopping:
                return
            self._stopping.add(stray.container_id)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(STOPPERS, thread_name_prefix="jobpool-strays")
            pool = self._pool
        pool.submit(self._stop_one, stray, ours)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        for prober in list(self._probers):
            prober.close()

    def _prober(self) -> ContainerProber:
        prober = getattr(self._local, "prober", None)
        if prober is None:
            prober = self._local.prober = self._new_prober()
            with self._lock:
                self._probers.append(prober)
        return prober

    def _stop_one(self, stray: Stray, ours: bool) -> None:
        try:
            self.stop(self._prober(), stray, ours)
        except Exception as exc:  # noqa: BLE001 - Redis or the daemon away: found again next period
            log.warning("stray container %s of job %s not stopped yet: %s", stray.container_id[:12],
                        stray.job_id, exc)
        finally:
            with self._lock:
                self._stopping.discard(stray.container_id)

    def stop(self, prober: ContainerProber, stray: Stray, ours: bool = True) -> bool:
        """Judge `stray` again on a fresh read of its row and, if it still is one and still runs, record why
        in its job's history (once) and stop it. Returns whether it was stopped."""
        row = self._read([stray.job_id], [])[0][0]
        if isinstance(row, Exception) or self.trust.settling():
            return False
        why = why_stray(row, stray.attempt, stray.container_id, ours)
        if not why or not runs(prober, stray.container_id):
            return False
        evidence = (f"container {stray.container_id[:12]} of attempt {stray.attempt} on daemon "
                    f"{stray.daemon_id}: {why}; stopped by the workers on its daemon (stop signal, then "
                    f"killed after {self.grace:g}s)")
        if stray.container_id not in self._recorded:
            try:
                self.store.command_done(stray.job_id, "stray_stopped", evidence[:500],
                                        f"worker:{self.boot_id}")
            except NotFound:
                pass  # no row to record it in: the container is stopped all the same
            except JobpoolError:
                self.trust.lost()
                raise
            with self._lock:
                self._recorded.add(stray.container_id)
            log.warning("job %s: stray %s", stray.job_id, evidence)
        ContainerStopper(prober).stop(stray.container_id, self.grace)
        return True


def runs(prober: ContainerProber, container_id: str) -> bool:
    """Whether the container still runs (True when the daemon cannot say: the stop is then tried anyway)."""
    import docker

    try:
        state = prober.client().api.inspect_container(container_id).get("State") or {}
    except docker.errors.NotFound:
        return False
    except Exception:  # noqa: BLE001 - asked again by the stop itself
        return True
    return bool(state.get("Running"))
