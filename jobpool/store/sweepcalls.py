"""`SweepCalls`: the supervisor's verdicts, each a compare-and-set on the evidence it was based on: an
eviction, a verdict on a row whose owner is gone (one at a time or a sweep's in one round trip), a ghost
dropped, and retention's removal of finished jobs (docs/architecture.md, "The supervisor").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import JobpoolError
from .replies import GhostDropped, Moved
from .scriptcalls import CANDIDATES_ON_RELEASE, ScriptCalls, moved


@dataclass(frozen=True)
class InventoryFence:
    """Evidence read from a daemon's inventory (jobpool/supervisor/remote.py): reconcile_apply is applied only
    while that inventory is the very one judged (same `at`) and no older than `max_age_ms`."""

    daemon_id: str
    at: int
    max_age_ms: int


@dataclass(frozen=True)
class ReconcileCall:
    """One verdict for `Store.reconcile_apply_many`: what `Store.reconcile_apply` takes."""

    job_id: str
    attempt: int
    owner_boot: str
    container_id: str
    verdict: str
    reason: str
    exit_code: int | None
    recovery_budget: int
    evidence: str
    actor: str
    route: str | None = None
    fence: InventoryFence | None = None


class SweepCalls(ScriptCalls):
    """The supervisor's verdicts and retention (a part of `store.calls.Store`)."""

    def evict(self, job_id: str, attempt: int, reason: str, evidence: str, actor: str,
              daemon_id: str = "") -> Moved:
        """Fail a running job if it is still at `attempt` (and on `daemon_id`, when given)."""
        return moved(self.run("evict", [self.keys.job(job_id), self.keys.lease(job_id),
                                         *self.candidates(CANDIDATES_ON_RELEASE)],
                               [job_id, attempt, reason, evidence, actor, daemon_id]))

    def prune(self, state: str, keep: int, cutoff_ms: int, actor: str, ids: Sequence[str],
              job_keys: Sequence[str]) -> list[str]:
        """Remove the finished jobs `ids` still past retention; returns the ids removed. `job_keys` are the
        seven keys per job scripts/prune.lua takes (jobpool/retention.py `batch_keys`)."""
        keys = [self.keys.rq_finished, self.keys.rq_failed, *job_keys]
        reply = self.run("prune", keys, [state, keep, cutoff_ms, actor, *ids])
        return [str(i) for i in reply[2:]]

    def reconcile_apply(self, job_id: str, attempt: int, owner_boot: str, container_id: str, verdict: str,
                        reason: str, exit_code: int | None, recovery_budget: int, evidence: str, actor: str,
                        route: str | None = None, fence: InventoryFence | None = None) -> Moved:
        """Apply a verdict on a row whose owner is gone, only while the row is as the evidence found it
        (scripts/reconcile_apply.lua). `route`: for a redispatch, the RQ list the row routes it to (it
        promotes nothing); `fence`: evidence from a daemon's inventory."""
        keys, args = self._reconcile_call(ReconcileCall(job_id, attempt, owner_boot, container_id, verdict,
                                                        reason, exit_code, recovery_budget, evidence, actor,
                                                        route, fence), self.candidates(CANDIDATES_ON_RELEASE))
        return moved(self.scripts.run("reconcile_apply", keys, args))

    def reconcile_apply_many(self, calls: Sequence[ReconcileCall]) -> list[Moved | JobpoolError]:
        """`reconcile_apply` for many rows in one round trip (a sweep's verdicts: runner.Scripts.run_many),
        each its own compare-and-set: a row that moved on is its own `Conflict`, in its place. They share one
        read of the promotion candidates, which each script checks against the queue's head."""
        if not calls:
            return []
        candidates = self.candidates(CANDIDATES_ON_RELEASE)
        replies = self.scripts.run_many("reconcile_apply",
                                        [self._reconcile_call(c, candidates) for c in calls])
        return [r if isinstance(r, JobpoolError) else moved(r) for r in replies]

    def _reconcile_call(self, c: ReconcileCall, candidates: list[str]) -> tuple[list[str], list[Any]]:
        k = self.keys
        keys = [k.job(c.job_id), k.lease(c.job_id), k.rq_job(c.job_id)]
        if c.route is not None:
            keys.append(c.route)
        else:
            if c.fence is not None:
                keys.append(k.inventory(c.fence.daemon_id))
            keys += candidates
        args = [c.job_id, c.attempt, c.owner_boot, c.container_id, c.verdict, c.reason,
                "" if c.exit_code is None else c.exit_code, c.recovery_budget, c.evidence, c.actor,
                *([c.fence.at, c.fence.max_age_ms] if c.fence else [])]
        return [*keys, *self._pool_keys["reconcile_apply"]], args

    def drop_ghost(self, job_id: str, evidence: str, actor: str) -> GhostDropped:
        reply = self.run("drop_ghost", [self.keys.job(job_id), self.keys.lease(job_id),
                                        *self.candidates(CANDIDATES_ON_RELEASE)], [job_id, evidence, actor])
        return GhostDropped(dropped=bool(int(reply[1])), promoted=int(reply[2]), why_stopped=reply[3])
