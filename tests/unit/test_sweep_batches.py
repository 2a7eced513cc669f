"""A sweep over many rows, the way a large fleet is swept (jobpool/supervisor/evidence.py, sweep.py,
apply.py), on fakeredis[lua] and a real redis-server:

- a row whose owner holds its lease (and is not past the stale limit) is kept after the first read, with
  no snapshot or verdict made for it, and reported exactly as `decide` would have judged it;
- the verdicts that change rows go to Redis a batch at a time, each still a compare-and-set on the evidence
  it was judged from: a row that moved on between the read and the apply (its worker back, its worker's own
  finish, a newer inventory of its daemon) is refused in its place, and the others of the batch are applied;
- the running rows are read a slice at a time (store/sweepio.py `running_brief`), each once, none that stays
  missed while rows leave the index between slices;
- Python's cyclic garbage collector does not run during a sweep (jobpool/gcpause.py).
"""

from __future__ import annotations

import gc
import json
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest
import redis

from jobpool.api import Pool
from jobpool.config import Settings
from jobpool.fleet.inventory import Entry
from jobpool.store import sweepio
from jobpool.store.redisurl import connect
from jobpool.supervisor import ContainerProber, Supervisor, apply, reconcile
from jobpool.supervisor.verdicts import Kind, RowSnapshot, decide
from jobpool.workers.attempt import Attempt
from tests.support.attempts import claim
from tests.support.inventories import orphan_on, publish
from tests.support.pool_helpers import Backend, enqueue, row, state_of
from tests.support.servers import RedisServer, free_port

NOWHERE = "unix:///nonexistent/jobpool-test.sock"  # a supervisor attached to no daemon
D1 = "jpd1:" + "e" * 32 + "@boot-1"
D2 = "jpd1:" + "f" * 32 + "@boot-1"  # another daemon, on another host


@pytest.fixture
def sweeper() -> Iterator[list[Supervisor]]:
    made: list[Supervisor] = []
    yield made
    for sup in made:
        sup.close()


def supervisor(pool: Pool, made: list[Supervisor]) -> Supervisor:
    made.append(Supervisor(pool.store, ContainerProber(NOWHERE, timeout=1)))
    return made[-1]


def test_rows_whose_owner_holds_its_lease_are_kept_as_decide_keeps_them(backend: Backend,
                                                                        sweeper: list[Supervisor]) -> None:
    pool = backend.pool(max_concurrent_jobs=6, job_stale_seconds=60)
    held = [enqueue(pool).id for _ in range(3)]
    for job_id in held:
        claim(pool, job_id, f"boot-{job_id}")
    stale = enqueue(pool).id
    claim(pool, stale, "boot-stale")
    pool.store.client.hset(pool.keys.job(stale), "claimed_at", pool.now_ms() - 120_000)
    orphan, _ = orphan_on(pool, D1)  # no inventory of its daemon: unknown, kept
    unclaimed = enqueue(pool).id  # promoted, on RQ's queue

    report = supervisor(pool, sweeper).sweep()
    assert report.rows == 6 and dict(report.verdicts) == {"keep": 4, "warn": 2}
    assert sorted(brief[0] for brief in report.held) == sorted(held)
    assert {d.job_id for d in report.judged} == {stale, orphan, unclaimed}, "the held rows were judged alone"
    decisions = {d.job_id: d for d in report.decisions}
    assert set(decisions) == {*held, stale, orphan, unclaimed}
    for job_id in held:
        snap = RowSnapshot.from_row(row(pool, job_id))
        expected = decide(snap, True, None, None, report.at_ms, pool.settings)
        d = decisions[job_id]
        assert (d.attempt, d.owner_boot, d.verdict, d.expected, d.outcome) == (
            snap.attempt, f"boot-{job_id}", expected, "running", "kept")
    assert decisions[stale].verdict.reason == "stale" and decisions[orphan].verdict.reason == "probe_unknown"
    assert all(state_of(pool, j) == "running" for j in decisions)

    # The operator's eviction sees past the held rows only to the stale one.
    preview = reconcile(pool.store, evict_stale=True, dry_run=True, prober=supervisor(pool, sweeper).prober)
    kinds = {d.job_id: (d.verdict.kind, d.outcome) for d in preview.decisions}
    assert kinds[stale][0] is Kind.EVICT
    assert all(kinds[j] == (Kind.KEEP, "not applied (dry run)") for j in held)


