"""The pool's counters: the `metrics` hash (jobpool/store/keys.py), what its fields mean, reading it, and the
supervisor's share of writing it.

Counters live in Redis, not in a process, so they are the fleet's whichever process serves them and survive
restarts of every one of them. The scripts count what they change in the step that changes it
(scripts/_lib.lua: `count`, `event`, `observe_duration`), so a counter can never disagree with the
transitions it counts; the supervisor adds what only it sees (its probes and how long its sweeps take) in one
MULTI with its last-sweep record. The hash holds a fixed, bounded set of fields, listed here:

  transitions:<to>:<reason>        every transition (event), by the state it went to ('none' for a pool-wide
                                   event) and its reason as a bounded label (contract.METRIC_REASONS)
  recoveries                       recovery budget spent (a crashed or vanished job queued again)
  job_duration:<state>:<le>        terminal jobs whose enqueue-to-end time fell in this bucket (its own
                                   count, not cumulative; <le> in seconds, contract.JOB_DURATION_BUCKETS, or
                                   'inf'), with :sum_ms and :count
  probes:<result>                  the supervisor's probes: present, exited, absent, unknown
  sweep_duration:<le>              sweeps whose duration fell in this bucket (<le> in ms,
                                   contract.SWEEP_DURATION_BUCKETS_MS, or 'inf'), with :sum_ms and :count
  sweep_overruns                   sweeps that took longer than the sweep interval they ran under
                                   (supervisor/loop.py starts the next one only once such a sweep ended)
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from .contract import JOB_DURATION_BUCKETS, SWEEP_DURATION_BUCKETS_MS, TERMINAL

PROBE_RESULTS = ("present", "exited", "absent", "unknown")
TERMINAL_STATES = tuple(sorted(s.value for s in TERMINAL))

K = TypeVar("K", bound=Hashable)


class CounterStore(Protocol):
    """What reading and writing the counters needs of a pool's store (jobpool/store/calls.py `Store`)."""

    def counters(self) -> dict[str, str]: ...

    def record_sweep(self, last_sweep: str, increments: Mapping[str, int], sum_ms: float) -> None: ...


@dataclass(frozen=True)
class Histogram:
    """A histogram as Prometheus shows it: cumulative counts per upper bound (seconds; +Inf last), the sum of
    the observations (seconds) and their count."""

    buckets: tuple[tuple[float, int], ...]
    sum_seconds: float
    count: int

    @classmethod
    def from_fields(cls, own: Mapping[str, int], bounds: Iterable[float], unit_secs: float,
                    sum_ms: float) -> Histogram:
        """From each bucket's own count (`own`: bound as written -> n; 'inf' past the last). A stored bound
        that is not one of `bounds` (buckets changed since) is counted in the first bound that holds it, so
        no observation is lost and the counts stay cumulative. The count is the +Inf bucket's, as Prometheus
        requires (the stored `:count` says the same, for a person reading the hash)."""
        limits = sorted(float(b) for b in bounds)
        per = [0] * (len(limits) + 1)
        for raw, n in own.items():
            le = math.inf if raw == "inf" else _float(raw)
            if le is None:
                continue
            le *= unit_secs
            i = next((k for k, b in enumerate(limits) if le <= b * unit_secs), len(limits))
            per[i] += n
        cumulative, running = [], 0
        for b, n in zip([*limits, math.inf], per, strict=True):
            running += n
            cumulative.append((b * unit_secs if b != math.inf else math.inf, running))
        return cls(tuple(cumulative), sum_ms / 1000, running)


@dataclass(frozen=True)
class Counters:
    """What the `metrics` hash holds, parsed (missing fields read as 0)."""

    transitions: Mapping[tuple[str, str], int] = field(default_factory=dict)
    recoveries: int = 0
    probes: Mapping[str, int] = field(default_factory=dict)
    job_duration: Mapping[str, Histogram] = field(default_factory=dict)
    sweep_duration: Histogram | None = None
    sweep_overruns: int = 0

    def to_dict(self) -> dict[str, Any]:
        def hist(h: Histogram | None) -> dict[str, Any] | None:
            if h is None:
                return None
            return {"buckets": [["+Inf" if b == math.inf else b, n] for b, n in h.buckets],
                    "sum": h.sum_seconds, "count": h.count}

        return {"transitions": [{"to": to, "reason": reason, "count": n}
                                for (to, reason), n in sorted(self.transitions.items())],
                "recoveries": self.recoveries, "probes": dict(self.probes),
                "job_duration": {s: hist(h) for s, h in self.job_duration.items()},
                "sweep_duration": hist(self.sweep_duration), "sweep_overruns": self.sweep_overruns}


def _float(raw: str) -> float | None:
    try:
        return float(raw)
    except ValueError:
        return None


def _int(raw: Any) -> int:
    """A stored count; a field edited into something else reads as 0 (a scrape must not fail on it)."""
    try:
        return int(float(raw))
    except (TypeError, ValueError, OverflowError):
        return 0


