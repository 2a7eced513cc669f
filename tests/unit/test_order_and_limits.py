"""Order and limits in the scripts (scripts/_lib.lua "Order and limits", scripts/limit.lua): priority,
weights, named limits and their patterns, fair share, parking and the reservation, on fakeredis[lua] and a
real redis-server. After every step the accounting is checked against the rows (`check_books`): the slots
in use are the running jobs' weights, each name's units in use are the running jobs' amounts of it, and no
limit or the slot limit is ever exceeded by what starts.
"""

from __future__ import annotations

import itertools
import types
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from jobpool import errors, submit
from jobpool.api import Pool
from jobpool.models import Job
from tests.support.attempts import claim
from tests.support.pool_helpers import Backend, enqueue, running_ids, state_of


def promoted_order(pool: Pool) -> list[str]:
    """The ids in the order their `promoted` events were written."""
    events = cast("list[tuple[str, dict[str, str]]]", pool.store.client.xrange(pool.keys.events, "-", "+"))
    return [e["job"] for _, e in events if e.get("reason") == "promoted"]


def check_books(pool: Pool, before: dict[str, int] | None = None) -> dict[str, int]:
    """The scripts' accounting agrees with the rows, and nothing runs over a limit: what is in use of the
    slots and of each name is within its limit, or (a limit lowered under running jobs stops nothing) no more
    than `before` (what was in use at the previous check). Returns what is in use now ('#slots' the slots)."""
    running = running_ids(pool)
    jobs = {job_id: pool.get(job_id) for job_id in running}
    use: dict[str, int] = {"#slots": sum(j.spec.slots for j in jobs.values())}
    assert pool.store.slots_in_use() == use["#slots"]
    for j in jobs.values():
        for name, amount in j.spec.uses.items():
            use[name] = use.get(name, 0) + amount
    stored = cast("dict[str, str]", pool.store.client.hgetall(pool.keys.limit_used))
    assert {k: int(v) for k, v in stored.items() if not k.startswith("=")} == {
        k: v for k, v in use.items() if k != "#slots" and v}
    limits = cast("dict[str, str]", pool.store.client.hgetall(pool.keys.limits))
    sizes = {k: int(v) for k, v in limits.items()}
    sizes["#slots"] = pool.slots()[1]
    for name, amount in use.items():
        size = sizes.get(name)
        if size is None:
            size = next((v for k, v in sorted(sizes.items(), key=lambda kv: -len(kv[0]))
                         if k.endswith("*") and name.startswith(k[:-1])), 0)
        assert amount <= size or amount <= (before or {}).get(name, 0), (
            f"{name}: {amount} units in use over its limit {size}")
    queued = cast("list[str]", pool.store.client.zrange(pool.keys.queued, 0, -1))
    ready = cast("list[str]", pool.store.client.zrange(pool.keys.ready, 0, -1))
    parked = [m.split(" ")[2] for m in cast("list[str]", pool.store.client.zrange(pool.keys.blocked, 0, -1))]
    assert sorted(ready + parked) == sorted(queued), "every queued job is ready or parked, once"
    return use


def finish(pool: Pool, job: Job, code: int = 0) -> None:
    claim(pool, job.id).finish("exit", code)
    check_books(pool)


