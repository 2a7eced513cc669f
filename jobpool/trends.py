"""The pool's history: what the dashboard draws to answer "since when?" (docs/architecture.md, "History").

Each supervisor's timer thread (jobpool/supervisor/timers.py) records one point per `Settings.trend_secs` of
Redis time, once it has ended: the gauges at its end (queued, waiting, running, slots used and max, slots held
on unknown evidence at the last sweep), the running totals of finished jobs per terminal state, and the wait
and run time percentiles of the jobs that ended in its span (up to TREND_SAMPLE_JOBS per state, read here).
The script (scripts/trend_sample.lua) records a point only once, so several supervisors may all try; none of
them keeps state that matters: a restarted one just tries the next point. The points live in one hash, a
field per position of a ring of TREND_POINTS (contract.py), so the history's size is fixed whatever the load,
and a point no supervisor recorded (none was running) is a gap, not a zero.

Throughput is the difference of the running totals between two adjacent points, so it counts every finish,
however fast jobs end or retention prunes them; the percentiles are a bounded sample of the rows still there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .contract import TREND_POINTS, TREND_SAMPLE_JOBS
from .store.calls import Store
from .store.trendreads import ENDED, EndedTimes

#: The fields of a recorded point, in scripts/trend_sample.lua's order.
FIELDS = ("point", "width_ms", "queued", "waiting", "running", "slots_used", "slots_max", "unknown",
          *(f"total_{s}" for s in ENDED), "wait_p50_ms", "wait_p95_ms", "run_p50_ms", "run_p95_ms", "sampled")


@dataclass(frozen=True)
class TrendPoint:
    """One point of the history: the span [at_ms, at_ms + width_ms) of Redis time and what was recorded at
    its end. `finished` is per terminal state, None where the point before it is missing (no difference to
    take); the percentiles are None when no job that ended in the span was read."""

    at_ms: int
    width_ms: int
    queued: int
    waiting: int
    running: int
    slots_used: int
    slots_max: int
    unknown: int
    finished: dict[str, int | None]
    wait_p50_ms: int | None
    wait_p95_ms: int | None
    run_p50_ms: int | None
    run_p95_ms: int | None
    sampled: int

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def percentile(sorted_values: Sequence[int], p: float) -> int | None:
    """The nearest-rank `p` percentile (0 < p <= 100) of `sorted_values`; None for none."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(p / 100 * len(sorted_values)) - 1)]


def percentiles_arg(ended: Sequence[EndedTimes]) -> str:
    """scripts/trend_sample.lua's ARGV[3]: wait p50|p95|run p50|p95|jobs read, in ms. A job waits from its
    enqueue to the start of its last attempt and runs from there to its end; one that never ran has no
    wait or run."""
    waits = sorted(max(0, e.claimed_ms - e.created_ms) for e in ended if e.claimed_ms is not None)
    runs = sorted(max(0, e.finished_ms - e.claimed_ms) for e in ended if e.claimed_ms is not None)
    values = [percentile(waits, 50), percentile(waits, 95), percentile(runs, 50), percentile(runs, 95)]
    return "|".join("" if v is None else str(v) for v in values) + f"|{len(ended)}"


class Sampler:
    """A timer job (supervisor/timers.py): records the last ended point of the history, once per point. Its
    only state is the last point it saw recorded, to skip the reads until the next one ends: it asks Redis's
    clock (the points' clock) only once this host's says a point ended, so a clock behind Redis's records a
    point that much later, and one ahead asks at each tick until Redis's catches up."""

    def __init__(self) -> None:
        self.last_point = -1

    def __call__(self, store: Store, actor: str) -> bool:
        """Record the point that ended last, unless it is recorded; True when this call recorded it."""
        width = store.settings.trend_secs * 1000
        if int(time.time() * 1000) // width - 1 <= self.last_point:
            return False  # by this host's clock no new point has ended: Redis is not asked the time
        point = store.now_ms() // width - 1
        if point <= self.last_point:
            return False
        ended = store.ended_between(point * width, (point + 1) * width, TREND_SAMPLE_JOBS)
        recorded = store.trend_sample(point, width, percentiles_arg(ended))
        self.last_point = point
        return recorded


def _int(raw: str) -> int | None:
    return int(raw) if raw.isdigit() else None


def parse_point(record: str) -> dict[str, int | None] | None:
    """A stored point's fields (FIELDS) as numbers, '' as None; None for a record that is not one."""
    parts = record.split("|")
    if len(parts) != len(FIELDS):
        return None
    values = dict(zip(FIELDS, (_int(p) for p in parts), strict=True))
    if any(values[k] is None for k in FIELDS[:11]) or not values["width_ms"]:
        return None
    return values


def read_trends(store: Store, now_ms: int | None = None) -> list[TrendPoint]:
    """The recorded points of the last TREND_POINTS spans, oldest first. The span is the newest point's (the
    supervisors' `trend_secs`, whatever the reader's own setting says); points of another span, from before
    it was changed, and those of the ring's older turns are left out."""
    now = store.now_ms() if now_ms is None else now_ms
    parsed = [v for v in map(parse_point, store.trend_points().values()) if v is not None]
    if not parsed:
        return []
    newest = max(parsed, key=lambda v: int(v["point"] or 0) * int(v["width_ms"] or 0))
    width = int(newest["width_ms"] or 0)
    oldest = now - TREND_POINTS * width
    rows = [(int(v["point"] or 0) * width, v) for v in parsed if v["width_ms"] == width]
    rows = [(at, v) for at, v in rows if at >= oldest]
    rows.sort(key=lambda r: r[0])
    points: list[TrendPoint] = []
    before: dict[str, int | None] | None = None
    for at, v in rows:
        adjacent = before is not None and int(before["point"] or 0) == int(v["point"] or 0) - 1
        finished: dict[str, int | None] = {s: None for s in ENDED}
        if adjacent and before is not None:
            for s in ENDED:
                delta = int(v[f"total_{s}"] or 0) - int(before[f"total_{s}"] or 0)
                finished[s] = delta if delta >= 0 else None  # a counter reset (a flushed pool): no figure
        points.append(TrendPoint(
            at_ms=at, width_ms=width, queued=int(v["queued"] or 0), waiting=int(v["waiting"] or 0),
            running=int(v["running"] or 0), slots_used=int(v["slots_used"] or 0),
            slots_max=int(v["slots_max"] or 0), unknown=int(v["unknown"] or 0), finished=finished,
            wait_p50_ms=v["wait_p50_ms"], wait_p95_ms=v["wait_p95_ms"], run_p50_ms=v["run_p50_ms"],
            run_p95_ms=v["run_p95_ms"], sampled=int(v["sampled"] or 0)))
        before = v
    return points

