"""Finding and stopping the stray containers of this worker's daemon (jobpool/strays.py has the rule;
docs/architecture.md, "Strays").

Run by the holder of the daemon's inventory lead, once per period, on the containers it just listed. A stray
is stopped (its stop signal, the stop grace, then killed: Docker's stop) by a thread of its own with its own
Docker client, so a long grace never delays the next inventory; just before the stop the row is read again
and the rule applied again. Nothing is judged while Redis's state is settling (jobpool/redistrust.py): a row
read then may be one a restart or a failover is about to contradict, and a live watcher re-fences anyway.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..api import Pool
from ..errors import JobpoolError, NotFound
from ..inventory import RUNNING, Entry
from ..redistrust import RedisTrust
from ..registry import call_redis
from ..strays import ROW_FIELDS, Stray, why_stray
from ..supervisor.probes import ContainerProber

log = logging.getLogger("jobpool.worker")


class StrayKeeper:
    """The strays of one daemon: found each period, stopped once each, shown until gone."""

    def __init__(self, pool: Pool, boot_id: str, new_prober: Callable[[], ContainerProber],
                 trust: RedisTrust) -> None:
        self.pool = pool
        self.boot_id = boot_id
        self.trust = trust
        self.grace = pool.settings.stop_grace_secs
        #: Makes the stopping thread's own client of this daemon (a stop blocks for the stop grace).
        self._new_prober = new_prober
        #: Container id -> the stray as first found (its `since` kept while it stays one).
        self.known: dict[str, Stray] = {}
        self._todo: queue.SimpleQueue[Stray | None] = queue.SimpleQueue()
        self._stopping: set[str] = set()
        #: The strays whose stop is recorded in their job's history (once each, however many tries it takes).
        self._recorded: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def find(self, entries: Sequence[Entry], daemon: str, listed_at_ms: int) -> list[Stray]:
        """The strays among `entries` (this daemon's listing); none judged while Redis's state settles."""
        running = [e for e in entries if e.state == RUNNING and e.container_id]
        if not running:
            self.known = {}
            return []
        if self.trust.settling():
            return list(self.known.values())  # shown as they were; none judged, none stopped
        rows = self._rows([e.job_id for e in running])
        found: dict[str, Stray] = {}
        for entry, row in zip(running, rows, strict=True):
            if isinstance(row, Exception):
                continue  # that row cannot be read: no verdict on its container
            why = why_stray(row, entry.attempt, entry.container_id, daemon)
            if why:
                old = self.known.get(entry.container_id)
                found[entry.container_id] = old if old is not None else Stray(
                    entry.job_id, entry.attempt, entry.container_id, why, listed_at_ms, daemon)
        self.known = found
        with self._lock:
            self._recorded &= set(found)
        for cid, stray in found.items():
            self._submit(cid, stray)
        return list(found.values())

    def _rows(self, job_ids: Sequence[str]) -> list[Any]:
        """Each job's `ROW_FIELDS` (all None for no row), or the error its read met."""
        pipe = self.pool.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(self.pool.keys.job(job_id), ROW_FIELDS)
        return list(call_redis(pipe.execute, raise_on_error=False, what="reading running containers' rows"))

    def _submit(self, cid: str, stray: Stray) -> None:
        with self._lock:
            if cid in self._stopping:
                return
            self._stopping.add(cid)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="jobpool-strays", daemon=True)
            self._thread.start()
        self._todo.put(stray)

    def close(self) -> None:
        if self._thread is not None:
            self._todo.put(None)
            self._thread.join(1.0)

    def _run(self) -> None:
        prober = self._new_prober()
        try:
            while (stray := self._todo.get()) is not None:
                try:
                    self.stop(prober, stray)
                except Exception as exc:  # noqa: BLE001 - Redis or the daemon away: found again next period
                    log.warning("stray container %s of job %s not stopped yet: %s", stray.container_id[:12],
                                stray.job_id, exc)
                finally:
                    with self._lock:
                        self._stopping.discard(stray.container_id)
        finally:
            prober.close()

    def stop(self, prober: ContainerProber, stray: Stray) -> bool:
        """Judge `stray` again on a fresh read of its row and, if it still is one, record why in its job's
        history and stop it. Returns whether it was stopped."""
        if self.trust.settling():
            return False
        row = self._rows([stray.job_id])[0]
        if isinstance(row, Exception):
            return False
        why = why_stray(row, stray.attempt, stray.container_id, stray.daemon_id)
        if not why:
            return False
        evidence = (f"container {stray.container_id[:12]} of attempt {stray.attempt} on daemon "
                    f"{stray.daemon_id}: {why}; stopped by the workers on its daemon (stop signal, then "
                    f"killed after {self.grace:g}s)")
        if stray.container_id not in self._recorded:
            try:
                self.pool.run("command_done", [self.pool.keys.job(stray.job_id)],
                              [stray.job_id, "stray_stopped", evidence[:500], f"worker:{self.boot_id}"])
            except NotFound:
                pass  # no row to record it in: the container is stopped all the same
            except JobpoolError:
                self.trust.lost()
                raise
            with self._lock:
                self._recorded.add(stray.container_id)
            log.warning("job %s: stray %s", stray.job_id, evidence)
        prober.stop(stray.container_id, self.grace)
        return True
