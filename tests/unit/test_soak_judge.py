"""The chaos soak's judge of an instant (bench/soak_order.py `Judge`) can fail: fed listings of running job
containers over the weighted slot limit and over a named limit (an exact one, and a name under a pattern), it
counts each, and the soak's zeros then do not hold; within the strays' bound after a Redis rollback the same
instants are stray instants (bench/soak_strays.py). And the soak's job mix is deterministic by its seed,
within the pool's slots, and only ever uses names its limits cover (a real pool accepts every draw). No
Docker: the listings are made up, as the sampler would hand them over."""

from __future__ import annotations

import random

from bench.soak import Figures
from bench.soak_order import LIMITS, JobBook, JobMix, Judge, Order, draw_order, limit_of, mix_counts
from bench.soak_strays import excuse_strays
from tests.support.pool_helpers import Backend

SLOTS = 3


def judge_with(**orders: Order) -> tuple[Judge, Figures]:
    book = JobBook()
    for job, order in orders.items():
        book.record(job, order)
    figures = Figures()
    return Judge(SLOTS, LIMITS, book, figures), figures


def listing(*jobs: str, daemon: int = 0) -> dict[str, tuple[int, str, str]]:
    """One running container per job named (a job named twice has two), as the sampler lists them."""
    return {f"c{i}-{job}".ljust(64, "0"): (daemon, job, "1") for i, job in enumerate(jobs)}


ORDERS = {
    "heavy": Order(slots=2, uses={"gpu": 1}),
    "gpu2": Order(uses={"gpu": 2}),
    "sales1": Order(uses={"dataset:sales": 1}),
    "sales2": Order(uses={"dataset:sales": 1}, priority=5),
    "stock": Order(uses={"dataset:stock": 1}, group="tenant-a"),
    "plain": Order(),
}


def test_instants_within_every_limit_break_no_zero_and_reach_the_peaks() -> None:
    judge, figures = judge_with(**ORDERS)
    judge(listing("heavy", "sales1"))  # 3 of 3 slots, gpu 1 of 2, dataset:sales 1 of 1
    judge(listing("gpu2", "sales1", "stock"))  # gpu 2 of 2; each dataset its own limit of 1
    assert (figures.samples, figures.over_limit_instants, figures.over_named_limit_instants) == (2, 0, 0)
    assert not figures.findings and figures.zeros_hold(), figures.line()
    assert figures.peaks == {"slots": 3, "gpu": 2, "dataset:*": 1}


def test_weights_summed_over_the_slot_limit_are_counted_though_the_containers_are_not() -> None:
    judge, figures = judge_with(**ORDERS)
    judge(listing("heavy", "stock", "plain"))  # 3 containers, 4 slots held
    assert figures.over_limit_instants == 1
    assert figures.over_named_limit_instants == 0
    assert figures.findings[0]["kind"] == "over_limit" and figures.findings[0]["weight"] == 4
    assert not figures.zeros_hold()
    assert "over_limit_instants=1 over_named_limit_instants=0" in figures.line()


def test_units_summed_over_a_named_limit_are_counted_exact_and_under_a_pattern() -> None:
    judge, figures = judge_with(**ORDERS)
    judge(listing("heavy", "gpu2"))  # gpu 3 of 2, 3 slots of 3
    judge(listing("sales1", "sales2", "stock"))  # dataset:sales 2 of its 1; dataset:stock 1 of 1
    judge(listing("sales1", "stock", "plain"))  # fine again
    assert figures.over_named_limit_instants == 2
    assert figures.over_limit_instants == 0
    assert [f["named"] for f in figures.findings] == [["gpu 3/2"], ["dataset:sales 2/1"]]
    assert [f["kind"] for f in figures.findings] == ["over_named_limit", "over_named_limit"]
    assert figures.peaks == {"slots": 3, "gpu": 3, "dataset:*": 2}
    assert not figures.zeros_hold()
    assert "over_named_limit_instants=2" in figures.line()


def test_two_containers_of_one_job_count_its_weight_and_units_twice() -> None:
    judge, figures = judge_with(**ORDERS)
    judge(listing("heavy", "heavy"))  # one job on two daemons' listings: 4 slots, gpu 2 of 2
    assert figures.double_container_jobs == {"heavy"}
    assert figures.over_limit_instants == 1 and figures.over_named_limit_instants == 0
    judge(listing("sales1", "sales1"))
    assert figures.over_named_limit_instants == 1


