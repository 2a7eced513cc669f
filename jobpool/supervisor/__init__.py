"""The supervisor: keeps the queue moving without ever freeing a live job's slot.

Every sweep reconciles each running row against ground truth (its owner's lease, its labelled container or
recorded process, RQ's dispatch lists), then promotes. Verdicts are compare-and-set, so two supervisors on one
pool are safe; an unknown probe keeps the slot; only the operator's `reconcile(evict_stale=True)` evicts.
docs/architecture.md, 'Evidence and verdicts', tells the rules and why; one sweep is evidence.py ->
verdicts.py -> apply.py (adoption requests in adoption.py), driven by sweep.py.
"""

from .loop import reconcile, run_supervisor, sweep_once
from .orphans import OrphanStop, stop_orphan
from .probes import Absent, ContainerProber, Present, Unknown, probe_containers, probe_process
from .report import Decision, SweepReport
from .sweep import Supervisor
from .verdicts import Kind, Verdict, decide

__all__ = [
    # entry points
    "run_supervisor", "sweep_once", "reconcile", "stop_orphan",
    # the pieces, for tests, the CLI and the workers
    "Supervisor", "SweepReport", "Decision", "OrphanStop", "Verdict", "Kind", "decide",
    "ContainerProber", "probe_containers", "probe_process", "Present", "Absent", "Unknown",
]
