"""Stopping the work of a cancelled job whose worker is gone (the operator's `cancel`).

Never by a recorded pid: a pid recorded by another boot may name any process now. Containers are stopped by
label, on the daemon they were recorded on, then the row is reconciled at once by a one-job sweep
(docs/architecture.md, 'Rules the verdicts encode, and why').
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .. import daemoncommands
from ..models import Job
from ..store.calls import Store
from .probes import ContainerProber
from .stopper import ContainerStopper
from .sweep import Supervisor, actor_name
from .verdicts import EXECUTOR_SUBPROCESS

log = logging.getLogger("jobpool.supervisor")


@dataclass(frozen=True)
class OrphanStop:
    """What `stop_orphan` did: `action` is one of not_running, owner_alive, stopped, routed (to the workers on
    its daemon: jobpool/daemoncommands.py), manual_stop_needed, unknown."""

    job_id: str
    action: str
    containers: tuple[str, ...] = ()
    detail: str = ""
    state: str = ""


def same_daemon_or_none(sup: Supervisor, recorded: str) -> tuple[bool, str]:
    """`DaemonClient.same_daemon`, with "this process has no daemon" (nothing answers) as a mismatch."""
    try:
        return sup.prober.same_daemon(recorded)
    except Exception as exc:  # noqa: BLE001 - no daemon here: the container cannot be stopped from here
        return False, sup.prober.failed(exc)


def stop_orphan(store: Store, job: Job | str, prober: ContainerProber | None = None) -> OrphanStop:
    """Stop the work of a running job whose owner is gone, after a cancel was persisted (`Pool.cancel`).

    Docker rows: the job's running containers are stopped by label (never a pid signal: a pid recorded by
    another boot may name any process now), then the row is reconciled at once, so a persisted cancel ends
    it `cancelled`. Subprocess rows: nothing is signalled; a loud log says the process must be stopped by
    hand. A job whose owner still holds its lease is left to that owner, which honours the persisted request.
    """
    job_id = job if isinstance(job, str) else job.id
    sup = Supervisor(store, prober, actor=actor_name("operator"))
    try:
        snap = sup.evidence.read([job_id])
        if snap.held:  # its owner holds the lease (and it is not past the stale limit)
            owner = snap.held[0][1]
            return OrphanStop(job_id, "owner_alive", detail=f"owner {owner} holds the lease and honours the "
                                                            "persisted request", state="running")
        if not snap.rows:
            return OrphanStop(job_id, "not_running", state=store.job(job_id).state.value)
        row = snap.rows[0]
        if snap.lease[row.id]:
            return OrphanStop(job_id, "owner_alive", detail=f"owner {row.owner_boot} holds the lease and "
                                                            "honours the persisted request", state="running")
        if not row.claimed:
            return OrphanStop(job_id, "not_running", detail="never claimed", state="running")
        if row.executor == EXECUTOR_SUBPROCESS:
            log.error("job %s: its owner boot %s is gone and its process may still be running; jobpool "
                      "never signals a pid it did not start in this boot, so surviving work must be stopped "
                      "by hand "
                      "(recorded identity %s)", job_id, row.owner_boot, row.identity or "none")
            report = sup.sweep(job_ids=[job_id])
            return OrphanStop(job_id, "manual_stop_needed", detail=row.identity,
                              state=report.decisions[0].outcome if report.decisions else "")
        ok, why = same_daemon_or_none(sup, row.daemon_id)
        if not ok and store.settings.inventory_secs and daemoncommands.routable(row.daemon_id):
            # Stopped by the workers on its own daemon; the persisted cancel then ends it
            # (docs/architecture.md, "Many hosts").
            waiting = daemoncommands.route_stop(store, row.daemon_id, daemoncommands.StopCommand(
                job_id, row.attempt, actor=sup.actor))
            log.warning("job %s: its container runs on daemon %s (%s): stop routed to that daemon's workers "
                        "(%d waiting)", job_id, row.daemon_id, why, waiting)
            return OrphanStop(job_id, "routed", state="running",
                              detail=f"stop routed to the workers on daemon {row.daemon_id}")
        if not ok:
            # Nothing found by label here says nothing about the daemon it runs on: stop nothing, claim
            # nothing; the persisted cancel waits for evidence from the right daemon.
            log.error("job %s: its container cannot be stopped from here: %s", job_id, why)
            return OrphanStop(job_id, "unknown", detail=why, state="running")
        try:
            stopped = ContainerStopper(sup.prober).stop_by_label(store.keys.pool, job_id, None,
                                                             store.settings.stop_grace_secs)
        except Exception as exc:  # noqa: BLE001 - the daemon could not be asked: nothing was stopped
            log.error("job %s: its container could not be stopped: %s", job_id, exc)
            return OrphanStop(job_id, "unknown", detail=str(exc), state="running")
        log.warning("job %s: owner %s gone; stopped %d container(s) by label", job_id, row.owner_boot,
                    len(stopped))
        report = sup.sweep(job_ids=[job_id])
        outcome = report.decisions[0].outcome if report.decisions else ""
        return OrphanStop(job_id, "stopped", tuple(stopped), state=outcome)
    finally:
        if prober is None:
            sup.close()
