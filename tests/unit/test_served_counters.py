"""`metrics.ServedCounters`: what one process serves of the `metrics` hash never goes back, whatever Redis
reads, and counts what Redis counts after a loss on top of what it served. Pure: Counters in, Counters out
(the real supervisor after a real Redis rollback: tests/integration/test_metrics.py)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from jobpool.metrics import Counters, Histogram, ServedCounters

BOUNDS = (1.0, 10.0)


def hist(own: list[int], sum_seconds: float) -> Histogram:
    """A histogram from each bucket's own count (the last: past the last bound)."""
    return Histogram.from_fields({**{str(b): n for b, n in zip(BOUNDS, own, strict=False)}, "inf": own[-1]},
                                 BOUNDS, 1.0, sum_seconds * 1000)


def read(enqueued: int, cancelled: int = 0, own: list[int] | None = None, sum_seconds: float = 0.0,
         recoveries: int = 0) -> Counters:
    transitions = {("queued", "enqueued"): enqueued}
    if cancelled:
        transitions[("cancelled", "cancel")] = cancelled
    return Counters(transitions=transitions, recoveries=recoveries, probes={"present": enqueued},
                    job_duration={"cancelled": hist(own or [0, 0, 0], sum_seconds)})


def test_a_rollback_is_served_from_where_it_was_and_what_follows_is_added() -> None:
    served = ServedCounters()
    assert served.update(read(1202, recoveries=4)).transitions[("queued", "enqueued")] == 1202
    back = served.update(read(601, recoveries=1))
    assert back.transitions[("queued", "enqueued")] == 1202 and back.recoveries == 4
    assert back.probes["present"] == 1202
    later = served.update(read(611, recoveries=2))
    assert later.transitions[("queued", "enqueued")] == 1212 and later.recoveries == 5


def test_a_series_redis_lost_altogether_is_still_served() -> None:
    served = ServedCounters()
    served.update(read(5, cancelled=3))
    back = served.update(read(2))
    assert back.transitions == {("queued", "enqueued"): 5, ("cancelled", "cancel"): 3}
    assert served.update(read(2, cancelled=1)).transitions[("cancelled", "cancel")] == 4


def test_a_histogram_stays_cumulative_and_its_count_is_its_total() -> None:
    served = ServedCounters()
    served.update(read(0, own=[3, 1, 0], sum_seconds=9.0))
    # Redis lost the three fast ones; since then one slow one was counted.
    h = served.update(read(0, own=[0, 2, 0], sum_seconds=8.0)).job_duration["cancelled"]
    assert h.buckets == ((1.0, 3), (10.0, 5), (math.inf, 5)) and h.count == 5 and h.sum_seconds == 9.0


own_counts = st.lists(st.integers(0, 9), min_size=3, max_size=3)
observations = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50), own_counts, st.floats(0, 1e6)),
                        min_size=1, max_size=12)


@given(observations)
def test_nothing_served_ever_goes_back_and_rises_pass_through(reads: list[tuple[int, int, list[int], float]]
                                                              ) -> None:
    served = ServedCounters()
    last: Counters | None = None
    previous_raw: Counters | None = None
    for enqueued, cancelled, own, sum_seconds in reads:
        raw = read(enqueued, cancelled, own, sum_seconds)
        now = served.update(raw)
        h = now.job_duration["cancelled"]
        assert [n for _, n in h.buckets] == sorted(n for _, n in h.buckets) and h.count == h.buckets[-1][1]
        if last is not None and previous_raw is not None:
            for key, n in last.transitions.items():
                assert now.transitions[key] >= n
                grew = raw.transitions.get(key, 0) - previous_raw.transitions.get(key, 0)
                if grew >= 0:  # Redis counted on: so does what is served, by as much
                    assert now.transitions[key] - n == grew
            before = last.job_duration["cancelled"]
            assert all(b >= a for (_, a), (_, b) in zip(before.buckets, h.buckets, strict=True))
            assert h.sum_seconds >= before.sum_seconds
        last, previous_raw = now, raw


def test_sweep_overruns_are_served_as_a_counter_through_a_rollback() -> None:
    served = ServedCounters()
    assert served.update(Counters(sweep_overruns=3)).sweep_overruns == 3
    assert served.update(Counters(sweep_overruns=1)).sweep_overruns == 3, "Redis lost two"
    assert served.update(Counters(sweep_overruns=2)).sweep_overruns == 4