def parse(fields: Mapping[str, str]) -> Counters:
    """The counters from the hash's fields (unknown fields are ignored: a newer writer's, say)."""
    transitions: dict[tuple[str, str], int] = {}
    probes = dict.fromkeys(PROBE_RESULTS, 0)
    own: dict[str, dict[str, int]] = {}  # histogram name -> bucket -> own count
    sums: dict[str, float] = {}  # histogram name -> sum_ms
    recoveries = overruns = 0
    for name, raw in fields.items():
        match name.split(":"):
            case ["transitions", source, target]:
                transitions[(source, target)] = _int(raw)
            case ["recoveries"]:
                recoveries = _int(raw)
            case ["sweep_overruns"]:
                overruns = _int(raw)
            case ["probes", result] if result in probes:
                probes[result] = _int(raw)
            case ["job_duration" | "sweep_duration", bucket] | ["job_duration" | "sweep_duration", _, bucket]:
                family = name.rpartition(":")[0]
                if bucket == "sum_ms":
                    sums[family] = _float(raw) or 0.0
                elif bucket != "count":
                    own.setdefault(family, {})[bucket] = _int(raw)

    def hist(name: str, bounds: Iterable[float], unit_secs: float) -> Histogram:
        return Histogram.from_fields(own.get(name, {}), bounds, unit_secs, sums.get(name, 0.0))

    return Counters(transitions=transitions, recoveries=recoveries, probes=probes,
                    job_duration={s: hist(f"job_duration:{s}", JOB_DURATION_BUCKETS, 1.0)
                                  for s in TERMINAL_STATES},
                    sweep_duration=hist("sweep_duration", SWEEP_DURATION_BUCKETS_MS, 0.001),
                    sweep_overruns=overruns)


def read_counters(store: CounterStore) -> Counters:
    """The pool's counters, in one read of one hash (a bounded number of fields, whatever the pool holds)."""
    return parse(store.counters())


class ServedCounters:
    """The counters one process serves: never lower than it served before, while the process lives.

    Redis can lose its last writes (a crash under `appendfsync everysec`, a failover to a replica that was
    behind, a restore of an older copy), and the hash then reads lower than it did. Prometheus takes a
    counter that goes down for a reset to zero and adds its whole new value as increase: a hash that went
    from 1,202 to 601 would add 601 transitions that never happened. So each series served keeps an offset:
    when Redis reads lower than at the last scrape, the offset grows by the difference, the value served
    stays where it was, and what Redis counts from then on is added to it.

    An offset rather than holding the highest value served, because what happens after the loss is real and
    is counted at once; a held value would hide it until Redis had counted past what it lost. The price: a
    transition Redis lost and then counts again (redone after the rollback) is counted twice, and a loss
    made up before the next scrape is not seen. Histograms are offset on each bucket's own count, not on the
    cumulative ones, so their buckets stay cumulative and `_count` (the +Inf bucket) stays their total;
    their sum is offset on its own. A process that starts (another supervisor, this one restarted) serves
    Redis's own figures, as any restarted Prometheus target does.
    """

    def __init__(self) -> None:
        self._last: dict[Hashable, float] = {}  # series -> what Redis read at the last scrape
        self._offset: dict[Hashable, float] = {}  # series -> what Redis lost of it so far
        self._served: dict[Hashable, float] = {}  # series -> what was served at the last scrape
        self._seen: dict[str, dict[Any, None]] = {}  # family -> its labels served so far, in order

    def _serve(self, series: Hashable, raw: float) -> float:
        last = self._last.get(series, 0)
        if raw < last:
            self._offset[series] = self._offset.get(series, 0) + last - raw
        self._last[series] = raw
        served = max(raw + self._offset.get(series, 0), self._served.get(series, 0))  # a float sum's rounding
        self._served[series] = served
        return served

    def _counts(self, family: str, raw: Mapping[K, int]) -> dict[K, int]:
        """`raw` served, and every series of `family` served before (read as 0 when Redis lost it)."""
        seen = self._seen.setdefault(family, {})
        seen.update(dict.fromkeys(raw))
        return {labels: int(self._serve((family, labels), raw.get(labels, 0))) for labels in seen}

    def _histogram(self, name: str, h: Histogram) -> Histogram:
        buckets, below, running = [], 0, 0
        for le, cumulative in h.buckets:
            running += int(self._serve((name, le), cumulative - below))
            below = cumulative
            buckets.append((le, running))
        return Histogram(tuple(buckets), self._serve((name, "sum"), h.sum_seconds), running)

    def update(self, c: Counters) -> Counters:
        """What to serve for the counters `c` just read (each read once, in the order read)."""
        return Counters(
            transitions=self._counts("transitions", c.transitions),
            recoveries=int(self._serve("recoveries", c.recoveries)),
            probes=self._counts("probes", c.probes),
            job_duration={s: self._histogram(f"job_duration:{s}", h) for s, h in c.job_duration.items()},
            sweep_duration=None if c.sweep_duration is None else self._histogram("sweep_duration",
                                                                                 c.sweep_duration),
            sweep_overruns=int(self._serve("sweep_overruns", c.sweep_overruns)))


def sweep_increments(duration_ms: float, probes: Mapping[str, int],
                     overran: bool = False) -> tuple[dict[str, int], float]:
    """What one sweep adds to the hash: integer increments by field, and the ms to add to the sweep sum."""
    bucket = next((str(b) for b in SWEEP_DURATION_BUCKETS_MS if duration_ms <= b), "inf")
    incr = {f"sweep_duration:{bucket}": 1, "sweep_duration:count": 1}
    if overran:
        incr["sweep_overruns"] = 1
    incr.update({f"probes:{result}": n for result, n in probes.items() if n and result in PROBE_RESULTS})
    return incr, duration_ms


def record_sweep(store: CounterStore, last_sweep: str, duration_ms: float, probes: Mapping[str, int],
                 overran: bool = False) -> None:
    """The supervisor's write after a sweep: its last-sweep record and its counters, in one MULTI (so a
    sweep is counted exactly when it is recorded); `overran`: it took longer than the sweep interval."""
    incr, sum_ms = sweep_increments(duration_ms, probes, overran)
    store.record_sweep(last_sweep, incr, sum_ms)
