"""The pool's history: what the dashboard draws to answer "since when?" (docs/architecture.md, "The
dashboard").

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


@dataclass(frozen=True)
class Recorded:
    """A point as scripts/trend_sample.lua stores it (FIELDS): the gauges are queued, waiting, running, slots
    used and max, held on unknown; the totals are ENDED's running totals; a percentile is None when no job
    was read for it."""

    point: int
    width_ms: int
    gauges: tuple[int, int, int, int, int, int]
    totals: tuple[int, int, int]
    percentiles: tuple[int | None, int | None, int | None, int | None]
    sampled: int


def parse_point(record: str) -> Recorded | None:
    """A stored point, or None for a record that is not one."""
    parts = record.split("|")
    if len(parts) != len(FIELDS) or not all(p.isdigit() for p in parts[:11]) or parts[1] == "0" \
            or not parts[-1].isdigit() or not all(p.isdigit() or p == "" for p in parts[11:15]):
        return None
    n = [int(p) for p in parts[:11]]
    w50, w95, r50, r95 = (int(p) if p else None for p in parts[11:15])
    return Recorded(n[0], n[1], (n[2], n[3], n[4], n[5], n[6], n[7]), (n[8], n[9], n[10]),
                    (w50, w95, r50, r95), int(parts[-1]))


def read_trends(store: Store, now_ms: int | None = None) -> list[TrendPoint]:
    """The recorded points of the last TREND_POINTS spans, oldest first. The span is the newest point's (the
    supervisors' `trend_secs`, whatever the reader's own setting says); points of another span, from before
    it was changed, and those of the ring's older turns are left out."""
    now = store.now_ms() if now_ms is None else now_ms
    parsed = [r for r in map(parse_point, store.trend_points().values()) if r is not None]
    if not parsed:
        return []
    width = max(parsed, key=lambda r: r.point * r.width_ms).width_ms
    oldest = now - TREND_POINTS * width
    kept = sorted((r for r in parsed if r.width_ms == width and r.point * width >= oldest),
                  key=lambda r: r.point)
    points: list[TrendPoint] = []
    for before, r in zip([None, *kept], kept, strict=False):
        finished: dict[str, int | None] = dict.fromkeys(ENDED)
        if before is not None and before.point == r.point - 1:
            for s, now_total, then_total in zip(ENDED, r.totals, before.totals, strict=True):
                # A total that went down (a flushed pool) gives no figure.
                finished[s] = now_total - then_total if now_total >= then_total else None
        (queued, waiting, running, used, most, unknown), (w50, w95, r50, r95) = r.gauges, r.percentiles
        points.append(TrendPoint(r.point * width, width, queued, waiting, running, used, most, unknown,
                                 finished, w50, w95, r50, r95, r.sampled))
    return points