def test_a_batch_of_verdicts_applies_each_on_its_own_evidence(backend: Backend, sweeper: list[Supervisor],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apply, "APPLY_BATCH", 2)  # three round trips for five verdicts, in order
    pool = backend.pool(max_concurrent_jobs=5, recovery_budget=0)
    done, back, finished, gone = (orphan_on(pool, D1) for _ in range(4))
    fresh = orphan_on(pool, D2)
    publish(pool, D1, [Entry(j, a, "exited", 0, f"cid-{j}") for j, a in (done, back, finished)])
    publish(pool, D2, [Entry(fresh[0], fresh[1], "exited", 0, f"cid-{fresh[0]}")])
    sup = supervisor(pool, sweeper)
    snap = sup.evidence.read()
    probes = sup.evidence.probe(snap, sup.prober)
    items = [(r, decide(r, snap.lease[r.id], probes.get(r.id), None, snap.now_ms, pool.settings),
              probes.get(r.id)) for r in snap.rows]
    assert {r.id: v.kind for r, v, _ in items} == {done[0]: Kind.EXITED, back[0]: Kind.EXITED,
                                                   finished[0]: Kind.EXITED, fresh[0]: Kind.EXITED,
                                                   gone[0]: Kind.ABSENT}

    # Between the read and the apply: one worker is back (it renews its lease), another reports its own
    # exit, and the daemon of a third publishes again (what it says now is not what was judged).
    owner = row(pool, back[0])["owner_boot"]
    pool.store.client.set(pool.keys.lease(back[0]), f"{owner}:{back[1]}", px=30_000)
    Attempt(pool.store, finished[0], row(pool, finished[0])["owner_boot"], finished[1]).finish("exit", 3)
    publish(pool, D2, [Entry(fresh[0], fresh[1], "exited", 0, f"cid-{fresh[0]}")])

    outcomes = dict(zip((r.id for r, _, _ in items), sup.applier.apply_all(items, set()), strict=True))
    assert outcomes == {done[0]: "succeeded", back[0]: "conflict", finished[0]: "conflict",
                        fresh[0]: "conflict", gone[0]: "failed"}
    assert [state_of(pool, j) for j, _ in (done, back, finished, fresh, gone)] == [
        "succeeded", "running", "failed", "running", "failed"]
    assert row(pool, finished[0])["exit_code"] == "3", "the worker's own exit stands"
    assert pool.store.client.get(pool.keys.lease(back[0])) == f"{owner}:{back[1]}"
    # The next sweep judges the refused ones again, on what is true then.
    assert {d.job_id: d.outcome for d in sup.sweep().judged} == {fresh[0]: "succeeded"}


def two_exited_orphans_judged(pool: Pool, sweeper: list[Supervisor]) -> tuple[
        tuple[str, int], tuple[str, int], Supervisor, list[Any]]:
    """Two orphans on D1 whose containers exited 0, read, probed and judged: the batch a sweep would apply."""
    first, second = orphan_on(pool, D1), orphan_on(pool, D1)
    publish(pool, D1, [Entry(j, a, "exited", 0, f"cid-{j}") for j, a in (first, second)])
    sup = supervisor(pool, sweeper)
    snap = sup.evidence.read()
    probes = sup.evidence.probe(snap, sup.prober)
    items = [(r, decide(r, False, probes[r.id], None, snap.now_ms, pool.settings), probes[r.id])
             for r in snap.rows]
    return first, second, sup, items


def test_a_batch_survives_a_server_that_lost_its_scripts(backend: Backend, sweeper: list[Supervisor]) -> None:
    pool = backend.pool(max_concurrent_jobs=2, recovery_budget=0)
    first, second, sup, items = two_exited_orphans_judged(pool, sweeper)
    backend.client.script_flush()  # a restarted or failed-over server: NOSCRIPT, loaded and sent again
    assert sup.applier.apply_all(items, set()) == ["succeeded", "succeeded"]
    assert state_of(pool, first[0]) == state_of(pool, second[0]) == "succeeded"


def test_a_batch_a_demoted_primary_refused_is_sent_again_to_the_new_one(
        redis_server_factory: Callable[[], RedisServer], sweeper: list[Supervisor]) -> None:
    """Every call of the batch meets READONLY (this server became a replica: nothing of them ran); once it
    is a primary again (a failover's new primary), they are sent again and applied, as `Scripts.run` does."""
    server = redis_server_factory()
    server.start()
    pool = Pool(connect(server.url), Settings(max_concurrent_jobs=2, recovery_budget=0))
    admin = redis.Redis.from_url(server.url)
    try:
        first, second, sup, items = two_exited_orphans_judged(pool, sweeper)
        admin.replicaof("127.0.0.1", free_port())  # a primary nobody answers on: refuses every write
        with pytest.raises(redis.exceptions.ReadOnlyError):
            admin.set("jobpool-test-probe", "x")
        promoted = threading.Timer(0.5, admin.replicaof, args=("NO", "ONE"))
        promoted.start()
        assert sup.applier.apply_all(items, set()) == ["succeeded", "succeeded"]
        promoted.join()
        assert state_of(pool, first[0]) == state_of(pool, second[0]) == "succeeded"
    finally:
        admin.close()
        pool.store.close()


def _running(pool: Pool, n: int) -> list[str]:
    """`n` running rows, each claimed by a worker of its own (lease held), in the `running` index's order."""
    pool.set_slots(n)
    ids = [enqueue(pool).id for _ in range(n)]
    for job_id in ids:
        claim(pool, job_id, f"boot-{job_id}")
    return [str(m) for m in pool.store.client.zrange(pool.keys.running, 0, -1)]