def counts(figures: Figures) -> tuple[int, int, int]:
    return figures.over_limit_instants, figures.over_named_limit_instants, figures.stray_instants


def test_a_broken_instant_after_a_rollback_that_took_back_its_job_is_a_stray_instant() -> None:
    judge, figures = judge_with(**ORDERS)
    judge(listing("heavy", "gpu2"))
    judge(listing("sales1", "sales2"))
    judge(listing("heavy", "stock", "plain"))
    at = figures.findings[0]["at"]
    # Judged again with no rollback: nothing excused, each count as the sampler made it.
    excuse_strays(figures, {}, SLOTS, bound_secs=5.0)
    assert counts(figures) == (1, 2, 0)
    # A rollback just before took back a transition of `sales2`: its instant is a stray's, the others stay.
    figures.rollbacks = [{"at": at - 1.0, "lost": [{"job": "sales2"}]}]
    excuse_strays(figures, {}, SLOTS, bound_secs=5.0)
    assert counts(figures) == (1, 1, 1)
    assert not figures.zeros_hold()


def test_a_job_the_book_does_not_know_counts_as_one_plain_slot() -> None:
    judge, figures = judge_with()
    judge(listing("a", "b", "c"))
    assert figures.over_limit_instants == 0
    judge(listing("a", "b", "c", "d"))
    assert figures.over_limit_instants == 1


def test_limit_of_takes_the_exact_name_else_the_longest_pattern() -> None:
    limits = {"gpu": 2, "dataset:*": 1, "dataset:big:*": 3, "gpu*": 9}
    assert limit_of("gpu", limits) == ("gpu", 2)
    assert limit_of("gpu-x", limits) == ("gpu*", 9)
    assert limit_of("dataset:sales", limits) == ("dataset:*", 1)
    assert limit_of("dataset:big:eu", limits) == ("dataset:big:*", 3)
    assert limit_of("tape", limits) is None


def test_the_mix_is_the_seeds_fits_the_slots_and_every_draw_is_accepted(backend: Backend) -> None:
    def draws(seed: int, slots: int, n: int) -> list[Order]:
        rng = random.Random(seed)
        return [draw_order(rng, slots) for _ in range(n)]

    first = draws(9, 2, 300)
    assert first == draws(9, 2, 300)
    assert first != draws(10, 2, 300)
    assert all(o.slots <= 2 for o in first)
    assert all(o.slots == 1 for o in draws(9, 1, 300))
    counts = mix_counts(first)
    assert all(counts[k] > 0 for k in ("weighted", "gpu", "dataset", "priority", "grouped")), counts
    assert all(limit_of(name, LIMITS) is not None for o in first for name in o.uses)

    pool = backend.pool(max_concurrent_jobs=0)  # nothing starts: the enqueue's checks alone are met
    for name, size in LIMITS.items():
        pool.set_limit(name, size)
    mix = JobMix(random.Random(9), 2)
    ids = [mix.enqueue(pool, ["true"]) for _ in range(60)]
    recorded = mix.book.orders(ids)
    assert list(recorded.values()) == first[:60]
    for job_id, order in recorded.items():
        spec = pool.get(job_id).spec
        assert (spec.priority, spec.slots, dict(spec.uses), spec.group) == (
            order.priority, order.slots, dict(order.uses), order.group)


def test_a_job_with_two_containers_of_one_attempt_after_a_rollback_is_a_stray_instant() -> None:
    """One attempt claimed twice is the trace of a claim Redis forgot, even when the event log never read
    the claim the rollback took back: within the bound it is a stray's instant; two containers of two
    attempts, or one long after the rollback, stay broken zeros."""
    judge, figures = judge_with(**ORDERS)
    judge(listing("heavy", "heavy"))  # both of attempt 1
    two_attempts = listing("gpu2")
    two_attempts["other".ljust(64, "0")] = (1, "gpu2", "2")
    judge(two_attempts)
    at = figures.findings[0]["at"]
    figures.rollbacks = [{"at": at - 1.0, "lost": []}]
    excuse_strays(figures, {}, SLOTS, bound_secs=5.0)
    assert figures.stray_instants == 1 and figures.double_container_jobs == {"gpu2"}
    excuse_strays(figures, {}, SLOTS, bound_secs=0.5)
    assert figures.stray_instants == 0 and figures.double_container_jobs == {"heavy", "gpu2"}
