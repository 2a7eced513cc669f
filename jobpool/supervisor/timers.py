"""The supervisor's timers: what falls due by the clock, looked at every `timer_interval_secs`.

The sweep (supervisor/sweep.py) runs every `sweep_interval_secs` (30 s by default): too seldom for a job that
waits until 02:00 or a schedule that fires every second. So each supervisor also runs this, on a thread of
its own: the waiting jobs whose time came or whose dependencies ended are judged again
(scripts/release_waiting.lua), the schedules that are due fire (jobpool/schedules.py), and the pool's history
gets its point for each span that ended (jobpool/trends.py). Every step is
one script that judges again what the read before it saw, so several supervisors may run it at once, and
any of them may die between two steps: the next one finds the same work due and does it once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .. import errors
from ..config import Settings
from ..schedules import fire_due
from ..store.calls import Store
from ..trends import Sampler

log = logging.getLogger("jobpool.supervisor")

#: Waiting jobs judged per script call, and calls per round: a round is bounded, the next goes on.
RELEASE_BATCH = 64
RELEASE_ROUNDS = 64


def release_due(store: Store, actor: str) -> int:
    """Judge the waiting jobs that are due, in batches, then promote what was queued; returns how many were
    queued or cancelled. A cancelled job's dependents are due at once, so a chain is followed in one round."""
    changed = 0
    for _ in range(RELEASE_ROUNDS):
        due = store.due_waiting(store.now_ms(), RELEASE_BATCH)
        if not due:
            break
        queued, cancelled, _ = store.release_waiting(due, actor)
        changed += queued + cancelled
        if queued + cancelled == 0:
            break  # all judged still waiting (rescheduled): nothing more is due now
    if changed:
        store.promote_all(actor)
    return changed


class Timers:
    """The timer thread of one supervisor: `jobs` are run in turn every `timer_interval_secs` until `close`;
    one that fails (Redis away) is logged and run again next time."""

    def __init__(self, store: Store, actor: str,
                 jobs: list[Callable[[Store, str], object]] | None = None) -> None:
        self.store, self.actor, self.stop = store, actor, threading.Event()
        default: list[Callable[[Store, str], object]] = [release_due, fire_due, Sampler()]
        self.jobs = jobs if jobs is not None else default
        self.thread = threading.Thread(target=self.run, name="jobpool-timers", daemon=True)
        self._started = False

    @classmethod
    def for_settings(cls, settings: Settings, actor: str) -> Timers:
        """Timers on a store of their own: their scripts never wait behind a sweep's."""
        return cls(Store.from_settings(settings), actor)

    def start(self) -> None:
        """Start the thread, once (later calls do nothing)."""
        if not self._started and not self.stop.is_set():
            self._started = True
            self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(5)
        self.store.close()

    def run_once(self) -> None:
        for job in self.jobs:
            try:
                job(self.store, self.actor)
            except errors.JobpoolError as exc:
                log.warning("timers of pool %s: %s", self.store.settings.pool, exc)
            except Exception:  # a dead timer thread would leave waiting jobs waiting for ever
                log.exception("timers of pool %s failed", self.store.settings.pool)

    def run(self) -> None:
        interval = self.store.settings.timer_interval_secs
        while not self.stop.wait(interval):
            self.run_once()