@pytest.fixture
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of 10 rows overlapping by 3 (store/sweepio.py), so that a few dozen rows take several."""
    monkeypatch.setattr(sweepio, "BRIEF_SLICE", 10)
    monkeypatch.setattr(sweepio, "BRIEF_OVERLAP", 3)


def read_with(pool: Pool, monkeypatch: pytest.MonkeyPatch,
              before: Callable[[int], None]) -> tuple[list[tuple[Any, ...]], int]:
    """The running rows as the sweep reads them (owner and lease), `before(k)` run before its k-th command
    (the first comes with the server's time): what other clients do between the slices. And how many
    commands it sent."""
    replies = pool.store._brief_replies
    calls = 0

    def meanwhile(read: Any) -> Any:
        nonlocal calls
        before(calls)
        calls += 1
        return replies(read)

    monkeypatch.setattr(pool.store, "_brief_replies", meanwhile)
    return pool.store.running_brief(("owner_boot", "attempt"), True)[1], calls


def test_the_running_rows_are_read_a_slice_at_a_time_each_once(backend: Backend, small_slices: None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's first read takes the running rows `BRIEF_SLICE` a command (store/sweepio.py), never all
    of them in one: every row comes back once, with its owner and lease, in the index's order."""
    pool = backend.pool()
    ids = _running(pool, 35)
    rows, calls = read_with(pool, monkeypatch, lambda k: None)
    assert [r[0] for r in rows] == ids
    assert all(r[1] == f"boot-{r[0]}" and r[3] == f"boot-{r[0]}:{r[2]}" for r in rows)
    assert calls == 5  # slices at 0, 7, 14, 21, 28: the last one short


def test_rows_leaving_the_index_between_slices_cost_no_other_row_its_read(
        backend: Backend, small_slices: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between two slices, rows before the next slice's start leave the index (their jobs ended: every row
    after them moves up) and new ones enter at its end: as many leaving as the overlap still misses no row
    that stays, and none is read twice; a row that entered may be read or not (the next sweep reads it)."""
    pool = backend.pool()
    ids = _running(pool, 40)
    client = pool.store.client
    gone: list[str] = []
    entered: list[str] = []

    def before(k: int) -> None:
        if k:  # before each slice but the first, the first three rows leave
            first = [str(m) for m in client.zrange(pool.keys.running, 0, 2)]
            client.zrem(pool.keys.running, *first)
            gone.extend(first)
        entered.append(f"new-{k}")
        client.zadd(pool.keys.running, {entered[-1]: pool.now_ms() + 10_000})

    rows, _ = read_with(pool, monkeypatch, before)
    read = [r[0] for r in rows]
    stayed = [j for j in ids if j not in gone]
    assert len(gone) >= 9 and len(read) == len(set(read))
    assert [j for j in read if j in stayed] == stayed
    assert set(read) - set(stayed) <= set(gone) | set(entered)


def test_a_row_promoted_again_while_the_rows_are_read_is_read_once(backend: Backend, small_slices: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A row read in the first slice and promoted again before the second (its score now the newest: it
    moves to the end of the index, where the last slice reads it again) is kept once."""
    pool = backend.pool()
    ids = _running(pool, 25)

    def before(k: int) -> None:
        if k == 1:
            pool.store.client.zadd(pool.keys.running, {ids[0]: pool.now_ms() + 60_000})

    rows, calls = read_with(pool, monkeypatch, before)
    assert sorted(r[0] for r in rows) == sorted(ids) and calls == 4


def test_the_collector_does_not_run_during_a_sweep_and_runs_as_ever_after(backend: Backend,
                                                                         sweeper: list[Supervisor]) -> None:
    """A sweep that decodes an inventory of thousands of entries allocates far past the collector's first
    threshold; with the collector held off it never runs within the sweep (jobpool/gcpause.py), and it is
    on again after, as it was."""
    pool = backend.pool(max_concurrent_jobs=30, lease_secs=0.2, heartbeat_secs=0.1)
    orphans = [orphan_on(pool, D1) for _ in range(20)]
    listed = [Entry(f"other-{i}", 1, "running", container_id=f"c{i}") for i in range(3000)]
    publish(pool, D1, listed + [Entry(j, a, "running", container_id=f"o-{j}") for j, a in orphans])
    within: list[str] = []  # where each collection started: within a sweep, or not

    def collecting(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            frame: FrameType | None = sys._getframe(1)
            while frame is not None and frame.f_code is not Supervisor._sweep.__code__:
                frame = frame.f_back
            within.append("sweep" if frame is not None else "outside")

    sup = supervisor(pool, sweeper)
    gc.callbacks.append(collecting)
    try:
        report = sup.sweep(dry_run=True)
        decoded = [json.loads(json.dumps(e.encode())) for e in listed]  # the same allocations, outside one
    finally:
        gc.callbacks.remove(collecting)
    assert {d.job_id for d in report.decisions} >= {j for j, _ in orphans}
    assert "sweep" not in within, within
    assert len(decoded) == len(listed) and "outside" in within, "outside a sweep it collects as ever"
    assert gc.isenabled()