def test_higher_priority_goes_first_and_equal_priorities_keep_enqueue_order(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    low = enqueue(pool, "low", priority=-5)
    first = enqueue(pool, "first")
    high = enqueue(pool, "high", priority=7)
    second = enqueue(pool, "second")
    top = enqueue(pool, "top", priority=1000)
    pool.set_slots(5)
    assert promoted_order(pool) == [top.id, high.id, first.id, second.id, low.id]
    check_books(pool)


def test_a_handed_back_job_keeps_its_place_within_its_priority(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    a = enqueue(pool, "a", priority=2)
    b = enqueue(pool, "b", priority=2)
    c = enqueue(pool, "c", priority=3)
    assert state_of(pool, a.id) == "running"
    claim(pool, a.id).finish("interrupted", 75)  # handed back: ahead of b, behind c (higher priority)
    assert state_of(pool, c.id) == "running"
    finish(pool, c)
    assert state_of(pool, a.id) == "running" and state_of(pool, b.id) == "queued"


def test_a_weighted_job_holds_its_slots_and_never_overshoots(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=3)
    one = enqueue(pool, "one")
    heavy = enqueue(pool, "heavy", slots=3)
    light = enqueue(pool, "light")
    # One slot held, two free: the heavy job (3) cannot start; the light job behind it does.
    assert [state_of(pool, j.id) for j in (one, heavy, light)] == ["running", "queued", "running"]
    check_books(pool)
    finish(pool, one)
    assert state_of(pool, heavy.id) == "queued"  # one slot still held by `light`
    finish(pool, light)
    assert state_of(pool, heavy.id) == "running" and pool.store.slots_in_use() == 3
    more = enqueue(pool, "more")
    assert state_of(pool, more.id) == "queued"
    finish(pool, heavy)
    assert state_of(pool, more.id) == "running" and pool.store.slots_in_use() == 1


def test_a_job_heavier_than_the_pool_is_refused_and_writes_nothing(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2)
    enqueue(pool)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidSpec, match="it needs 3 slots; the pool has 2"):
        enqueue(pool, slots=3)
    with pytest.raises(errors.InvalidSpec, match="slots"):
        enqueue(pool, slots=0)
    assert backend.keyspace() == before


def test_two_jobs_on_one_limit_never_overlap_and_others_pass_them(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=10)
    assert pool.set_limit("dataset:sales", 1) is None
    w1 = enqueue(pool, "w1", uses={"dataset:sales": 1})
    w2 = enqueue(pool, "w2", uses={"dataset:sales": 1})
    other = enqueue(pool, "other")
    assert [state_of(pool, j.id) for j in (w1, w2, other)] == ["running", "queued", "running"]
    assert [(u.name, u.size, u.used) for u in pool.limits()] == [("dataset:sales", 1, 1)]
    check_books(pool)
    finish(pool, w1)
    assert state_of(pool, w2.id) == "running"
    finish(pool, w2)
    assert [(u.name, u.used) for u in pool.limits()] == [("dataset:sales", 0)]


def test_a_pattern_gives_each_name_its_own_limit(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=10)
    pool.set_limit("dataset:*", 1)
    a1 = enqueue(pool, "a1", uses={"dataset:a": 1})
    a2 = enqueue(pool, "a2", uses={"dataset:a": 1})
    b1 = enqueue(pool, "b1", uses={"dataset:b": 1})
    assert [state_of(pool, j.id) for j in (a1, a2, b1)] == ["running", "queued", "running"]
    assert [(u.name, u.size, u.used) for u in pool.limits()] == [("dataset:*", 1, 2)]  # its names summed
    # A name's own limit, set later, is the one that counts for it.
    pool.set_limit("dataset:a", 2)
    assert state_of(pool, a2.id) == "running"
    check_books(pool)


def test_a_name_no_limit_covers_is_refused_and_writes_nothing(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=10)
    pool.set_limit("gpu", 2)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidSpec, match="no limit covers gpus"):
        enqueue(pool, uses={"gpus": 1})
    with pytest.raises(errors.InvalidSpec, match="not a name"):
        enqueue(pool, uses={"gpu*": 1})  # a pattern is no name a job can use
    assert backend.keyspace() == before


def test_lowering_a_limit_stops_nothing_and_raising_it_starts_the_waiters(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=10)
    pool.set_limit("gpu", 2)
    jobs = [enqueue(pool, str(i), uses={"gpu": 1}) for i in range(4)]
    assert [state_of(pool, j.id) for j in jobs] == ["running", "running", "queued", "queued"]
    assert pool.set_limit("gpu", 1) == 2
    assert [state_of(pool, j.id) for j in jobs] == ["running", "running", "queued", "queued"]
    finish(pool, jobs[0])
    assert state_of(pool, jobs[2].id) == "queued"  # still one in use, the new size
    pool.set_limit("gpu", 3)
    assert [state_of(pool, j.id) for j in jobs[1:]] == ["running", "running", "running"]
    check_books(pool)


