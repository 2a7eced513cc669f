"""The sweep: reconcile every running row against ground truth, then promote.

One sweep follows the flow of docs/architecture.md, 'Evidence and verdicts': read the evidence with no lock
held (`evidence.py`), judge each row with pure functions (`verdicts.py`), apply each verdict compare-and-set
on the evidence it was based on (`apply.py`, with adoption requests in `adoption.py`), then promote. A row
that moved on meanwhile answers `Conflict` and is left alone, which is what makes two supervisors at once
safe.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from collections import Counter
from collections.abc import Iterable, Mapping

from .. import errors, gcpause, metrics, retention
from ..config import Settings
from ..fleet import daemonmark, markrecords
from ..fleet.gone import declared
from ..store.calls import Store
from . import volumes
from .adoption import Adoptions
from .apply import Applier
from .evidence import Evidence, Snapshot
from .probes import ContainerProber, Probe, Unknown, result_name
from .report import Decision, SweepReport
from .stopper import remove_empty_cgroups
from .verdicts import Kind, RowSnapshot, decide, decide_ghost, expected_state, hold_while_recovering

log = logging.getLogger("jobpool.supervisor")


def actor_name(role: str = "supervisor") -> str:
    """Who a sweep acts as, recorded in every event it writes: `supervisor` or `operator`, host and pid."""
    return f"{role}:{socket.gethostname()}:{os.getpid()}"


class Supervisor:
    """Sweeps one pool. Holds what is worth keeping between sweeps: the Docker client, an RQ connection, and
    what the evidence reader learnt (see `Evidence`)."""

    def __init__(self, store: Store, prober: ContainerProber | None = None, actor: str | None = None,
                 marker: daemonmark.Marker | None = None) -> None:
        self.store = store
        self.settings: Settings = store.settings
        self.prober = prober or ContainerProber(os.environ.get("DOCKER_HOST") or None,
                                                timeout=store.settings.probe_timeout_secs)
        self.actor = actor or actor_name()
        self.evidence = Evidence(store)
        self.adoptions = Adoptions(store)
        self.applier = Applier(store, self.prober, self.adoptions, self.actor)
        self.applier.untrusted = self.untrusted_daemons
        self._volumes_at = -math.inf
        #: This supervisor's mark on its daemon (jobpool/fleet/daemonmark.py; the loop's: run_supervisor), or
        #: None.
        self.marker = marker

    def close(self) -> None:
        if self.marker is not None:
            self.marker.stop()  # its record, then its mark
            self.marker = None
        self.prober.close()
        self.adoptions.close()

    def sweep(self, evict_stale: bool = False, dry_run: bool = False,
              job_ids: Iterable[str] | None = None) -> SweepReport:
        """Reconcile every running row (or just `job_ids`), then promote; returns what was decided."""
        try:
            with gcpause.paused():  # a sweep holds every running row: jobpool/gcpause.py
                return self._sweep(evict_stale, dry_run, job_ids)
        except errors.RedisUnavailable:
            # Whichever step met it, leases may lapse while Redis is away: the next sweeps hold "absent".
            self.evidence.redis_lost()
            raise

    def _sweep(self, evict_stale: bool, dry_run: bool, job_ids: Iterable[str] | None) -> SweepReport:
        started = time.perf_counter()
        snap = self.evidence.read(job_ids, evict_stale)
        if not dry_run:
            self._release_gone_affinities(snap)
        recovering = self.evidence.redis_recovering()
        t_read = time.perf_counter()
        probes = self.evidence.probe(snap, self.prober, self.untrusted_daemons)
        remove_empty_cgroups(probes.values())
        t_probe = time.perf_counter()
        report = SweepReport(self.store.keys.pool, at_ms=snap.now_ms, rows=snap.total, dry_run=dry_run,
                             interval_ms=self.settings.sweep_interval_secs * 1000)
        report.keep_held(snap.held)
        decided = [(row, probes.get(row.id)) for row in snap.rows]
        verdicts = [decide(row, snap.lease[row.id], probe, snap.dispatch.get(row.id), snap.now_ms,
                           self.settings, evict_stale=evict_stale) for row, probe in decided]
        verdicts = [hold_while_recovering(v, recovering) for v in verdicts]
        pending: set[str] = set()
        if not dry_run:
            pending = self.adoptions.pending([row for (row, _), v in zip(decided, verdicts, strict=True)
                                              if v.kind is Kind.ADOPT])
        decisions = []
        for (row, probe), verdict in zip(decided, verdicts, strict=True):
            decision = Decision(row.id, row.attempt, row.owner_boot, verdict,
                                expected_state(row, verdict, self.settings))
            report.record(decision, isinstance(probe, Unknown))
            decisions.append(decision)
        outcomes = (["not applied (dry run)"] * len(decisions) if dry_run else self.applier.apply_all(
            [(row, v, probe) for (row, probe), v in zip(decided, verdicts, strict=True)], pending))
        for decision, outcome in zip(decisions, outcomes, strict=True):
            decision.outcome = outcome
            report.conflicts += outcome == "conflict"
        self._judge_ghosts(snap, probes, report, evict_stale, dry_run)
        t_apply = time.perf_counter()
        if not dry_run:
            report.promoted = self.store.promote_all(self.actor)
        t_promote = time.perf_counter()
        if not dry_run and job_ids is None:
            report.pruned = self._prune()
            self._remove_leftovers(recovering)
        done = time.perf_counter()
        report.duration_ms = (done - started) * 1000
        report.overran = not dry_run and job_ids is None and report.duration_ms > report.interval_ms
        report.phases_ms = {"read": (t_read - started) * 1000, "probe": (t_probe - t_read) * 1000,
                            "apply": (t_apply - t_probe) * 1000, "promote": (t_promote - t_apply) * 1000,
                            "prune": (done - t_promote) * 1000}
        if not dry_run and job_ids is None:
            self._write_last_sweep(report, Counter(result_name(p) for p in probes.values()))
        if report.overran:
            # Never a second sweep beside it, nor a backlog: the loop starts the next one once this one ended
            # (supervisor/loop.py). Slots of dead jobs are freed that much later; `sweep_overruns` counts it.
            log.warning("%s (JOBPOOL_SWEEP_INTERVAL_SECS): the supervisor's loop starts its next sweep once "
                        "this one ended, none beside it", report.line())
        else:
            log.info("%s", report.line())
        return report

    def untrusted_daemons(self) -> dict[str, str]:
        """Daemon identities no row may be judged on (identity -> why; jobpool/fleet/daemonmark.py): those a
        live process reports two daemons share, and this supervisor's own while its mark says it is not
        trusted to be one daemon's (its peers have not seen its mark yet, or a collision)."""
        if self.settings.executor == "subprocess":
            return {}
        out = markrecords.read_collisions(self.store)
        why = self.marker.refusal() if self.marker is not None else ""
        if why:
            ours = self.marker.daemon_id if self.marker is not None else ""
            try:
                ours = ours or self.prober.daemon_id()
            except Exception as exc:  # noqa: BLE001 - no daemon: its rows are unknown anyway
                self.prober.failed(exc)
            if ours:
                out.setdefault(ours, why)
        return out

    def _release_gone_affinities(self, snap: Snapshot) -> None:
        """A promoted job waiting on the queue of a daemon declared gone for good (jobpool/fleet/gone.py)
        would wait there for ever, holding its slot: its affinity is released (as `resume --anywhere` does,
        compare-and-set on the affinity), and past the claim grace it is dispatched again on the pool's queue
        (`decide_unclaimed`). Its checkpoint went with the daemon. One read, only when a row waits on a
        daemon's queue."""
        waiting = {r.id: r.affinity_queue for r in snap.rows if not r.claimed and r.affinity_queue}
        if not waiting:
            return
        gone = {self.store.keys.daemon_queue(d): d for d in declared(self.store)}
        for job_id, queue in waiting.items():
            daemon = gone.get(queue)
            if daemon is None:
                continue
            try:
                self.store.release_affinity(job_id, daemon, self.actor)
            except errors.JobpoolError as exc:  # it moved on meanwhile: judged again next sweep
                log.info("job %s: affinity to daemon %s not released: %s", job_id, daemon, exc)
                continue
            log.warning("job %s: released its affinity to daemon %s, declared gone; it runs anywhere now, "
                        "without its checkpoint", job_id, daemon)

    def _judge_ghosts(self, snap: Snapshot, probes: Mapping[str, Probe], report: SweepReport,
                      evict_stale: bool, dry_run: bool) -> None:
        for job_id, why in snap.ghosts.items():
            probe = probes.get(job_id)
            verdict = decide_ghost(why, snap.ghost_leases.get(job_id, False), probe, self.settings.executor,
                                   evict_stale=evict_stale)
            row = RowSnapshot(id=job_id, attempt=0)
            decision = Decision(job_id, 0, "", verdict, expected_state(row, verdict, self.settings))
            report.record(decision, isinstance(probe, Unknown))
            if dry_run:
                decision.outcome = "not applied (dry run)"
            elif verdict.kind is Kind.DROP:
                decision.outcome = self.applier.drop_ghost(job_id, verdict)
                report.conflicts += decision.outcome == "conflict"
            else:
                log.warning("running id %s has no readable row: %s", job_id, verdict.evidence)
                decision.outcome = "kept"

    def _prune(self) -> int:
        """A bounded share of retention each sweep (a backlog is worked off over several sweeps); a prune
        that fails on a bad entry is logged and left to the next sweep, never failing the sweep itself."""
        try:
            done = retention.prune(self.store, budget_secs=retention.SWEEP_BUDGET_SECS, actor=self.actor)
        except errors.RedisUnavailable:
            raise
        except errors.JobpoolError as exc:
            log.warning("pruning finished jobs of pool %s failed: %s", self.store.keys.pool, exc)
            return 0
        if done.total:
            log.info("pruned %d finished jobs past retention (%s)%s", done.total,
                     ", ".join(f"{s} {n}" for s, n in done.counts.items() if n),
                     "" if done.complete else "; more next sweep")
        return done.total

    def _remove_leftovers(self, recovering: str) -> None:
        """Now and then (volumes.EVERY_SECS; at start-up first), the containers of ended attempts and the
        checkpoint volumes of ended jobs; not while Redis's word settles (`recovering`,
        jobpool/redistrust.py): what it says of a row may be what a restart or a failover contradicts next."""
        if (self.settings.executor != "docker" or recovering
                or time.monotonic() - self._volumes_at < volumes.EVERY_SECS):
            return
        self._volumes_at = time.monotonic()
        try:
            volumes.remove_leftovers(self.store, self.prober.client())
        except errors.RedisUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - a daemon away: the next round asks again
            log.info("could not look for leftover containers and volumes (asked again later): %s", exc)

    def _write_last_sweep(self, report: SweepReport, probe_results: Mapping[str, int]) -> None:
        """The sweep's record, and its duration and probes counted (jobpool/metrics.py), in one step."""
        summary = json.dumps(report.summary(), sort_keys=True)
        metrics.record_sweep(self.store, summary, report.duration_ms, probe_results, report.overran)
