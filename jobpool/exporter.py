"""`/metrics` for Prometheus: served by `jobpool supervisor` when JOBPOOL_METRICS_PORT is set.

Each scrape reads the pool afresh, in a number of keys that grows with the fleet's workers, daemons and
processes, never with the jobs it runs or retains: the gauges come from the status report
(jobpool/status/read.py `read_status`, what `Pool.status()` returns, the one report the CLI and a dashboard
read too: counts are ZCARDs; read without its detail, the workers' jobs and the daemons section, which no
gauge serves), the counters and histograms from the `metrics` hash (jobpool/metrics.py), which the scripts and
the supervisor keep in Redis.
So every supervisor serves the same figures, and none are lost when one restarts; while a process lives, no
counter it serves goes down, even when Redis loses writes (`metrics.ServedCounters`). Every metric carries
the `pool` label. A scrape while Redis is away answers `jobpool_redis_reachable 0` and nothing it could not
read.

The server is uvicorn on an event loop of its own thread, its connections limited as the dashboard's are
(jobpool/httplimits.py), so that no number of idle or slow clients costs the supervisor a thread or a
descriptor each; and a scrape reads Redis in a worker thread through this server's own client, never the
sweep's.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import make_asgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from . import errors
from .contract import JobState
from .metrics import TERMINAL_STATES, Counters, Histogram, ServedCounters, read_counters
from .status import StatusReport, read_status
from .store.calls import Store
from .store.redispolicy import Verdict

if TYPE_CHECKING:
    from .config import Settings

log = logging.getLogger("jobpool.metrics")


def _gauge(name: str, doc: str, pool: str, value: float, **labels: str) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["pool", *labels])
    g.add_metric([pool, *labels.values()], value)
    return g


def _histogram(family: HistogramMetricFamily, labels: list[str], h: Histogram) -> None:
    buckets = [("+Inf" if b == math.inf else repr(float(b)), n) for b, n in h.buckets]
    family.add_metric(labels, buckets, h.sum_seconds)


def gauges(report: StatusReport) -> Iterator[Metric]:
    """The gauges of one status report (see the README's "Metrics" for what each means)."""
    pool = report.pool
    yield _gauge("jobpool_redis_reachable", "1 when the pool's Redis answered this scrape.", pool,
                 int(report.reachable))
    if not report.reachable:
        return
    yield _gauge("jobpool_healthy", "1 when `jobpool status` would say healthy.", pool, int(report.healthy))
    policy = report.redis_policy
    if policy is not None:
        yield _gauge("jobpool_redis_eviction_policy_ok", "1 when Redis's maxmemory-policy is noeviction; 0 "
                     "when it may evict jobpool's keys or could not be read (`jobpool status` says which).",
                     pool, int(policy.verdict is Verdict.OK))
    sweep = report.last_sweep
    if sweep is not None:
        yield _gauge("jobpool_last_sweep_age_seconds", "Seconds since the last sweep any supervisor recorded "
                     "(absent: none ever).", pool, max(0, sweep.age_ms) / 1000)
        if sweep.interval_ms:
            yield _gauge("jobpool_sweep_interval_seconds", "The sweep interval the last sweep ran under.",
                         pool, sweep.interval_ms / 1000)
    slots = report.slots
    if slots is not None:
        yield _gauge("jobpool_slots_max", "The fleet-wide limit of jobs running at once.", pool, slots.max)
        yield _gauge("jobpool_slots_used", "Slots held by running jobs.", pool, slots.used)
    yield _gauge("jobpool_stray_containers", "Running containers no row accounts for (outside any slot), "
                 "listed by their daemons' inventories until their workers have stopped them.", pool,
                 len(report.strays))
    yield _gauge("jobpool_slots_unknown", "Running jobs whose last probe answered unknown (slot kept).", pool,
                 report.unknown or 0)
    jobs = GaugeMetricFamily("jobpool_jobs", "Jobs in each state (finished ones: as retained).",
                             labels=["pool", "state"])
    for state in JobState:
        jobs.add_metric([pool, state.value], report.counts.get(state.value, 0))
    yield jobs
    wait_ms = report.queue.oldest_wait_ms if report.queue else None
    yield _gauge("jobpool_queue_oldest_age_seconds", "How long the head of the queue has waited (0: empty).",
                 pool, max(0, wait_ms or 0) / 1000)
    if report.workers is not None:
        yield _gauge("jobpool_workers_live", "Live worker processes (draining ones included).", pool,
                     report.workers.live)
        w = report.workers
        yield _gauge("jobpool_workers_ready", "Live workers that take jobs: not draining, not holding their "
                     "claims because their host fails its check, not stuck on their horse (`jobpool status` "
                     "says why).", pool, sum(not b.draining and not b.cannot_claim and not b.stuck
                                             for b in w.boots))
    limit_max = GaugeMetricFamily("jobpool_limit_max", "Each named limit's size (a pattern: the size each of "
                                  "its names has).", labels=["pool", "limit"])
    limit_used = GaugeMetricFamily("jobpool_limit_used", "Units of each named limit held by running jobs (a "
                                   "pattern: its names summed).", labels=["pool", "limit"])
    for u in report.limits:
        limit_max.add_metric([pool, u.name], u.size)
        limit_used.add_metric([pool, u.name], u.used)
    yield limit_max
    yield limit_used
    if report.promotion is not None:
        yield _gauge("jobpool_promotion_paused", "1 while promotion is paused (`jobpool pause`).", pool,
                     int(report.promotion.paused))


def counters(pool: str, c: Counters) -> Iterator[Metric]:
    """The counters and histograms of the `metrics` hash."""
    transitions = CounterMetricFamily("jobpool_transitions", "Transitions made, by the state entered ('none' "
                                      "for a pool-wide event) and reason.", labels=["pool", "to", "reason"])
    for (to, reason), n in sorted(c.transitions.items()):
        transitions.add_metric([pool, to, reason], n)
    yield transitions
    probes = CounterMetricFamily("jobpool_probe_results", "The supervisor's probes of running jobs, by "
                                 "result.", labels=["pool", "result"])
    for result, n in c.probes.items():
        probes.add_metric([pool, result], n)
    yield probes
    recoveries = CounterMetricFamily("jobpool_recoveries", "Recovery budget spent: a job whose worker or "
                                     "container was lost, queued again.", labels=["pool"])
    recoveries.add_metric([pool], c.recoveries)
    yield recoveries
    jobs = HistogramMetricFamily("jobpool_job_duration_seconds", "Seconds from enqueue to the terminal "
                                 "state.", labels=["pool", "state"])
    for state in TERMINAL_STATES:
        _histogram(jobs, [pool, state], c.job_duration[state])
    yield jobs
    if c.sweep_duration is not None:
        sweeps = HistogramMetricFamily("jobpool_sweep_duration_seconds", "How long the supervisors' sweeps "
                                       "took.", labels=["pool"])
        _histogram(sweeps, [pool], c.sweep_duration)
        yield sweeps
    overruns = CounterMetricFamily("jobpool_sweep_overruns", "Sweeps that took longer than the sweep "
                                   "interval they ran under (the ticks they covered were dropped, not run "
                                   "late).", labels=["pool"])
    overruns.add_metric([pool], c.sweep_overruns)
    yield overruns


class PoolCollector(Collector):
    """Reads the pool at each scrape (registered on a private registry: no process metrics of the server).
    The counters go through one `ServedCounters`, one scrape at a time (two scrapes applied out of order
    would look like a counter going back)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.served = ServedCounters()
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        report = read_status(self.store, detail=False)
        yield from gauges(report)
        if not report.reachable:
            return
        try:
            with self._lock:
                c = self.served.update(read_counters(self.store))
        except errors.JobpoolError as exc:  # Redis went away between the two reads: the next scrape asks
            log.warning("metrics of pool %s: %s", self.store.keys.pool, exc)
            return
        yield from counters(self.store.keys.pool, c)


class _Read(Collector):
    """Metric families already read, for prometheus-client to encode."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
                   Awaitable[None]]


