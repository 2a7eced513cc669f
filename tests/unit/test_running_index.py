"""Where the running jobs are (scripts/_lib.lua `place_running`: `running_by`, `running_daemons`,
`running_on`) always equals a recount of the rows, after any sequence of the scripts that change a running
row's state, owner, daemon or affinity, on fakeredis[lua] and on a real redis-server.

`jobpool status` and `/metrics` read each worker's jobs and each daemon's rows from it instead of reading
every running row (jobpool/status/read.py), so a script that changed a row without placing it again would make
them report what is not so. The machine below drives every such script: promotion (to the pool's queue, or to
a daemon's for a job with a checkpoint affinity), claim, launch on the claimed daemon or another, finish of
every kind (handbacks that leave an affinity, retries that wait), adoption, the supervisor's verdicts
(exited, absent, crashed, redispatch), eviction, cancel, pause and resume (`anywhere`, which releases an
affinity), a row deleted under a running id and its ghost dropped, and the waiting jobs released. The
registry machine (tests/unit/test_state_machine.py) checks the same after each of its steps.
"""

from __future__ import annotations

from typing import cast

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
from jobpool.workers.attempt import Attempt
from tests.support.pool_helpers import Backend, placement, placement_recount, reconcile

BOOTS = ("boot-1", "boot-2")
#: Two identities, none recorded, and a value no identity has (whitespace: placed under nothing).
DAEMONS = ("jpd1:aa@k1", "jpd1:bb@k2", "", "jpd1:hand edited@k3")
KINDS = ("exit0", "exit1", "interrupted", "crashed", "error", "handback", "oom")


