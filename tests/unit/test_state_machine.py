"""A hypothesis state machine over the whole API, on fakeredis[lua] and on a real redis-server, checking the
registry's invariants after every step:

- promotion never overshoots: running <= max, or, after the limit was lowered, running never grows;
- no idle slot while work waits: with promotion unpaused and a slot free, nothing is queued;
- every job is in exactly one state index, and it is the row's `state`;
- FIFO: queued and paused jobs are scored by their seq, and promotion always takes the lowest seqs;
- the coalesce map only points at queued jobs with that key;
- terminal jobs hold no slot, no lease and no owner; a lease exists only for a claimed running row;
- RQ's list holds running jobs only, each once (a late delivery can never run a job that is not running);
- the events stream, replayed, gives exactly the running set;
- the running jobs are placed under their owners and daemons as their rows say (scripts/_lib.lua
  `place_running`, what `status` reads: tests/unit/test_running_index.py drives every script that moves them);
- a refused fenced write (wrong boot, old attempt) or a refused transition changes nothing at all.

Its length comes from the hypothesis profile tests/conftest.py loads: a quick pass locally, and under CI at
least `MACHINE_STEPS_CI` steps per backend, which the test checks it ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from jobpool import errors
from jobpool.models import JobState
from jobpool.spec import build_spec
from jobpool.workers.attempt import Attempt
from tests.support.constants import IN_CI, MACHINE_STEPS_CI
from tests.support.pool_helpers import Backend, placement, placement_recount, queued_ids
from tests.support.snapshot import keyspace

#: The daemon identity every claim records (adoption compares it: scripts/adopt.lua).
DAEMON = "jpd1:machine@boot"
BOOTS = ("boot-1", "boot-2", "boot-3")
COMMANDS = ("a", "b", "c")
TERMINAL = {"succeeded", "failed", "cancelled"}


class PoolMachine(RuleBasedStateMachine):
    def __init__(self, backend: Backend, steps: list[int]) -> None:
        super().__init__()
        backend.raw.flushall()  # every example starts from an empty Redis
        self.backend, self.steps, self.checks = backend, steps, 0
        self.pool = self.backend.pool(max_concurrent_jobs=2, lease_secs=30, heartbeat_secs=5,
                                      recovery_budget=1)
        # Written up front: before the first enqueue, Lua's default limit (1) and Pool.slots()' (the setting)
        # disagree, which tests/unit/test_scripts_control.py pins separately.
        self.pool.set_slots(2)
        self.ids: list[str] = []
        self.seen_attempts: list[Attempt] = []  # every attempt that ever owned a row
        self.prev_running = 0

    def teardown(self) -> None:
        # The invariants run once before the first step and once after each: steps are the checks less one.
        self.steps[0] += max(0, self.checks - 1)

    # ---- reading the registry ----

    def rows(self) -> dict[str, dict[str, str]]:
        pipe = self.pool.store.client.pipeline(transaction=False)
        for job_id in self.ids:
            pipe.hgetall(self.pool.keys.job(job_id))
        return dict(zip(self.ids, pipe.execute(), strict=True))

    def row(self, job_id: str) -> dict[str, str]:
        return cast("dict[str, str]", self.pool.store.client.hgetall(self.pool.keys.job(job_id)))

    def owners(self) -> dict[str, Attempt]:
        """The attempt that owns each claimed running row, read from Redis."""
        return {i: Attempt(self.pool.store, i, r["owner_boot"], int(r["attempt"]))
                for i, r in self.rows().items() if r["state"] == "running" and r["owner_boot"]}

    def owned(self) -> list[Attempt]:
        """The owning attempts in enqueue order (job ids are random: never order draws by them)."""
        return list(self.owners().values())

    def unclaimed(self) -> list[str]:
        return [i for i, r in self.rows().items() if r["state"] == "running" and not r["owner_boot"]]

    def max_slots(self) -> int:
        return self.pool.slots()[1]

    def queue_paused(self) -> bool:
        return bool(self.pool.store.client.exists(self.pool.keys.paused))

    def refused(self, exc: type[BaseException], call: Any) -> None:
        """`call` raises `exc` and writes nothing."""
        before = keyspace(self.backend.raw)
        try:
            call()
        except exc:
            pass
        else:
            raise AssertionError(f"expected {exc.__name__}")
        assert keyspace(self.backend.raw) == before, "a refused call wrote to Redis"

    # ---- rules ----

    @rule(command=st.sampled_from(COMMANDS), coalesce=st.booleans(), key=st.sampled_from([None, "k1", "k2"]))
    def enqueue(self, command: str, coalesce: bool, key: str | None) -> None:
        ck = ("key:" + key) if key else (build_spec({"image": "img", "command": [command]}).coalesce_key()
                                         if coalesce else "")
        twins = [i for i, r in self.rows().items()
                 if r["state"] == "queued" and ck and r["coalesce_key"] == ck]
        job = self.pool.enqueue(image="img", command=[command], coalesce=coalesce, coalesce_key=key)
        if twins:
            assert job.coalesced and job.id in twins, "a queued twin exists: enqueue must return it"
        else:
            assert not job.coalesced and job.id not in self.ids and job.coalesce_key == ck
            self.ids.append(job.id)

    @rule()
    def promote(self) -> None:
        queued = queued_ids(self.pool)
        free = max(0, self.max_slots() - len(self.pool.store.client.zrange(self.pool.keys.running, 0, -1)))
        n = self.pool.promote()
        expected = 0 if self.queue_paused() else min(free, len(queued))
        assert n == expected
        rows = self.rows()
        assert [rows[i]["state"] for i in queued[:n]] == ["running"] * n, "promotion skipped the head"
        assert all(rows[i]["state"] == "queued" for i in queued[n:])

    @precondition(lambda self: self.unclaimed())
    @rule(data=st.data(), boot=st.sampled_from(BOOTS))
    def claim(self, data: st.DataObject, boot: str) -> None:
        job_id = data.draw(st.sampled_from(self.unclaimed()))
        attempt = int(self.row(job_id)["attempt"])
        self.refused(errors.Conflict, lambda: Attempt(self.pool.store, job_id, boot, attempt + 1).claim())
        me = Attempt(self.pool.store, job_id, boot, attempt)
        me.claim("docker", DAEMON)
        self.seen_attempts.append(me)
        self.refused(errors.NotOwner, lambda: Attempt(self.pool.store, job_id, BOOTS[0], attempt).claim())

    @precondition(lambda self: self.owners())
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        me = data.draw(st.sampled_from(self.owned()))
        req = me.heartbeat()
        r = self.row(me.job_id)
        assert (req.pause, req.cancel) == (r["pause_requested"] == "1", r["cancel_requested"] == "1")
        assert self.pool.store.client.get(self.pool.keys.lease(me.job_id)) == f"{me.boot_id}:{me.attempt}"
        other = next(b for b in BOOTS if b != me.boot_id)
        self.refused(errors.NotOwner, Attempt(self.pool.store, me.job_id, other, me.attempt).heartbeat)

    @precondition(lambda self: self.owners())
    @rule(data=st.data(), kind=st.sampled_from(["exit", "interrupted", "error"]),
          code=st.sampled_from([0, 1, 75]))
    def finish(self, data: st.DataObject, kind: str, code: int) -> None:
        me = data.draw(st.sampled_from(self.owned()))
        before = self.row(me.job_id)
        if kind == "error":
            expected = "cancelled" if before["cancel_requested"] == "1" else "failed"
        elif code == 0:
            expected = "succeeded"
        elif before["cancel_requested"] == "1":
            expected = "cancelled"
        elif before["pause_requested"] == "1":
            expected = "paused"
        else:
            expected = "queued" if kind == "interrupted" else "failed"
        assert me.finish(kind, code, reason="launch failed") == expected
        after = self.row(me.job_id)
        assert after["state"] == expected or (expected == "queued" and after["state"] == "running")
        assert after["seq"] == before["seq"]
        if expected in ("queued", "paused"):
            assert after["recovery_attempts"] == before["recovery_attempts"], "a hand-back spent budget"

    @precondition(lambda self: self.owners())
    @rule(data=st.data(), adopt=st.booleans())
    def worker_dies(self, data: st.DataObject, adopt: bool) -> None:
        """The owner's lease vanishes; the supervisor reconciles the row as absent, or a live boot adopts."""
        me = data.draw(st.sampled_from(self.owned()))
        r = self.row(me.job_id)
        self.pool.store.client.delete(self.pool.keys.lease(me.job_id))
        if adopt:
            heir = next(b for b in BOOTS if b != me.boot_id)
            new, *_ = Attempt.adopt(self.pool.store, me.job_id, me.boot_id, me.attempt, heir,
                                    "probe: running", daemon_id=DAEMON)
            self.seen_attempts.append(new)
            return
        k = self.pool.keys
        keys = [k.job(me.job_id), k.lease(me.job_id), k.rq_job(me.job_id), *self.pool.store.candidates(4)]
        args = [me.job_id, me.attempt, me.boot_id, r.get("container_id", ""), "absent", "orphan", "", 1,
                "probe: absent", "supervisor"]
        reply = self.pool.store.run("reconcile_apply", keys, args)
        if r["cancel_requested"] == "1":
            assert reply[1] == "cancelled"
        elif r["pause_requested"] == "1":
            assert reply[1] == "paused"
        else:
            assert reply[1] == ("queued" if int(r["recovery_attempts"]) < 1 else "failed")
        self.pool.promote()  # the sweep: reconcile, then promote

    @precondition(lambda self: self.seen_attempts)
    @rule(data=st.data(), op=st.sampled_from(["heartbeat", "set_container", "finish"]))
    def fenced_write_from_a_non_owner(self, data: st.DataObject, op: str) -> None:
        owners = {(a.job_id, a.boot_id, a.attempt) for a in self.owners().values()}
        stale = [a for a in self.seen_attempts if (a.job_id, a.boot_id, a.attempt) not in owners]
        forged = [Attempt(self.pool.store, a.job_id, b, a.attempt) for a in self.owners().values()
                  for b in BOOTS if b != a.boot_id]
        if not stale + forged:
            return
        wrong = data.draw(st.sampled_from(stale + forged))
        call: Callable[[], object] = {"heartbeat": wrong.heartbeat,
                                      "set_container": lambda: wrong.set_container("evil", "d"),
                                      "finish": lambda: wrong.finish("exit", 0)}[op]
        r = self.row(wrong.job_id)
        if op == "finish" and r.get("finished_by") == f"{wrong.boot_id}:{wrong.attempt}":
            # Its own finish again (a lost reply retried): the answer it had then, and nothing written.
            before = keyspace(self.backend.raw)
            assert call() == r["finished_as"]
            assert keyspace(self.backend.raw) == before, "a repeated finish wrote to Redis"
            return
        self.refused(errors.NotOwner, call)

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def pause_job(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.ids))
        r = self.row(job_id)
        if r["state"] not in ("queued", "running"):
            self.refused(errors.InvalidState, lambda: self.pool.pause(job_id))
            return
        job = self.pool.pause(job_id, reason="user")
        assert job is not None
        if r["state"] == "running" and r["owner_boot"]:
            assert job.state is JobState.RUNNING and job.pause_requested
        else:
            assert job.state is JobState.PAUSED and job.seq == int(r["seq"])

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def resume_job(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.ids))
        r = self.row(job_id)
        if not (r["state"] == "paused" or (r["state"] == "running" and r["pause_requested"] == "1")):
            self.refused(errors.InvalidState, lambda: self.pool.resume(job_id))
            return
        job = self.pool.resume(job_id)
        assert job is not None and not job.pause_requested
        allowed = (JobState.QUEUED, JobState.RUNNING) if r["state"] == "paused" else (JobState.RUNNING,)
        assert job.state in allowed

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.ids))
        r = self.row(job_id)
        if r["state"] in TERMINAL:
            self.refused(errors.InvalidState, lambda: self.pool.cancel(job_id))
            return
        job = self.pool.cancel(job_id)
        if r["state"] == "running" and r["owner_boot"]:
            assert job.state is JobState.RUNNING and job.cancel_requested
        else:
            assert job.state is JobState.CANCELLED

    @precondition(lambda self: self.owners())
    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        me = data.draw(st.sampled_from(self.owned()))
        self.refused(errors.Conflict, lambda: self.pool.evict(me.job_id, me.attempt + 1))
        assert self.pool.evict(me.job_id, me.attempt).state is JobState.FAILED

    @rule()
    def pause_queue(self) -> None:
        self.pool.pause(None, reason="ops")

    @rule()
    def resume_queue(self) -> None:
        self.pool.resume(None)

    @rule(n=st.integers(0, 4))
    def set_slots(self, n: int) -> None:
        old = self.max_slots()
        assert self.pool.set_slots(n) == old

    # ---- invariants: one read of the registry per step, then every property ----

    @invariant()
    def registry_invariants(self) -> None:
        self.checks += 1
        keys, pipe = self.pool.keys, self.pool.store.client.pipeline(transaction=False)
        for job_id in self.ids:
            pipe.hgetall(keys.job(job_id))
            pipe.get(keys.lease(job_id))
        for st_ in JobState:
            pipe.zrange(keys.state_index(st_.value), 0, -1, withscores=True)
        pipe.hget(keys.config, "max_concurrent_jobs")
        pipe.exists(keys.paused)
        pipe.hgetall(keys.coalesce)
        pipe.lrange(keys.rq_queue, 0, -1)
        pipe.xrange(keys.events, "-", "+")
        *per_job, mx, paused, coalesce, rq_listed, events = pipe.execute()
        rows = dict(zip(self.ids, per_job[:2 * len(self.ids):2], strict=True))
        leases = dict(zip(self.ids, per_job[1:2 * len(self.ids):2], strict=True))
        index = {st_.value: dict(z) for st_, z in zip(JobState, per_job[2 * len(self.ids):], strict=True)}
        running = set(index["running"])
        self.check_slots(len(running), int(mx), bool(paused), len(index["queued"]))
        self.check_indexes(rows, index)
        self.check_leases_and_slots(rows, leases, running)
        holders = {(ck, job_id) for ck, ids in coalesce.items() for job_id in ids.split()}
        for ck, job_id in holders:
            assert rows[job_id]["state"] == "queued" and rows[job_id]["coalesce_key"] == ck, (
                f"coalesce {ck!r} points at a {rows[job_id]['state']} job")
        waiting = {(r["coalesce_key"], i) for i, r in rows.items()
                   if r["state"] == "queued" and r["coalesce_key"]}
        assert waiting == holders, "a queued job with a coalesce key is not found by it, or one not queued is"
        assert len(rq_listed) == len(set(rq_listed)), "a job is on RQ's list twice"
        assert set(rq_listed) == running, "RQ's list holds a job not running (nothing consumes it here)"
        assert replay_running(events) == running, "the events stream does not replay to the running set"
        assert placement(self.pool) == placement_recount(self.pool), "running jobs placed as no row says"

    def check_slots(self, running: int, mx: int, paused: bool, queued: int) -> None:
        assert running <= mx or running <= self.prev_running, f"running grew to {running} above limit {mx}"
        self.prev_running = running
        assert paused or running >= mx or queued == 0, "a slot is free, promotion unpaused, yet a job waits"

    def check_indexes(self, rows: dict[str, dict[str, str]], index: dict[str, dict[str, float]]) -> None:
        assert set().union(*index.values()) == set(self.ids), "an index holds an unknown job, or lost one"
        for job_id, r in rows.items():
            assert [s for s, members in index.items() if job_id in members] == [r["state"]], (
                f"job in the wrong or in several indexes: {r['state']}")
        # FIFO: in enqueue order (by seq), every score its own (one priority, no group: docs/architecture.md
        # "Order and limits"; a turn is the seq until a group with none waiting is forgotten)
        waiting = {**index["queued"], **index["paused"]}
        by_score = sorted(waiting, key=lambda i: waiting[i])
        by_seq = sorted(waiting, key=lambda i: int(rows[i]["seq"]))
        assert by_score == by_seq, "waiting jobs out of enqueue order"
        assert len(set(waiting.values())) == len(waiting), "two waiting jobs share a place"

    @staticmethod
    def check_leases_and_slots(rows: dict[str, dict[str, str]], leases: dict[str, str | None],
                               running: set[str]) -> None:
        for job_id, r in rows.items():
            if r["state"] == "running" and r["owner_boot"]:
                assert leases[job_id] == f"{r['owner_boot']}:{r['attempt']}"
            else:
                assert leases[job_id] is None, f"a {r['state']} job (owner {r['owner_boot']!r}) holds a lease"
            if r["state"] in TERMINAL:
                assert job_id not in running and r.get("owner_boot", "") == "" and r.get("finished_at"), (
                    f"a {r['state']} job still holds a slot or an owner")


def replay_running(events: list[tuple[str, dict[str, str]]]) -> set[str]:
    """The running set rebuilt from transitions alone."""
    running: set[str] = set()
    for _, ev in events:
        if ev["to"] == "running" and ev["from"] != "running":
            running.add(ev["job"])
        elif ev["from"] == "running" and ev["to"] != "running":
            running.discard(ev["job"])
    return running


def test_the_registry_invariants_hold_after_every_step(backend: Backend) -> None:
    steps = [0]

    class OnThisBackend(PoolMachine):  # a class, as hypothesis's signature asks, not a factory function
        def __init__(self) -> None:
            super().__init__(backend, steps)

    run_state_machine_as_test(OnThisBackend, settings=settings(
        deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    if IN_CI:
        assert steps[0] >= MACHINE_STEPS_CI, f"only {steps[0]} steps ran on {backend.name}"
