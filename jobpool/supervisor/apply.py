"""Applying verdicts: each one a compare-and-set on the evidence it was based on.

The last step of a sweep (docs/architecture.md, 'Evidence and verdicts'). `reconcile_apply` and
`drop_ghost` run only while the row (or the running id) is still as the evidence saw it; a row that moved on
meanwhile (its worker heartbeat, finished, or another supervisor got there first) answers `Conflict` and is
left alone, which is what makes two supervisors at once safe. Eviction, the operator's override, stops the
job's container by label on the daemon it was recorded on before failing it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from .. import daemoncommands, errors
from ..store.calls import Store
from ..store.replies import Moved
from ..store.sweepcalls import InventoryFence, ReconcileCall
from . import remote
from .adoption import Adoptions
from .daemon import DaemonClient
from .probes import Absent, Probe
from .stopper import ContainerStopper
from .verdicts import APPLIED_KINDS, EXECUTOR_SUBPROCESS, EXIT_KINDS, Kind, RowSnapshot, Verdict

log = logging.getLogger("jobpool.supervisor")

#: Verdicts sent to Redis in one round trip (supervisor/apply.py `Applier.apply_all`): each script is its own
#: step, and Redis serves other clients between the reads of a long pipeline.
APPLY_BATCH = 200


class Applier:
    """Applies the verdicts of one pool's sweeps in the name of `actor` (recorded in each event)."""

    def __init__(self, store: Store, daemon: DaemonClient, adoptions: Adoptions, actor: str) -> None:
        self.store = store
        self.settings = store.settings
        self.daemon = daemon
        self.stopper = ContainerStopper(daemon)
        self.adoptions = adoptions
        self.actor = actor
        #: Daemon identities two daemons may share (identity -> why; jobpool/fleet/daemonmark.py), set by the
        #: Supervisor: no eviction of a job recorded on one, since stopping it "by label" may miss it.
        self.untrusted: Callable[[], Mapping[str, str]] | None = None

    def apply(self, row: RowSnapshot, verdict: Verdict, probe: Probe | None, pending: set[str]) -> str:
        """Apply one row's verdict; returns the outcome a `Decision` records. `pending` holds the ids whose
        adoption request is still pending (read once for the whole sweep)."""
        try:
            if verdict.kind in APPLIED_KINDS:
                return self.reconcile_apply(row, verdict, probe)
            if verdict.kind is Kind.ADOPT:
                if verdict.stale:
                    log.warning("job %s (attempt %d) kept, adoption asked: running past the stale limit (%s)",
                                row.id, row.attempt, verdict.evidence)
                if row.id in pending:
                    return "adoption pending"
                return self.adoptions.request(row)
            if verdict.kind is Kind.WARN:
                log.warning("job %s (attempt %d) kept: %s: %s", row.id, row.attempt, verdict.reason,
                            verdict.evidence)
                return "kept"
            if verdict.kind is Kind.EVICT:
                return self.evict(row, verdict)
            return "kept"
        except errors.RedisUnavailable:
            raise
        except errors.JobpoolError as exc:
            log.error("job %s: applying %s failed: %s", row.id, verdict.kind, exc)
            return f"error: {exc}"

    def apply_all(self, items: Sequence[tuple[RowSnapshot, Verdict, Probe | None]],
                  pending: set[str]) -> list[str]:
        """Apply one sweep's verdicts; returns each row's outcome, in order (see `apply`). The verdicts
        `reconcile_apply` changes go `APPLY_BATCH` to a round trip, each still a compare-and-set of its own
        on the evidence it was judged from; the others (adoption, warnings, evictions) one by one."""
        outcomes = [""] * len(items)
        batch = []
        for i, (row, verdict, probe) in enumerate(items):
            if verdict.kind in APPLIED_KINDS:
                batch.append(i)
            else:
                outcomes[i] = self.apply(row, verdict, probe, pending)
        for start in range(0, len(batch), APPLY_BATCH):
            chunk = batch[start:start + APPLY_BATCH]
            for i, outcome in zip(chunk, self.reconcile_apply_many([items[i] for i in chunk]), strict=True):
                outcomes[i] = outcome
        return outcomes

    def reconcile_apply(self, row: RowSnapshot, verdict: Verdict, probe: Probe | None) -> str:
        """End, requeue or redispatch a row whose owner is gone (`reconcile_apply.lua`); returns its state."""
        return self.reconcile_apply_many([(row, verdict, probe)])[0]

    def reconcile_apply_many(self, items: Sequence[tuple[RowSnapshot, Verdict, Probe | None]]) -> list[str]:
        """`reconcile_apply` for each item, the scripts in one round trip; each row's outcome: its new state,
        "conflict" (it moved on since its evidence was taken), "kept" or "error: ...". A Redis that cannot
        serve fails them all (`RedisUnavailable`), as one call's would fail the sweep."""
        outcomes = ["kept"] * len(items)
        calls, sent = [], []
        for i, (row, verdict, probe) in enumerate(items):
            never_started = isinstance(probe, Absent) and probe.never_started and bool(probe.container_id)
            if never_started and not self.stopper.remove(probe.container_id):  # type: ignore[union-attr]
                # A launcher that stalled between create and start may still start it: "never started" holds
                # only once the container can no longer be started, so it goes first. Not forced: Docker
                # orders the remove and a start in flight, and a container started meanwhile refuses a plain
                # remove; then the slot stays and the next sweep finds its lease renewed.
                log.warning("job %s attempt %d kept: its created container %s could not be removed (started "
                            "meanwhile?)", row.id, row.attempt, probe.container_id[:12])  # type: ignore[union-attr]
                continue
            inventory = getattr(probe, "inventory", None)  # from a daemon's inventory: fenced on it too
            fence = None
            if inventory and probe:
                fence = InventoryFence(inventory[0], inventory[1], remote.max_age_ms(
                    probe, row.daemon_id, self.settings.inventory_stale_secs, self.settings.lease_secs))
            # A redispatch promotes nothing: it takes the list its row routes it to instead.
            route = ((row.affinity_queue or self.store.keys.rq_queue) if verdict.kind is Kind.REDISPATCH
                     else None)
            calls.append(ReconcileCall(
                row.id, row.attempt, row.owner_boot, row.container_id, verdict.kind.value, verdict.reason,
                verdict.exit_code, self.settings.recovery_budget, verdict.evidence, self.actor, route, fence))
            sent.append(i)
        try:
            results: list[Moved | errors.JobpoolError] = self.store.reconcile_apply_many(calls)
        except errors.RedisUnavailable:
            raise
        except errors.JobpoolError as exc:  # the promotion candidates could not be read: nothing was sent
            results = [exc] * len(calls)
        for i, result in zip(sent, results, strict=True):
            row, verdict, probe = items[i]
            outcomes[i] = self._applied(row, verdict, probe, result)
        return outcomes

    def _applied(self, row: RowSnapshot, verdict: Verdict, probe: Probe | None,
                 result: Moved | errors.JobpoolError) -> str:
        """What one `reconcile_apply` did, logged; the ended container of an exit verdict is removed."""
        if isinstance(result, (errors.Conflict, errors.NotFound)):
            log.debug("job %s moved on since its evidence was taken; %s not applied", row.id, verdict.kind)
            return "conflict"
        if isinstance(result, errors.JobpoolError):
            log.error("job %s: applying %s failed: %s", row.id, verdict.kind, result)
            return f"error: {result}"
        log.info("job %s attempt %d: %s -> %s (%s)", row.id, row.attempt, verdict.kind, result.state,
                 verdict.evidence)
        # The exit code is on the row now; the ended container is the supervisor's to clean up, as its
        # dead watcher would have (an inventory's is its publisher's).
        if verdict.kind in EXIT_KINDS and verdict.container_id and not getattr(probe, "inventory", None):
            self.stopper.remove(verdict.container_id)
        return result.state

    def drop_ghost(self, job_id: str, verdict: Verdict) -> str:
        """Free the slot of a running id with no readable row (`drop_ghost.lua`); returns the outcome."""
        try:
            done = self.store.drop_ghost(job_id, verdict.evidence, self.actor)
        except errors.Conflict:
            return "conflict"
        except errors.RedisUnavailable:
            raise
        except errors.JobpoolError as exc:
            log.error("running id %s: dropping it failed: %s", job_id, exc)
            return f"error: {exc}"
        if not done.dropped:
            return "conflict"  # it left `running` meanwhile
        log.warning("running id %s had no readable row and no work left: dropped, slot freed (%s)", job_id,
                    verdict.evidence)
        return "dropped"

    def evict(self, row: RowSnapshot, verdict: Verdict) -> str:
        """Stop a stale live job by container label, then fail it `stale_evicted` (operator only)."""
        if row.executor == EXECUTOR_SUBPROCESS:
            log.error("job %s: evicting a subprocess job; jobpool never signals a pid it did not start in "
                      "this boot: its owner %s must stop it, or, if that worker is gone, stop the process "
                      "by hand "
                      "(recorded identity %s)", row.id, row.owner_boot, row.identity or "none")
        else:
            doubt = self.untrusted().get(row.daemon_id, "") if self.untrusted is not None else ""
            if doubt:
                log.error("job %s: not evicted: daemon %s may not be one daemon: %s", row.id, row.daemon_id,
                          doubt)
                return f"error: not evicted: daemon {row.daemon_id} may not be one daemon"
            try:
                ok, why = self.daemon.same_daemon(row.daemon_id)
            except Exception as exc:  # noqa: BLE001 - no daemon here
                ok, why = False, self.daemon.failed(exc)
            if not ok and self.settings.inventory_secs and daemoncommands.routable(row.daemon_id):
                # Stopped, then failed, by a worker on its own daemon (jobpool/daemoncommands.py).
                daemoncommands.route_stop(self.store, row.daemon_id, daemoncommands.StopCommand(
                    row.id, row.attempt, evict=True, reason=verdict.reason, evidence=verdict.evidence,
                    actor=self.actor))
                log.warning("job %s: eviction routed to the workers on daemon %s (%s)", row.id, row.daemon_id,
                            why)
                return f"eviction routed to daemon {row.daemon_id}"
            if not ok:
                # Stopping "by label" here would stop nothing on the daemon where it runs; evicting anyway
                # would hand its slot on while it still writes.
                log.error("job %s: not evicted: its container cannot be stopped from here: %s", row.id, why)
                return f"error: not evicted: {why}"
            try:
                stopped = self.stopper.stop_by_label(self.store.keys.pool, row.id, row.attempt,
                                                    self.settings.stop_grace_secs)
            except Exception as exc:  # noqa: BLE001 - not stopped means not evicted: the slot stays
                log.error("job %s: not evicted: its container could not be stopped: %s", row.id, exc)
                return f"error: container not stopped: {exc}"
            log.warning("job %s: stopped %d container(s) by label to evict it: %s", row.id, len(stopped),
                        ", ".join(c[:12] for c in stopped) or "none running")
        try:
            done = self.store.evict(row.id, row.attempt, verdict.reason, verdict.evidence, self.actor)
        except errors.Conflict:
            return "conflict"
        except errors.InvalidState as exc:
            return f"ended meanwhile as {exc.state}"
        self.store.finish_promotion(done, self.actor)
        return done.state