class PlacementMachine(RuleBasedStateMachine):
    def __init__(self, backend: Backend) -> None:
        super().__init__()
        backend.raw.flushall()
        self.backend = backend
        self.pool = backend.pool(max_concurrent_jobs=3, lease_secs=30, recovery_budget=1)
        self.pool.set_slots(3)
        self.attempts: dict[str, Attempt] = {}  # job id -> the attempt that owns it, as far as we know

    # ---- reading ----

    def rows(self, state: str) -> list[tuple[str, dict[str, str]]]:
        c = self.pool.store.client
        ids = cast("list[str]", c.zrange(self.pool.keys.state_index(state), 0, -1))
        pipe = c.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.pool.keys.job(job_id))
        # In enqueue order: ids are random, and jobs promoted in one millisecond tie in the index, so an order
        # of either would make hypothesis draw other jobs when it replays an example.
        return sorted(((i, r) for i, r in zip(ids, pipe.execute(), strict=True) if r),
                      key=lambda item: int(item[1].get("seq") or 0))

    def claimed(self) -> list[tuple[str, dict[str, str]]]:
        return [(i, r) for i, r in self.rows("running") if r.get("owner_boot")]

    def unclaimed(self) -> list[tuple[str, dict[str, str]]]:
        return [(i, r) for i, r in self.rows("running") if not r.get("owner_boot")]

    def owner(self, job_id: str, r: dict[str, str]) -> Attempt:
        att = self.attempts.get(job_id)
        if att is None or att.boot_id != r["owner_boot"] or att.attempt != int(r["attempt"]):
            att = Attempt(self.pool.store, job_id, r["owner_boot"], int(r["attempt"]))
        return att

    # ---- rules ----

    @rule(retries=st.sampled_from([0, 0, 1]), n=st.integers(1, 3))
    def enqueue(self, retries: int, n: int) -> None:
        self.pool.enqueue_many([{"image": "img", "command": ["run"], "retries": retries}] * n)

    @rule()
    def promote(self) -> None:
        self.pool.promote()

    @precondition(lambda self: self.unclaimed())
    @rule(data=st.data())
    def claim(self, data: st.DataObject) -> None:
        """Workers take every promoted job, each on a daemon of theirs."""
        for job_id, r in self.unclaimed():
            boot, daemon = data.draw(st.sampled_from(BOOTS)), data.draw(st.sampled_from(DAEMONS))
            att = Attempt(self.pool.store, job_id, boot, int(r["attempt"]))
            att.claim("docker", daemon)
            self.attempts[job_id] = att

    @precondition(lambda self: self.claimed())
    @rule(data=st.data(), daemon=st.sampled_from(DAEMONS))
    def launch(self, data: st.DataObject, daemon: str) -> None:
        """What was launched, on the daemon claimed on or (a row edited, a daemon renamed) another."""
        job_id, r = data.draw(st.sampled_from(self.claimed()))
        self.owner(job_id, r).set_container("cid-" + job_id[:6], daemon)

    @precondition(lambda self: self.claimed())
    @rule(data=st.data(), daemon=st.sampled_from(DAEMONS[:2]))
    def handback(self, data: st.DataObject, daemon: str) -> None:
        """Launched on a daemon, then handed back by its own process (a drain): its checkpoint is there, so
        it waits for that daemon, promoted at once when a slot is free (placed under it, unclaimed)."""
        job_id, r = data.draw(st.sampled_from(self.claimed()))
        att = self.owner(job_id, r)
        att.set_container("cid-" + job_id[:6], daemon)
        att.finish("interrupted", 143)

    @precondition(lambda self: any(r.get("affinity") for _, r in self.rows("running")))
    @rule(data=st.data())
    def release_affinity(self, data: st.DataObject) -> None:
        """`resume --anywhere` of a job promoted to wait for its daemon: it waits for none any more."""
        job_id = data.draw(st.sampled_from([j for j, r in self.rows("running") if r.get("affinity")]))
        self.pool.resume(job_id, anywhere=True)

    @precondition(lambda self: self.claimed())
    @rule(data=st.data(), kind=st.sampled_from(KINDS))
    def finish(self, data: st.DataObject, kind: str) -> None:
        job_id, r = data.draw(st.sampled_from(self.claimed()))
        att = self.owner(job_id, r)
        if kind.startswith("exit"):
            att.finish("exit", int(kind[4:]))
        elif kind in ("crashed", "error", "handback"):
            att.finish(kind, 255 if kind == "crashed" else None, reason=f"{kind}: test")
        else:
            att.finish(kind, 137 if kind == "oom" else 143)

    @precondition(lambda self: self.claimed())
    @rule(data=st.data(), boot=st.sampled_from(BOOTS))
    def adopt(self, data: st.DataObject, boot: str) -> None:
        job_id, r = data.draw(st.sampled_from(self.claimed()))
        self.pool.store.client.delete(self.pool.keys.lease(job_id))
        try:
            me, *_ = Attempt.adopt(self.pool.store, job_id, r["owner_boot"], int(r["attempt"]), boot,
                                   "probe: running", r.get("daemon_id", ""))
        except errors.Conflict:  # no identity recorded, or one with whitespace: only the sweep can end it
            return
        self.attempts[job_id] = me

    @precondition(lambda self: self.rows("running"))
    @rule(data=st.data(), verdict=st.sampled_from(["absent", "exited", "crashed", "redispatch"]),
          code=st.sampled_from(["0", "1", "75"]))
    def verdict(self, data: st.DataObject, verdict: str, code: str) -> None:
        """A supervisor's verdict on a row whose owner is gone (or, redispatch, that no worker took)."""
        job_id, r = data.draw(st.sampled_from(self.rows("running")))
        if verdict == "redispatch" and r.get("owner_boot"):
            verdict = "absent"
        self.pool.store.client.delete(self.pool.keys.lease(job_id))
        reply = reconcile(self.pool, job_id, verdict, reason="host_rebooted" if verdict == "crashed" else "x",
                          code="" if verdict in ("absent", "redispatch") else code, budget=1)
        assert reply[0] == 0, reply

    @precondition(lambda self: self.rows("running"))
    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        job_id, r = data.draw(st.sampled_from(self.rows("running")))
        self.pool.evict(job_id, int(r["attempt"]))

    @precondition(lambda self: self.rows("running") or self.rows("queued"))
    @rule(data=st.data(), op=st.sampled_from(["cancel", "pause", "resume", "resume_anywhere"]))
    def intent(self, data: st.DataObject, op: str) -> None:
        rows = self.rows("running") + self.rows("queued") + self.rows("paused")
        job_id, _ = data.draw(st.sampled_from(rows))
        try:
            if op == "cancel":
                self.pool.cancel(job_id)
            elif op == "pause":
                self.pool.pause(job_id)
            else:
                self.pool.resume(job_id, anywhere=op == "resume_anywhere")
        except errors.InvalidState:
            pass

    @precondition(lambda self: self.rows("running"))
    @rule(data=st.data())
    def ghost(self, data: st.DataObject) -> None:
        """The row of a running job deleted (by hand, a bug): the operator's sweep drops its ghost."""
        job_id, _ = data.draw(st.sampled_from(self.rows("running")))
        c = self.pool.store.client
        c.delete(self.pool.keys.job(job_id), self.pool.keys.lease(job_id))
        assert self.pool.store.drop_ghost(job_id, "no container", "test").dropped

    @precondition(lambda self: self.rows("waiting"))
    @rule()
    def release_waiting(self) -> None:
        """The retries due now (their delay cut short in the index: when they are due is no placement's)."""
        ids = [i for i, _ in self.rows("waiting")]
        self.pool.store.client.zadd(self.pool.keys.waiting, dict.fromkeys(ids, 0))
        self.pool.store.release_waiting(ids, "test")

    @rule(n=st.sampled_from([0, 2, 3, 4]))
    def set_slots(self, n: int) -> None:
        self.pool.set_slots(n)

    # ---- the invariant ----

    @invariant()
    def placement_is_a_recount(self) -> None:
        got, want = placement(self.pool), placement_recount(self.pool)
        assert got == want, f"placed {got}\nrecounted {want}"
        assert self.pool.store.client.hget(self.pool.keys.config, "placed_kept") == "1"


