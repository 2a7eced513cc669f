"""The supervisor's entry points: one sweep, the operator's reconcile, and the sweep loop."""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from typing import Any

from .. import errors, exporter
from ..config import Settings
from ..fleet import daemonmark
from ..store.calls import Store
from ..store.redispolicy import EvictingRedis
from .probes import ContainerProber
from .report import SweepReport
from .sweep import Supervisor, actor_name
from .timers import Timers

log = logging.getLogger("jobpool.supervisor")


def sweep_once(store: Store, prober: ContainerProber | None = None) -> SweepReport:
    """One unattended sweep of the pool of `store`: reconcile, then promote. Never frees a live job's slot."""
    sup = Supervisor(store, prober)
    try:
        return sup.sweep()
    finally:
        if prober is None:
            sup.close()


def reconcile(store: Store, evict_stale: bool = False, dry_run: bool = False,
              prober: ContainerProber | None = None, actor: str | None = None) -> SweepReport:
    """The operator's sweep. `dry_run`: decide and report, change nothing. `evict_stale`: a live job past
    `job_stale_seconds` is stopped by container label and failed `stale_evicted`, freeing its slot.
    `actor` names who asked in the events it writes (default: the operator on this host and pid)."""
    sup = Supervisor(store, prober, actor=actor or actor_name("operator"))
    try:
        return sup.sweep(evict_stale=evict_stale, dry_run=dry_run)
    finally:
        if prober is None:
            sup.close()


def _check_redis(sup: Supervisor, once: bool, timers: Timers | None = None) -> bool:
    """The start-up check of Redis's eviction policy (jobpool/store/redispolicy.py); raises `EvictingRedis`
    for one that may evict job rows, `RedisUnavailable` when Redis is away (the loop then asks again). Then,
    unless `once`, the loop's mark on its daemon is made (its first write) and its `timers` start."""
    store = sup.store
    store.check_policy()
    store.check_schema()  # PoolTooNew: a pool this release does not know is not swept
    if not once and sup.marker is None:
        sup.marker = _mark_daemon(store, sup.prober)
    if timers is not None:
        timers.start()
    if not once:
        log.info("supervisor for pool %s: sweeping every %gs", store.settings.pool,
                 store.settings.sweep_interval_secs)
    return True


def _mark_daemon(store: Store, prober: ContainerProber) -> daemonmark.Marker | None:
    """The loop's mark on its Docker daemon (jobpool/fleet/daemonmark.py): until every process claiming the
    daemon's identity has its mark there, no row on that identity is judged from this daemon's list."""
    if store.settings.executor == "subprocess":
        return None
    marker = daemonmark.Marker(store, "supervisor", uuid.uuid4().hex, prober.docker_host,
                               consequence="this supervisor judges no job recorded on that identity")
    marker.start()
    return marker


def run_supervisor(settings: Settings, once: bool = False, stop_event: threading.Event | None = None,
                   prober: ContainerProber | None = None) -> SweepReport | None:
    """The supervisor loop: a sweep at start-up (rows left by a previous run are judged at once), then one
    every `sweep_interval_secs` from the start of the last, until SIGTERM/SIGINT or `stop_event`. Sweeps run
    one at a time on this thread: one that outlasts the interval is followed by the next once it ended, and
    the ticks it missed are dropped, not run after it (it says so itself: `SweepReport.overran`). A Redis
    whose `maxmemory-policy` may evict job rows is refused before the first sweep (`EvictingRedis`,
    jobpool/store/redispolicy.py). A failed sweep (Redis away) is logged and the loop goes on; with `once`, it
    is raised, so a cron job or health check sees it. Unless `once`, `/metrics` is served while the loop runs
    when `settings.metrics_port` is set (jobpool/exporter.py). Returns the last sweep's report."""
    stop = stop_event or threading.Event()
    # Before anything else: a port that cannot be served is refused in one line, with nothing written.
    server = None if once else exporter.serve(settings)
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread() and not once:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda signum, frame: stop.set())
    store = Store.from_settings(settings)
    sup = Supervisor(store, prober, actor=actor_name())
    last: SweepReport | None = None
    checked = False
    timers = None if once else Timers.for_settings(settings, sup.actor)
    try:
        while not stop.is_set():
            began = time.monotonic()
            try:
                checked = checked or _check_redis(sup, once, timers)  # before the first write
                last = sup.sweep()
            except errors.JobpoolError as exc:
                # Refused (a Redis that evicts, a pool newer than this release): one line, said by whoever
                # started it.
                if once or isinstance(exc, EvictingRedis | errors.PoolTooNew):
                    raise
                log.error("sweep of pool %s failed: %s", settings.pool, exc)
            except Exception:  # a dead supervisor wedges the queue; log and sweep again
                if once:
                    raise
                log.exception("sweep of pool %s failed", settings.pool)
            if once:
                break
            stop.wait(max(0.0, began + settings.sweep_interval_secs - time.monotonic()))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if timers is not None:  # the timer thread stops with the loop, whatever ended it
            timers.close()
        sup.close()
        store.close()
        if server is not None:
            server.close()
    log.info("supervisor for pool %s stopped", settings.pool)
    return last