def metrics_app(collector: Collector) -> ASGIApp:
    """prometheus-client's ASGI app (its formats, compression and `name[]` filter) over what `collector`
    reads in a worker thread: its Redis calls block, and must not hold up the server's event loop."""

    async def app(scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                  send: Callable[[Any], Awaitable[None]]) -> None:
        families = await asyncio.to_thread(lambda: list(collector.collect()))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Read(families))
        await make_asgi_app(registry)(scope, receive, send)

    return app


#: The most connections `/metrics` holds open at once (a Prometheus or two and a person with curl).
MAX_CONNECTIONS = 32
#: How long `close` lets a scrape in progress finish.
CLOSE_GRACE_SECS = 2


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port), made here so that a port that cannot be served is refused in
    this thread, before anything starts."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                  flags=socket.AI_PASSIVE)[0]
    return socket.create_server(address[:2], family=family)


class MetricsServer:
    """`/metrics` on (host, port), in a daemon thread of this process, until `close`."""

    def __init__(self, settings: Settings) -> None:
        import uvicorn  # here: the workers import this module and serve no metrics

        from . import httplimits

        assert settings.metrics_port is not None
        self.settings = settings
        self.host, self.port = settings.metrics_host, settings.metrics_port
        try:
            sock = _listen(self.host, self.port)
        except OSError as exc:
            raise errors.ConfigError(f"JOBPOOL_METRICS_PORT: cannot serve metrics on {self.url}: "
                                     f"{exc.strerror or exc}") from None
        self.store = Store.from_settings(settings)
        config = uvicorn.Config(metrics_app(PoolCollector(self.store)), lifespan="off", log_config=None,
                                log_level="warning", access_log=False, server_header=False,
                                timeout_graceful_shutdown=CLOSE_GRACE_SECS,
                                **httplimits.uvicorn_options(MAX_CONNECTIONS))
        config.load()
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="jobpool-metrics", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return metrics_url(self.settings)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(CLOSE_GRACE_SECS + 3)
        self.store.close()


def metrics_url(settings: Settings) -> str:
    """Where `settings` serve their metrics (an IPv6 address in brackets)."""
    host = f"[{settings.metrics_host}]" if ":" in settings.metrics_host else settings.metrics_host
    return f"http://{host}:{settings.metrics_port}/metrics"


def serve(settings: Settings) -> MetricsServer | None:
    """Serve the pool's metrics when `settings.metrics_port` is set (None: metrics are off)."""
    if settings.metrics_port is None:
        return None
    server = MetricsServer(settings)
    log.info("serving metrics of pool %s on %s", settings.pool, server.url)
    return server
