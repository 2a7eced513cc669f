"""The overview's history charts (jobpool/trends.py's points), drawn on the server as inline SVG: no script
and no build step, redrawn with the rest of the overview at each refresh (static/dashboard.js). Colours come
from classes in static/dashboard.css, so the Content-Security-Policy needs no inline style.

A chart spans from its first recorded point to the end of its last; a point missing (no supervisor recorded
it) breaks its lines rather than being drawn as a zero. A day of minutes is more points than a chart's width
shows, and the overview is sent again at each refresh, so past MAX_DRAWN points each drawn point stands for
several in a row and shows the highest of them (a peak is never averaged away).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from markupsafe import Markup, escape

from ..trends import TrendPoint

#: The drawing's own units (the SVG scales to the page's width).
WIDTH, HEIGHT = 600, 150
LEFT, RIGHT, TOP, BOTTOM = 46, 8, 8, 20
#: From here on an axis label is written in thousands.
THOUSANDS = 10_000
MINUTE_MS = 60_000
#: The most points a chart draws (its plot is about 550 units wide): a day of minutes drawn whole made the
#: overview's fragment 185 KB and 19 ms of rendering, at every refresh of every open page.
MAX_DRAWN = 240
#: A stretch of a series: its points and values.
Run = list[tuple[TrendPoint, float]]


@dataclass(frozen=True)
class Series:
    """One line: its legend name, its CSS class (its colour), and a value per point (None: no figure)."""

    name: str
    css: str
    values: Sequence[float | None]


@dataclass(frozen=True)
class Chart:
    """One chart as the template places it: its id, title, what its values count, and its SVG."""

    id: str
    title: str
    unit: str
    svg: Markup
    legend: list[tuple[str, str, str]]


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above `value` (at least 1): a round top."""
    if value <= 1:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(float(m * power) for m in (1, 2, 2.5, 5, 10) if m * power >= value)


def _label(value: float) -> str:
    return f"{value:g}" if value < THOUSANDS else f"{value / 1000:g}k"


def _clock(ms: int, seconds: bool) -> str:
    return time.strftime("%H:%M:%S" if seconds else "%H:%M", time.localtime(ms / 1000))


def draw(points: Sequence[TrendPoint], series: Sequence[Series]) -> Markup:
    """An SVG of `series` over `points`' spans, with a zero line, a round top and the first and last times."""
    start, end = points[0].at_ms, points[-1].at_ms + points[-1].width_ms
    span = max(end - start, 1)
    top = nice_ceiling(max((v for s in series for v in s.values if v is not None), default=0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(p: TrendPoint) -> float:
        return LEFT + plot_w * (p.at_ms + p.width_ms / 2 - start) / span

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" preserveAspectRatio="none">']
    right, bottom = WIDTH - RIGHT, HEIGHT - 4
    for v in (0, top / 2, top):
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{right}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>')
        parts.append(f'<text class="axis" x="{LEFT - 4}" y="{y(v) + 4:.1f}" text-anchor="end">'
                     f'{_label(v)}</text>')
    seconds = points[-1].width_ms < MINUTE_MS  # points a few seconds apart: times to the second
    first, last = _clock(start, seconds), _clock(end, seconds)
    parts.append(f'<text class="axis" x="{LEFT}" y="{bottom}">{first}</text>')
    parts.append(f'<text class="axis" x="{right}" y="{bottom}" text-anchor="end">{last}</text>')
    for s in series:
        for run in _runs(points, s.values):
            if len(run) == 1:  # no neighbour to draw a line to: a dot
                p, v = run[0]
                parts.append(f'<circle class="{s.css}" cx="{x(p):.1f}" cy="{y(v):.1f}" r="3"/>')
                continue
            d = " ".join(f"{'M' if i == 0 else 'L'}{x(p):.1f} {y(v):.1f}" for i, (p, v) in enumerate(run))
            parts.append(f'<path class="{s.css}" d="{d}"><title>{escape(s.name)}</title></path>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _runs(points: Sequence[TrendPoint], values: Sequence[float | None]) -> list[Run]:
    """The unbroken stretches of a series: a missing point or a value of None ends one."""
    runs: list[Run] = []
    for p, v in zip(points, values, strict=True):
        if v is None:
            continue
        last = runs[-1][-1][0] if runs else None
        if last is not None and last.at_ms + last.width_ms == p.at_ms:
            runs[-1].append((p, v))
        else:
            runs.append([(p, v)])
    return runs


def downsample(points: Sequence[TrendPoint], series: Sequence[Series],
               most: int = MAX_DRAWN) -> tuple[list[TrendPoint], list[Series]]:
    """At most about `most` points: consecutive spans merged into one of k spans, each series' value the
    highest of those it merges (None when none has one); a merged span with no recorded point is left out,
    so a long gap still breaks the lines."""
    if len(points) <= most:
        return list(points), list(series)
    first, width = points[0].at_ms, points[-1].width_ms
    step = math.ceil((points[-1].at_ms + width - first) / width / most) * width
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault((p.at_ms - first) // step, []).append(i)
    order = sorted(groups)
    drawn = [replace(points[groups[b][0]], at_ms=first + b * step, width_ms=step) for b in order]
    merged = [Series(s.name, s.css, [_highest(s.values[i] for i in groups[b]) for b in order])
              for s in series]
    return drawn, merged


def _highest(values: Iterable[float | None]) -> float | None:
    return max((v for v in values if v is not None), default=None)


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def _latest(values: Sequence[float | None], fmt: Callable[[float], str]) -> str:
    last = next((v for v in reversed(values) if v is not None), None)
    return "-" if last is None else fmt(last)


def history_charts(points: Sequence[TrendPoint]) -> list[Chart]:
    """The overview's three charts: jobs finished per point, the queue against the slots, and how long jobs
    waited and ran. None without points."""
    if not points:
        return []
    width = points[-1].width_ms
    per = {1000: "second", MINUTE_MS: "minute"}.get(width, f"{width // 1000} s")
    charts = [
        ("throughput", "Finished", f"jobs per {per}", [
            Series("succeeded", "s-succeeded", [p.finished["succeeded"] for p in points]),
            Series("failed", "s-failed", [p.finished["failed"] for p in points]),
            Series("cancelled", "s-cancelled", [p.finished["cancelled"] for p in points])]),
        ("queue", "Queue and slots", "jobs / slots", [
            Series("queued", "s-queued", [p.queued for p in points]),
            Series("slots used", "s-used", [p.slots_used for p in points]),
            Series("slots max", "s-max", [p.slots_max for p in points]),
            Series("held on unknown", "s-unknown", [p.unknown for p in points])]),
        ("waits", "Waits and run times", "seconds, of the jobs that ended", [
            Series("wait p50", "s-wait50", [_seconds(p.wait_p50_ms) for p in points]),
            Series("wait p95", "s-wait95", [_seconds(p.wait_p95_ms) for p in points]),
            Series("run p50", "s-run50", [_seconds(p.run_p50_ms) for p in points])]),
    ]
    return [Chart(cid, title, unit, draw(*downsample(points, series)),
                  [(s.name, s.css, _latest(s.values, _label)) for s in series])
            for cid, title, unit, series in charts]
