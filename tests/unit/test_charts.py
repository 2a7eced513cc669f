"""The overview's history charts (jobpool/dashboard/charts.py): a line per series over the recorded points,
broken where a point is missing or has no figure, a dot for a point with no neighbour, a round top, and the
legend's latest values; no chart without points."""

from __future__ import annotations

import re

from jobpool.dashboard.charts import MAX_DRAWN, Series, downsample, history_charts, nice_ceiling
from jobpool.trends import TrendPoint

W = 60_000


def point(i: int, queued: int = 0, succeeded: int | None = 0, wait_ms: int | None = None) -> TrendPoint:
    return TrendPoint(at_ms=i * W, width_ms=W, queued=queued, waiting=0, running=1, slots_used=1, slots_max=4,
                      unknown=0, finished={"succeeded": succeeded, "failed": 0, "cancelled": 0},
                      wait_p50_ms=wait_ms, wait_p95_ms=wait_ms, run_p50_ms=None, run_p95_ms=None, sampled=0)


def test_no_points_no_charts() -> None:
    assert history_charts([]) == []


def test_nice_ceiling() -> None:
    assert [nice_ceiling(v) for v in (0, 1, 1.5, 3, 7, 12, 240, 2600)] == [1, 1, 2, 5, 10, 20, 250, 5000]


def test_a_missing_point_breaks_the_lines_and_a_lone_point_is_a_dot() -> None:
    # Points 0, 1, 2, then 4 (3 missing), then 6 alone; queued rises to 7.
    points = [point(0, 1), point(1, 3), point(2, 7), point(4, 2), point(6, 5)]
    charts = {c.id: c for c in history_charts(points)}
    assert list(charts) == ["throughput", "queue", "waits"]
    queue = str(charts["queue"].svg)
    queued = re.findall(r'<path class="s-queued" d="([^"]*)"', queue)
    assert len(queued) == 1 and queued[0].count("L") == 2, "points 0-2 joined; 4 and 6 are not"
    assert len(re.findall(r'<circle class="s-queued"', queue)) == 2
    assert ">10<" in queue and ">5<" in queue, "a round top (10) and its half"
    assert dict((name, latest) for name, _, latest in charts["queue"].legend)["queued"] == "5"


def test_a_point_without_a_figure_is_not_drawn_as_zero() -> None:
    points = [point(0, wait_ms=2000), point(1, wait_ms=None), point(2, wait_ms=4000)]
    waits = next(c for c in history_charts(points) if c.id == "waits")
    svg = str(waits.svg)
    assert "s-wait50" in svg and '<path class="s-wait50"' not in svg, "two dots, no line through the gap"
    assert len(re.findall(r'<circle class="s-wait50"', svg)) == 2
    assert dict((name, latest) for name, _, latest in waits.legend)["wait p50"] == "4"
    assert dict((name, latest) for name, _, latest in waits.legend)["run p50"] == "-"
    throughput = next(c for c in history_charts(points) if c.id == "throughput")
    assert throughput.unit == "jobs per minute"


def test_a_day_of_minutes_is_drawn_in_at_most_max_drawn_points_and_keeps_its_peaks() -> None:
    points = [point(i, queued=1) for i in range(1440)]
    points[700] = point(700, queued=37)  # one minute's peak
    del points[1000:1100]  # a hundred minutes no supervisor recorded
    drawn, [queued] = downsample(points, [Series("queued", "s-queued", [p.queued for p in points])])
    assert len(drawn) <= MAX_DRAWN and max(v for v in queued.values if v is not None) == 37
    step = drawn[0].width_ms
    assert step == 6 * W and all(p.at_ms % step == 0 for p in drawn)
    assert not any(1000 * W <= p.at_ms < 1098 * W for p in drawn), "a long gap stays a gap"
    chart = next(c for c in history_charts(points) if c.id == "queue")
    assert len(str(chart.svg)) < 20_000 and ">50<" in str(chart.svg), "the peak sets the top"
    assert dict((name, latest) for name, _, latest in chart.legend)["queued"] == "1", "the newest, not merged"