def test_a_removed_limit_holds_its_waiters_until_one_covers_them_again(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=10)
    pool.set_limit("gpu", 1)
    a, b = enqueue(pool, "a", uses={"gpu": 1}), enqueue(pool, "b", uses={"gpu": 1})
    assert pool.remove_limit("gpu") == 1
    with pytest.raises(errors.NotFound):
        pool.remove_limit("gpu")
    finish(pool, a)
    assert state_of(pool, b.id) == "queued"  # never "unlimited"
    pool.set_limit("g*", 1)
    assert state_of(pool, b.id) == "running"


def test_groups_take_turns_among_equal_priorities(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    burst = [enqueue(pool, f"a{i}", group="tenant-a") for i in range(5)]
    single = enqueue(pool, "b", group="tenant-b")
    plain = enqueue(pool, "plain")
    pool.set_slots(7)
    order = promoted_order(pool)
    assert order.index(single.id) <= 2 and order.index(plain.id) <= 2  # one turn each, not behind the burst
    ids = {j.id for j in burst}
    assert [i for i in order if i in ids] == [j.id for j in burst]  # a group keeps its order


def test_a_job_passed_over_long_enough_gets_a_reservation(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2, reserve_after_secs=0)
    first = enqueue(pool, "first")
    heavy = enqueue(pool, "heavy", slots=2)
    # The heavy job cannot start beside `first`: passed over, and at once (0 s) reserved, so nothing more of
    # its priority starts ahead of it while that would take the slots it needs.
    light = enqueue(pool, "light")
    assert [state_of(pool, j.id) for j in (first, heavy, light)] == ["running", "queued", "queued"]
    assert str(pool.store.client.hget(pool.keys.config, "reserved")).startswith(heavy.id)
    urgent = enqueue(pool, "urgent", priority=1)  # a higher priority is not held back
    assert state_of(pool, urgent.id) == "running"
    finish(pool, first)
    assert state_of(pool, light.id) == "queued"  # a free slot, held for the reservation
    finish(pool, urgent)
    assert state_of(pool, heavy.id) == "running"
    assert pool.store.client.hget(pool.keys.config, "reserved") is None
    finish(pool, heavy)
    assert state_of(pool, light.id) == "running"


def test_without_the_wait_a_passed_job_is_not_reserved(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2, reserve_after_secs=3600)
    first = enqueue(pool, "first")
    heavy = enqueue(pool, "heavy", slots=2)
    late = enqueue(pool, "late")
    assert [state_of(pool, j.id) for j in (first, heavy, late)] == ["running", "queued", "running"]


def test_waiters_held_back_for_the_reservation_do_not_keep_it_from_the_free_slots(backend: Backend) -> None:
    """The reserved job waits for slots behind three jobs that, woken first when the last running job ends,
    are held back for it: it must still be woken, or nothing runs, nothing is released again, and every
    queued job waits for ever with every slot free (the chaos soak's job mix met this)."""
    pool = backend.pool(max_concurrent_jobs=3, reserve_after_secs=0)
    running = enqueue(pool, "running", slots=2)
    pool.pause()  # so the reserved job's group queues jobs ahead of it that are gone by the time it waits
    gone = [enqueue(pool, f"gone{i}", group="a") for i in range(3)]
    reserved = enqueue(pool, "reserved", slots=2, group="a")
    for job in gone:
        pool.cancel(job.id)
    pool.resume()  # parked: 2 slots needed, 1 free; then reserved, as passed over first
    ahead = [enqueue(pool, f"ahead{i}", slots=2, group="b") for i in range(3)]  # earlier turns, parked too
    assert str(pool.store.client.hget(pool.keys.config, "reserved")).startswith(reserved.id)
    finish(pool, running)
    assert state_of(pool, reserved.id) == "running"
    assert [state_of(pool, j.id) for j in ahead] == ["queued"] * 3
    finish(pool, reserved)  # one of them next (the reservation passes to whichever was passed over first)
    assert sorted(state_of(pool, j.id) for j in ahead) == ["queued", "queued", "running"]


def test_waiters_woken_for_slots_but_parked_on_a_limit_leave_the_slots_to_those_behind(
        backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=3)
    pool.set_limit("tape", 0)  # nothing may use it for now
    running = enqueue(pool, "running", slots=2)
    on_tape = [enqueue(pool, f"tape{i}", slots=2, uses={"tape": 1}) for i in range(3)]
    behind = enqueue(pool, "behind", slots=2)
    finish(pool, running)  # 3 slots free: the first three waiters woken, all parked again on `tape`
    assert state_of(pool, behind.id) == "running"
    assert [state_of(pool, j.id) for j in on_tape] == ["queued"] * 3


def test_a_ghost_gives_back_what_it_held(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=3)
    pool.set_limit("gpu", 1)
    held = enqueue(pool, "held", slots=2, uses={"gpu": 1})
    waiting = enqueue(pool, "waiting", uses={"gpu": 1})
    assert state_of(pool, held.id) == "running" and state_of(pool, waiting.id) == "queued"
    pool.store.client.delete(pool.keys.job(held.id))  # its row is gone: only `holds` knows what it held
    reply = pool.store.run("drop_ghost", [pool.keys.job(held.id), pool.keys.lease(held.id),
                                          *pool.store.candidates(4)], [held.id, "test", "t"])
    assert reply[:2] == [0, 1]
    pool.promote()
    assert state_of(pool, waiting.id) == "running"
    assert pool.store.slots_in_use() == 1 and [(u.name, u.used) for u in pool.limits()] == [("gpu", 1)]


def test_cancelling_a_parked_job_leaves_nothing_behind(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=5)
    pool.set_limit("gpu", 1)
    enqueue(pool, "a", uses={"gpu": 1})
    b = enqueue(pool, "b", uses={"gpu": 1})
    assert pool.store.client.zcard(pool.keys.blocked) == 1
    pool.cancel(b.id)
    assert pool.store.client.zcard(pool.keys.blocked) == 0 and pool.store.client.zcard(pool.keys.passed) == 0
    check_books(pool)


def test_a_parked_job_is_not_read_again_by_promotion(backend: Backend) -> None:
    """Jobs that cannot start leave `ready`: promoting into a free slot reads the promotable head only."""
    pool = backend.pool(max_concurrent_jobs=3)
    pool.set_limit("gpu", 1)
    enqueue(pool, "holder", uses={"gpu": 1})
    waiters = [enqueue(pool, f"w{i}", uses={"gpu": 1}) for i in range(50)]
    assert pool.store.client.zcard(pool.keys.blocked) == 50 and pool.store.client.zcard(pool.keys.ready) == 0
    free = enqueue(pool, "free")
    assert state_of(pool, free.id) == "running"
    assert all(state_of(pool, w.id) == "queued" for w in waiters)
    check_books(pool)


def test_limits_are_checked_at_the_api(backend: Backend) -> None:
    pool = backend.pool()
    before = backend.keyspace()
    for name, n in (("", 1), ("a b", 1), ("*", 1), ("a", -1), ("a", True), ("x" * 129, 1)):
        with pytest.raises(errors.InvalidArgument):
            pool.set_limit(name, n)
    for spec in ({"priority": 1001}, {"priority": "1"}, {"slots": 0}, {"uses": {"a b": 1}},
                 {"uses": {"gpu": 0}}, {"group": ""}, {"uses": ["gpu"]}):
        with pytest.raises(errors.InvalidSpec):
            enqueue(pool, **spec)
    assert backend.keyspace() == before


def test_why_a_queued_job_waits_is_said(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2)
    pool.set_limit("dataset:*", 1)
    holder = enqueue(pool, "holder", uses={"dataset:sales": 1})
    writer = enqueue(pool, "writer", uses={"dataset:sales": 1})
    heavy = enqueue(pool, "heavy", slots=2)
    plain = enqueue(pool, "plain")
    behind = enqueue(pool, "behind")
    assert pool.why_waiting(holder.id) == [] and state_of(pool, plain.id) == "running"
    said = f"dataset:sales 1/1 (limit dataset:*), needs 1, held by {holder.id}"
    assert pool.why_waiting(writer.id) == [said]
    assert pool.why_waiting(heavy.id) == ["needs 2 slots, 0 free of 2"]
    assert pool.why_waiting(behind.id) == ["next in line", "the pool is full: 2 of 2 slots in use"]
    pool.pause(None, reason="maintenance")
    assert pool.why_waiting(behind.id)[0] == "the queue is paused (jobpool resume)"
    pool.remove_limit("dataset:*")
    assert pool.why_waiting(writer.id) == [
        "the queue is paused (jobpool resume)",
        "no limit covers dataset:sales any more: it waits until one does (jobpool limit dataset:sales N)"]


def test_a_reservation_ends_with_its_job_and_what_it_held_back_goes(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2, reserve_after_secs=0)
    enqueue(pool, "first")
    heavy = enqueue(pool, "heavy", slots=2)
    light = enqueue(pool, "light")
    assert state_of(pool, light.id) == "queued"  # held back for the heavy job's reservation
    pool.cancel(heavy.id)
    assert pool.store.client.hget(pool.keys.config, "reserved") is None
    assert state_of(pool, light.id) == "running"
    check_books(pool)


def test_a_job_no_draining_can_satisfy_gets_no_reservation(backend: Backend) -> None:
    """A job waiting on a limit of 0 (a dataset frozen by its operator) would hold slots for nothing."""
    pool = backend.pool(max_concurrent_jobs=2, reserve_after_secs=0)
    pool.set_limit("dataset:frozen", 0)
    frozen = enqueue(pool, "frozen", uses={"dataset:frozen": 1})
    others = [enqueue(pool, f"o{i}") for i in range(2)]
    assert state_of(pool, frozen.id) == "queued"
    assert [state_of(pool, j.id) for j in others] == ["running", "running"]
    assert pool.store.client.hget(pool.keys.config, "reserved") is None
    # Its limit raised, it is attainable again: reserved, so the freed slot waits for it.
    pool.set_limit("dataset:frozen", 1)
    late = enqueue(pool, "late")
    finish(pool, others[0])
    assert state_of(pool, frozen.id) == "running" and state_of(pool, late.id) == "queued"


# ---- random sequences: the books always balance, nothing is ever over a limit, and no capacity is left idle
# while a job that could use it waits -----------------------------------------------------------------

USES: tuple[dict[str, int], ...] = ({}, {"gpu": 1}, {"dataset:a": 1}, {"dataset:b": 1},
                                    {"gpu": 1, "dataset:a": 1}, {"gpu": 2})


class OrderMachine(RuleBasedStateMachine):
    def __init__(self, backend: Backend) -> None:
        super().__init__()
        backend.raw.flushall()
        self.pool = backend.pool(max_concurrent_jobs=3, reserve_after_secs=0)
        self.pool.set_slots(3)
        self.pool.set_limit("gpu", 2)
        self.pool.set_limit("dataset:*", 1)
        self.ids: list[str] = []
        self.in_use: dict[str, int] = {}

    @rule(priority=st.sampled_from([-1, 0, 0, 2]), weight=st.sampled_from([1, 1, 2, 3]),
          uses=st.sampled_from(USES), group=st.sampled_from([None, "a", "b"]))
    def enqueue(self, priority: int, weight: int, uses: dict[str, int], group: str | None) -> None:
        try:
            job = enqueue(self.pool, priority=priority, slots=weight, uses=uses, group=group)
        except errors.InvalidSpec:  # heavier than the pool's limit now, or more than a name's limit
            sizes = {u.name: u.size for u in self.pool.limits()}
            over = [n for n, a in uses.items()
                    if 0 < sizes.get(n, sizes.get("dataset:*", 0) if n.startswith("dataset:") else 0) < a]
            refused_rightly = weight > self.pool.slots()[1] > 0 or over
            assert refused_rightly
            return
        self.ids.append(job.id)

    def _pick(self, data: st.DataObject, state: str) -> Job | None:
        jobs = [j for j in (self.pool.get(i) for i in self.ids) if j.state.value == state]
        return data.draw(st.sampled_from(jobs)) if jobs else None

    @rule(data=st.data(), how=st.sampled_from(["exit", "interrupted"]))
    def finish(self, data: st.DataObject, how: str) -> None:
        job = self._pick(data, "running")
        if job is not None:
            claim(self.pool, job.id).finish(how, 0 if how == "exit" else 75)

    @rule(data=st.data(), state=st.sampled_from(["queued", "running", "paused"]))
    def cancel(self, data: st.DataObject, state: str) -> None:
        job = self._pick(data, state)
        if job is not None:
            self.pool.cancel(job.id)

    @rule(data=st.data())
    def pause_and_resume(self, data: st.DataObject) -> None:
        job = self._pick(data, "queued")
        if job is not None:
            self.pool.pause(job.id)
        job = self._pick(data, "paused")
        if job is not None:
            self.pool.resume(job.id)

    @rule(name=st.sampled_from(["gpu", "dataset:*", "dataset:a"]), n=st.integers(0, 3))
    def set_limit(self, name: str, n: int) -> None:
        self.pool.set_limit(name, n)

    @rule(n=st.integers(1, 4))
    def set_slots(self, n: int) -> None:
        self.pool.set_slots(n)

    @invariant()
    def books_balance_and_nothing_idles(self) -> None:
        self.in_use = check_books(self.pool, self.in_use)
        assert self.pool.promote() == 0, "a job could have started and did not"
        self.in_use = check_books(self.pool, self.in_use)
        self.no_parked_job_could_start()

    def no_parked_job_could_start(self) -> None:
        """With no reservation held and the queue unpaused, a parked job waits for something it lacks."""
        client = self.pool.store.client
        if client.hget(self.pool.keys.config, "reserved") is not None or client.exists(self.pool.keys.paused):
            return
        used, size = self.pool.slots()
        sizes = {u.name: u.size for u in self.pool.limits()}
        in_use = self.pool.store.names_in_use(["gpu", "dataset:a", "dataset:b"])
        for member in cast("list[str]", client.zrange(self.pool.keys.blocked, 0, -1)):
            name, _, job_id, _need = member.split(" ")
            job = self.pool.get(job_id)
            fits = used + job.spec.slots <= size
            for used_name, amount in job.spec.uses.items():
                pattern = sizes.get("dataset:*") if used_name.startswith("dataset:") else None
                limit = sizes.get(used_name, pattern)
                fits = fits and limit is not None and in_use[used_name] + amount <= limit
            assert name != "#reserved", f"{job_id} held back for a reservation that is gone"
            assert not fits, f"{job_id} parked on {name} could start now"


def test_random_sequences_keep_the_books_and_leave_nothing_idle(backend: Backend,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Job ids from a counter, not random bytes: equal turns of different groups are ordered by id, and each
    # example must replay the same (hypothesis runs it again to shrink a failure).
    counter = itertools.count()
    ids = types.SimpleNamespace(urandom=lambda n: next(counter).to_bytes(n, "big"))
    monkeypatch.setattr(submit, "os", ids)

    class OnThisBackend(OrderMachine):
        def __init__(self) -> None:
            nonlocal counter
            counter = itertools.count()
            super().__init__(backend)

    run_state_machine_as_test(OnThisBackend, settings=settings(
        max_examples=40, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


def test_order_and_limits_are_part_of_what_coalesces(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    pool.set_limit("gpu", 1)
    base = enqueue(pool, "x", coalesce=True, uses={"gpu": 1}, priority=2)
    assert enqueue(pool, "x", coalesce=True, uses={"gpu": 1}, priority=2).id == base.id
    others: list[dict[str, Any]] = [{"priority": 3}, {"uses": {}}, {"slots": 2}, {"group": "g"}]
    for other in others:
        spec = {"uses": {"gpu": 1}, "priority": 2, **other}
        assert enqueue(pool, "x", coalesce=True, **spec).id != base.id
    jobs = pool.enqueue_many([{"image": "busybox", "command": ["y"], "priority": p} for p in (1, 5, 3)])
    pool.set_slots(10)
    order = [i for i in promoted_order(pool) if i in {j.id for j in jobs}]
    assert order == [jobs[1].id, jobs[2].id, jobs[0].id]


def test_a_job_needing_more_than_its_limit_is_refused_or_never_holds_up_the_rest(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=5)
    pool.set_limit("gpu", 2)
    before = backend.keyspace()
    with pytest.raises(errors.InvalidSpec, match="it needs 3 of gpu; its limit gpu is 2"):
        enqueue(pool, uses={"gpu": 3})
    assert backend.keyspace() == before
    holder = enqueue(pool, "holder", uses={"gpu": 1})
    big = enqueue(pool, "big", uses={"gpu": 2})
    small = [enqueue(pool, f"s{i}", uses={"gpu": 1}) for i in range(2)]
    assert state_of(pool, small[0].id) == "running" and state_of(pool, big.id) == "queued"
    pool.set_limit("gpu", 1)  # lowered under the big one's need: it can never start now
    finish(pool, holder)
    finish(pool, small[0])
    # The big job is first among gpu's waiters; it is woken, parks again, and the one behind it goes.
    assert state_of(pool, small[1].id) == "running" and state_of(pool, big.id) == "queued"
    assert pool.why_waiting(big.id) == ["gpu 1/1, needs 2, held by " + small[1].id]
    # Slots lowered under a queued job's weight: the same.
    pool.set_slots(2)
    heavy = enqueue(pool, "heavy", slots=2)
    light = enqueue(pool, "light")
    pool.set_slots(1)
    finish(pool, small[1])
    assert state_of(pool, light.id) == "running" and state_of(pool, heavy.id) == "queued"


def test_a_pool_from_before_weights_counts_its_running_jobs_once(backend: Backend) -> None:
    """Rows and counts written before order and limits existed: no `slots_used`, no `holds`. The first
    release counts the slots in use from `running` before taking the job out of it."""
    pool = backend.pool(max_concurrent_jobs=2)
    a, b = enqueue(pool, "a"), enqueue(pool, "b")
    waiting = enqueue(pool, "waiting")
    pool.store.client.hdel(pool.keys.config, "slots_used")  # as a pool from before weights has it
    finish(pool, a)
    assert pool.store.slots_in_use() == 2 and state_of(pool, waiting.id) == "running"
    late = enqueue(pool, "late")
    assert state_of(pool, late.id) == "queued"  # 2 of 2 in use: never a third
    finish(pool, b)
    assert state_of(pool, late.id) == "running"


def test_a_pool_from_before_ready_promotes_what_it_had_queued(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    first, second = enqueue(pool, "first"), enqueue(pool, "second")
    client = pool.store.client
    client.delete(pool.keys.ready)  # as a pool from before `ready` has it: its queued jobs in `queued` alone
    client.hdel(pool.keys.config, "ready_kept")
    finish(pool, first)
    assert state_of(pool, second.id) == "running"


def test_removing_a_limit_wakes_the_names_a_broader_one_covers(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=3)
    pool.set_limit("ds:*", 5)
    pool.set_limit("ds:a", 0)
    job = enqueue(pool, "a", uses={"ds:a": 1})
    assert state_of(pool, job.id) == "queued"
    pool.remove_limit("ds:a")
    assert state_of(pool, job.id) == "running"


def test_a_woken_job_that_leaves_lets_the_waiters_behind_it_go(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=3)
    pool.set_limit("x", 1)
    holder = enqueue(pool, "holder", uses={"x": 1})
    other = enqueue(pool, "other")
    first, behind = enqueue(pool, "first", uses={"x": 1}), enqueue(pool, "behind", uses={"x": 1})
    third = enqueue(pool, "third")
    urgent = enqueue(pool, "urgent", priority=1)  # the pool is full: it waits, ahead of everything
    finish(pool, holder)  # `first` is woken for x's unit, but `urgent` takes the slot
    assert state_of(pool, urgent.id) == "running" and state_of(pool, first.id) == "queued"
    pool.cancel(first.id)  # it leaves before using x's unit
    for job in (other, third, urgent):
        finish(pool, job)
    assert state_of(pool, behind.id) == "running"


def test_a_name_is_limited_by_what_covers_it_now(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=3)
    pool.set_limit("ds:*", 1)
    holder = enqueue(pool, "holder", uses={"ds:ab": 1})
    waiting = enqueue(pool, "waiting", uses={"ds:ab": 1})
    pool.set_limit("ds:a*", 0)  # a longer pattern over ds:ab: its limit from now on
    finish(pool, holder)
    assert state_of(pool, waiting.id) == "queued"
    assert pool.why_waiting(waiting.id) == ["ds:ab 0/0 (limit ds:a*), needs 1"]
    pool.set_limit("ds:a*", 1)
    assert state_of(pool, waiting.id) == "running"


def test_jobs_that_cannot_be_satisfied_do_not_keep_the_reservation_from_others(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=2, reserve_after_secs=0)
    pool.set_limit("hold", 0)
    for i in range(5):
        enqueue(pool, f"held{i}", uses={"hold": 1})  # passed over first, never attainable
    enqueue(pool, "light")
    heavy = enqueue(pool, "heavy", slots=2)
    for _ in range(3):  # each promotion looks at the 4 passed over longest, and sends the hopeless back
        pool.promote()
    assert str(pool.store.client.hget(pool.keys.config, "reserved")).startswith(heavy.id)


def test_a_release_does_not_walk_every_heavy_waiter(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=8)
    running = [enqueue(pool, f"r{i}") for i in range(7)]
    heavy = [enqueue(pool, f"h{i}", slots=4) for i in range(200)]
    assert pool.store.client.zcard(pool.keys.blocked) == 200
    finish(pool, running[0])  # 2 free: the first heavy waiter does not fit, and nobody behind it goes first
    assert pool.store.client.hlen(pool.keys.wake) == 0
    assert all(state_of(pool, j.id) == "queued" for j in heavy[:3])


def test_a_group_whose_jobs_were_cancelled_is_not_put_behind_others(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    for job in [enqueue(pool, f"a{i}", group="a") for i in range(5)]:
        pool.cancel(job.id)
    burst = [enqueue(pool, f"b{i}", group="b") for i in range(5)]
    late = enqueue(pool, "a-late", group="a")
    paused = burst[1]
    pool.pause(paused.id)
    pool.resume(paused.id)  # a resumed job keeps its place
    pool.set_slots(10)
    order = promoted_order(pool)
    assert order.index(late.id) <= 1
    assert [i for i in order if i in {j.id for j in burst}] == [j.id for j in burst]
    fields = cast("list[str]", pool.store.client.hkeys(pool.keys.fair))
    assert not any(k.startswith(("g:", "c:")) for k in fields)


def test_a_row_that_holds_no_slot_gives_nothing_back(backend: Backend) -> None:
    """A row that says running but is not in `running` (its slot already given back) frees nothing twice."""
    pool = backend.pool(max_concurrent_jobs=2)
    pool.set_limit("gpu", 1)
    job = enqueue(pool, "job", uses={"gpu": 1}, slots=2)
    attempt = claim(pool, job.id)
    pool.store.client.zrem(pool.keys.running, job.id)  # as if its slot had gone another way
    pool.store.client.hset(pool.keys.config, "slots_used", 2)  # ... while another job holds the slots
    attempt.finish("exit", 0)
    assert pool.store.slots_in_use() == 2 and [(u.name, u.used) for u in pool.limits()] == [("gpu", 1)]