def test_placement_equals_a_recount_after_every_step(backend: Backend) -> None:
    class OnThisBackend(PlacementMachine):  # a class, as hypothesis's signature asks
        def __init__(self) -> None:
            super().__init__(backend)

    run_state_machine_as_test(OnThisBackend, settings=settings(
        deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


def test_a_daemon_placed_keeps_its_count_and_rows_and_gives_them_back(backend: Backend) -> None:
    """The shape `status` reads: a claim places the job under its owner and daemon, a launch on another
    daemon moves it, a handback with a checkpoint promotes it to wait for that daemon (placed under it
    unclaimed), and its end takes everything back."""
    pool = backend.pool(max_concurrent_jobs=2)
    job = pool.enqueue(image="img", command=["run"])
    c = pool.store.client
    att = Attempt(pool.store, job.id, "boot-1", pool.get(job.id).attempt)
    att.claim("docker", "jpd1:aa@k1")
    assert c.hget(pool.keys.running_by, "b:boot-1") == job.id
    assert c.hgetall(pool.keys.running_daemons) == {"jpd1:aa@k1": "1"}
    att.set_container("cid", "jpd1:bb@k2")
    assert c.hgetall(pool.keys.running_daemons) == {"jpd1:bb@k2": "1"}
    assert c.zrange(pool.keys.running_on, 0, -1) == [f"jpd1:bb@k2 {job.id}"]
    assert att.finish("interrupted", 143) == "queued"  # handed back, promoted at once onto its daemon's queue
    assert pool.get(job.id).state.value == "running"
    assert c.hget(pool.keys.running_by, f"j:{job.id}") == " jpd1:bb@k2"
    assert not c.hexists(pool.keys.running_by, "b:boot-1")
    again = Attempt(pool.store, job.id, "boot-2", pool.get(job.id).attempt)
    again.claim("docker", "jpd1:bb@k2")
    assert again.finish("exit", 0) == "succeeded"
    assert placement(pool) == {"owned": {}, "as": {}, "counts": {}, "on": {}, "other": []}


def test_a_pool_with_jobs_running_from_before_the_placement_is_not_marked(backend: Backend) -> None:
    """`placed_kept` is written only when no job runs (every job running after it was placed as it
    started): a pool from before it, with a job running, reads its rows until then
    (jobpool/status/read.py)."""
    pool = backend.pool(max_concurrent_jobs=2)
    job = pool.enqueue(image="img", command=["run"])
    c = pool.store.client
    c.hdel(pool.keys.config, "placed_kept")  # as a pool from before it
    pool.enqueue(image="img", command=["run"])  # promoted beside the first: still not marked
    assert c.hget(pool.keys.config, "placed_kept") is None
    pool.cancel(job.id)
    for j in cast("list[str]", c.zrange(pool.keys.running, 0, -1)):
        pool.cancel(j)
    pool.promote()
    assert c.hget(pool.keys.config, "placed_kept") == "1"
