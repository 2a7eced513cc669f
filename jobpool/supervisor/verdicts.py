"""Verdicts: what the supervisor does with one running row, given the evidence.

Pure functions, no I/O: a row snapshot, whether the owner's lease is present, a probe result, RQ's dispatch
facts, the time and the settings go in; a `Verdict` comes out. The sweep applies it compare-and-set on the
same evidence, so a row that moved on in the meantime is left alone (docs/architecture.md, 'Evidence and
verdicts', and 'Rules the verdicts encode, and why').

| row                | evidence                                               | verdict                      |
|--------------------|--------------------------------------------------------|------------------------------|
| promoted, unclaimed| in RQ's queue / intermediate list / started registry,  | keep                         |
|                    | or promoted less than the claim grace ago              |                              |
| promoted, unclaimed| none of those                                          | redispatch (a new attempt)   |
| claimed            | lease present for (owner, attempt)                     | keep; past stale limit: warn |
| claimed            | lease gone, container present and running              | adopt (slot kept)            |
| claimed            | lease gone, container present and exited               | exited (finish from the code)|
| claimed            | lease gone, exited, Docker says OOMKilled              | oom (fail oom_killed)        |
| claimed            | lease gone, exited, its end recorded by a daemon       | crashed (as absent, with the |
|                    | restart this supervisor saw (jobpool/exits.py)         | exit code recorded)          |
| claimed            | lease gone, container absent                           | absent (cancel/pause/budget) |
| claimed            | lease gone, probe unknown                              | warn (slot kept)             |
| no row (a ghost)   | a live lease, or a container of any attempt running    | warn (slot kept)             |
| no row (a ghost)   | neither: operator only (the daemon it ran on is not    | drop (slot freed)            |
|                    | known; unattended sweeps warn)                         |                              |

The unattended sweep never frees the slot of work it believes alive: a stale live job only warns, and only
the operator's `reconcile(evict_stale=True)` turns that into `evict`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from ..config import Settings
from ..contract import EXIT_TEMPFAIL, JobState
from ..exits import CRASHED, OOM
from .probes import Absent, Present, Probe, Unknown

# error_reason values: each names the evidence the verdict was based on.
REASON_NO_CONTAINER = "orphan_reconciled_no_container"
REASON_DEAD_PID = "orphan_reconciled_dead_pid"
REASON_NEVER_STARTED = "orphan_reconciled_never_started"
REASON_CONTAINER_EXITED = "container_exited"
REASON_STALE_EVICTED = "stale_evicted"
REASON_LOST_DISPATCH = "lost_dispatch"
# warning reasons (the slot is kept)
WARN_STALE = "stale"
WARN_PROBE_UNKNOWN = "probe_unknown"
WARN_UNADOPTABLE = "orphan_process_alive"
WARN_GHOST = "ghost_kept"
WARN_RECOVERING = "redis_recovering"
REASON_GHOST = "dropped_ghost"

EXECUTOR_DOCKER = "docker"
_HOUR_SECS = 3600
EXECUTOR_SUBPROCESS = "subprocess"


class Kind(str, enum.Enum):
    KEEP = "keep"
    WARN = "warn"  # keep the slot, and log a WARNING naming the reason
    ADOPT = "adopt"  # keep the slot, and ask a live worker to re-attach to the running container
    EXITED = "exited"  # finish from the container's exit code
    OOM = "oom"  # exited, ended by the kernel's OOM killer: fail it (unless exit 0, or a cancel/pause asked)
    CRASHED = "crashed"  # exited, ended by its daemon (jobpool/exits.py): recovery budget, as absent
    ABSENT = "absent"  # the work is gone: persisted cancel/pause, recovery budget, or failed
    REDISPATCH = "redispatch"  # promoted but lost before any worker claimed it: dispatch a new attempt
    EVICT = "evict"  # operator only: stop the live job by label and fail it
    DROP = "drop"  # a running id with no readable row and no work left: free its slot

    def __str__(self) -> str:
        return self.value


#: Verdicts that change the row through `reconcile_apply`.
APPLIED_KINDS = frozenset({Kind.EXITED, Kind.OOM, Kind.CRASHED, Kind.ABSENT, Kind.REDISPATCH})
#: Verdicts that finish from an ended container's exit code (its container is removed once applied).
EXIT_KINDS = frozenset({Kind.EXITED, Kind.OOM, Kind.CRASHED})


@dataclass(frozen=True)
class Verdict:
    kind: Kind
    #: For a changing verdict: the error_reason to record; for a warning: what is wrong.
    reason: str = ""
    #: What was seen, in words (goes to the event stream and the log).
    evidence: str = ""
    exit_code: int | None = None
    #: The container the evidence came from (removed after its exit code is recorded).
    container_id: str = ""
    #: Running past `job_stale_seconds`.
    stale: bool = False

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind.value, "reason": self.reason, "evidence": self.evidence,
                "exit_code": self.exit_code, "container_id": self.container_id, "stale": self.stale}


def _int(v: str | None) -> int | None:
    if not v:
        return None
    try:
        return int(v)
    except ValueError:
        return None


def attempt_number(v: str | None) -> int:
    """An attempt as read from a row (0 when missing or unreadable), as `RowSnapshot` holds it."""
    return _int(v) or 0


def _count(v: str | None) -> int:
    """A count read from a row as the scripts read it (`whole` in scripts/_lib.lua): anything but a
    non-negative whole number is 0, so a dry run predicts what reconcile_apply.lua will do with it."""
    n = _int(v)
    return n if n is not None and n >= 0 else 0


@dataclass(frozen=True)
class RowSnapshot:
    """The fields of a running row the verdict depends on, as read at the start of a sweep."""

    id: str
    attempt: int
    owner_boot: str = ""
    container_id: str = ""
    daemon_id: str = ""
    identity: str = ""
    executor: str = EXECUTOR_DOCKER
    promoted_at: int | None = None
    claimed_at: int | None = None
    pause_requested: bool = False
    cancel_requested: bool = False
    recovery_attempts: int = 0
    affinity_queue: str = ""  # the RQ list a row with a checkpoint affinity is pushed on ('' = the pool's)

    #: The row fields a sweep reads (HMGET): never the log tail, which can be 64 KiB per row.
    FIELDS = ("id", "state", "attempt", "owner_boot", "container_id", "daemon_id", "identity", "executor",
              "promoted_at", "claimed_at", "pause_requested", "cancel_requested", "recovery_attempts",
              "affinity_queue")

    @property
    def claimed(self) -> bool:
        return bool(self.owner_boot)

    @property
    def lease_value(self) -> str:
        """What the owner's lease holds while it is alive; any other value is not this attempt's lease."""
        return f"{self.owner_boot}:{self.attempt}"

    @classmethod
    def brief(cls, job_id: str, owner_boot: str | None, attempt: str | None, claimed_at: str | None,
              executor: str) -> RowSnapshot:
        """From the few fields that judge a row whose owner holds its lease (the sweep's first pass)."""
        return cls(id=job_id, attempt=attempt_number(attempt), owner_boot=owner_boot or "", executor=executor,
                   claimed_at=_int(claimed_at))

    @classmethod
    def from_row(cls, row: Mapping[str, str | None], default_executor: str = EXECUTOR_DOCKER,
                 boot_facts: Mapping[str, str | None] | None = None) -> RowSnapshot:
        """Build from a row; `boot_facts` (the owner's boot record, if still there) fills in an executor or
        daemon id the row does not carry."""
        boot_facts = boot_facts or {}
        identity = row.get("identity") or ""
        executor = row.get("executor") or (EXECUTOR_SUBPROCESS if identity else "") \
            or boot_facts.get("executor") or default_executor
        return cls(
            id=str(row["id"]), attempt=attempt_number(row.get("attempt")),
            owner_boot=row.get("owner_boot") or "",
            container_id=row.get("container_id") or "",
            daemon_id=row.get("daemon_id") or boot_facts.get("daemon_id") or "",
            identity=identity, executor=executor,
            promoted_at=_int(row.get("promoted_at")), claimed_at=_int(row.get("claimed_at")),
            pause_requested=row.get("pause_requested") == "1",
            cancel_requested=row.get("cancel_requested") == "1",
            recovery_attempts=_count(row.get("recovery_attempts")),
            affinity_queue=row.get("affinity_queue") or "")


@dataclass(frozen=True)
class DispatchFacts:
    """Where RQ holds a promoted job id (checked for unclaimed rows only)."""

    in_queue: bool = False
    in_intermediate: bool = False
    in_started: bool = False
    #: How long this supervisor has seen the id taken (intermediate list or started registry) unclaimed.
    taken_secs: float = 0.0

    @property
    def taken(self) -> bool:
        """A worker took the delivery off the queue but has not claimed it (yet)."""
        return not self.in_queue and (self.in_intermediate or self.in_started)

    @property
    def waiting(self) -> bool:
        return self.in_queue or self.in_intermediate or self.in_started

    def describe(self) -> str:
        where = [n for n, v in (("queue", self.in_queue), ("intermediate list", self.in_intermediate),
                                ("started registry", self.in_started)) if v]
        if not where:
            return "in none of RQ's queue, intermediate list, started registry"
        return "in RQ's " + " and ".join(where)


class ProbeKind(str, enum.Enum):
    CONTAINER = "container"
    PROCESS = "process"


def probe_needed(row: RowSnapshot, lease_present: bool) -> ProbeKind | None:
    """Which ground truth a row needs: only a claimed row whose owner's lease is gone is probed."""
    if not row.claimed or lease_present:
        return None
    return ProbeKind.PROCESS if row.executor == EXECUTOR_SUBPROCESS else ProbeKind.CONTAINER


def age_secs(since_ms: int | None, now_ms: int) -> float | None:
    return None if since_ms is None else max(0.0, (now_ms - since_ms) / 1000.0)


def is_stale(row: RowSnapshot, now_ms: int, settings: Settings) -> bool:
    age = age_secs(row.claimed_at if row.claimed_at is not None else row.promoted_at, now_ms)
    return age is not None and age > settings.job_stale_seconds


def _fmt_age(secs: float | None) -> str:
    if secs is None:
        return "?"
    if secs >= _HOUR_SECS:
        return f"{secs / _HOUR_SECS:.1f}h"
    return f"{secs:.1f}s"


def decide_unclaimed(row: RowSnapshot, dispatch: DispatchFacts | None, now_ms: int,
                     settings: Settings) -> Verdict:
    age = age_secs(row.promoted_at, now_ms)
    if dispatch is not None and dispatch.taken and dispatch.taken_secs >= settings.claim_grace_secs:
        # A worker claims within moments of taking a delivery; one held this long was lost with its worker
        # or by a Redis rollback, and RQ frees it only minutes later. Nothing runs before a claim, and of two
        # deliveries only the first claim wins, so a new attempt is safe.
        return Verdict(Kind.REDISPATCH, reason=REASON_LOST_DISPATCH,
                       evidence=f"unclaimed attempt {row.attempt}, {dispatch.describe()} for "
                                f"{dispatch.taken_secs:.0f}s without a claim")
    if dispatch is not None and dispatch.waiting:
        return Verdict(Kind.KEEP, evidence=f"unclaimed, {dispatch.describe()}")
    if age is None or age < settings.claim_grace_secs:
        return Verdict(Kind.KEEP, evidence=f"unclaimed, promoted {_fmt_age(age)} ago (claim grace "
                                           f"{settings.claim_grace_secs:g}s)")
    where = (dispatch or DispatchFacts()).describe()
    return Verdict(Kind.REDISPATCH, reason=REASON_LOST_DISPATCH,
                   evidence=f"unclaimed attempt {row.attempt}, {where}, promoted {_fmt_age(age)} ago")


def decide(row: RowSnapshot, lease_present: bool, probe: Probe | None, dispatch: DispatchFacts | None,
           now_ms: int, settings: Settings, evict_stale: bool = False) -> Verdict:
    """The verdict for one running row (the table above). `evict_stale` is the operator's override."""
    if not row.claimed:
        return decide_unclaimed(row, dispatch, now_ms, settings)
    stale = is_stale(row, now_ms, settings)
    if lease_present and not stale:  # the common case, first and cheap
        return held_verdict(row.owner_boot, row.attempt)
    owner = f"owner {row.owner_boot} attempt {row.attempt}"
    age = _fmt_age(age_secs(row.claimed_at if row.claimed_at is not None else row.promoted_at, now_ms))
    stale_note = f"running {age}, past the stale limit of {settings.job_stale_seconds:g}s"
    if lease_present:
        if evict_stale:
            return Verdict(Kind.EVICT, REASON_STALE_EVICTED, f"lease held by {owner}; {stale_note}",
                           stale=True)
        return Verdict(Kind.WARN, WARN_STALE, f"lease held by {owner}; {stale_note}; only "
                                              "`reconcile --evict-stale` frees it", stale=True)
    gone = f"lease of {owner} gone"
    if probe is None or isinstance(probe, Unknown):
        reason = probe.reason if isinstance(probe, Unknown) else "no probe taken"
        return Verdict(Kind.WARN, WARN_PROBE_UNKNOWN, f"{gone}; probe unknown: {reason}; slot kept",
                       stale=stale)
    if isinstance(probe, Present) and probe.running:
        if stale and evict_stale:
            return Verdict(Kind.EVICT, REASON_STALE_EVICTED, f"{gone}; {probe.detail}; {stale_note}",
                           container_id=probe.container_id, stale=True)
        return _alive_orphan(row, probe, gone, stale)
    if isinstance(probe, Present):
        return _exited(probe, gone)
    return _absent(row, probe, gone)


#: A running row as the sweep's first pass reads it: id, owner boot, attempt, claimed_at, its lease's value
#: (None where missing; supervisor/evidence.py).
Brief = tuple[str, str | None, str | None, str | None, str | None]


def held_verdict(owner: str, attempt: int) -> Verdict:
    """A claimed row whose owner holds its lease, not past the stale limit: kept. The sweep gives it without
    calling `decide` for the bulk of a fleet (supervisor/evidence.py `Snapshot.held`)."""
    return Verdict(Kind.KEEP, evidence=f"lease held by owner {owner} attempt {attempt}")


def _exited(probe: Present, gone: str) -> Verdict:
    """An ended container: what ended it decides (jobpool/exits.py, the rule a worker applies too)."""
    kind, reason = Kind.EXITED, REASON_CONTAINER_EXITED
    if probe.ending is not None and probe.ending.cause == OOM:
        kind, reason = Kind.OOM, probe.ending.reason
    elif probe.ending is not None and probe.ending.cause == CRASHED:
        kind, reason = Kind.CRASHED, probe.ending.reason
    return Verdict(kind, reason, f"{gone}; {probe.detail}", exit_code=probe.exit_code,
                   container_id=probe.container_id)


def _alive_orphan(row: RowSnapshot, probe: Present, gone: str, stale: bool) -> Verdict:
    if row.executor == EXECUTOR_SUBPROCESS:
        return Verdict(Kind.WARN, WARN_UNADOPTABLE, f"{gone}; {probe.detail}; a process cannot be "
                                                    "re-parented, so it keeps its slot until it exits",
                       stale=stale)
    return Verdict(Kind.ADOPT, evidence=f"{gone}; {probe.detail}", container_id=probe.container_id,
                   stale=stale)


def _absent(row: RowSnapshot, probe: Absent, gone: str) -> Verdict:
    if row.executor == EXECUTOR_SUBPROCESS:
        reason = REASON_DEAD_PID
    elif probe.never_started:
        reason = REASON_NEVER_STARTED
    else:
        reason = REASON_NO_CONTAINER
    return Verdict(Kind.ABSENT, reason, f"{gone}; {probe.detail}", container_id=probe.container_id)


def hold_while_recovering(verdict: Verdict, recovering: str) -> Verdict:
    """While Redis has just come back (`recovering` says how), an "absent" verdict waits: the lease that
    lapsed may have lapsed only because Redis was away, and its worker may be about to record the real
    exit code. The slot is kept for that while; every other verdict stands."""
    if not recovering or verdict.kind is not Kind.ABSENT:
        return verdict
    return Verdict(Kind.WARN, WARN_RECOVERING, f"{verdict.evidence}; but {recovering}: its worker is given "
                                               "one lease to report; slot kept", stale=verdict.stale)


def decide_ghost(why: str, lease_live: bool, probe: Probe | None, executor: str,
                 evict_stale: bool = False) -> Verdict:
    """A running id whose row is gone or unreadable (`why`): nothing can ever end it, so it would hold its
    slot for ever. It is judged by what outlives a row: a live lease (its worker may still be at it; its
    next fenced write is refused) or a container of the job, any attempt. Without the row neither the daemon
    nor the process it ran as is known, so "nothing found here" is not proof: only the operator's sweep drops
    a ghost."""
    if lease_live:
        return Verdict(Kind.WARN, WARN_GHOST, f"{why}; a lease with a TTL is still held; slot kept")
    if executor == EXECUTOR_SUBPROCESS:
        if evict_stale:
            return Verdict(Kind.DROP, REASON_GHOST, f"{why}; no lease; freed by the operator's sweep")
        return Verdict(Kind.WARN, WARN_GHOST, f"{why}; no lease, but a process cannot be found without its "
                                              "row: only `reconcile --evict-stale` frees the slot")
    if probe is None or isinstance(probe, Unknown):
        reason = probe.reason if isinstance(probe, Unknown) else "no probe taken"
        return Verdict(Kind.WARN, WARN_GHOST, f"{why}; probe unknown: {reason}; slot kept")
    if isinstance(probe, Present) and probe.running:
        return Verdict(Kind.WARN, WARN_GHOST, f"{why}; {probe.detail}; slot kept until it stops",
                       container_id=probe.container_id)
    # Without its row, nothing says which daemon the job ran on: "none here" proves nothing about another
    # daemon of the fleet (jobpool/fleet/daemonid.py). Only the operator, who can look, frees such a slot.
    if not evict_stale:
        return Verdict(Kind.WARN, WARN_GHOST, f"{why}; no lease; {probe.detail}, but a job without its row "
                                              "may run on another daemon: only `reconcile --evict-stale` "
                                              "frees the slot")
    return Verdict(Kind.DROP, REASON_GHOST, f"{why}; {probe.detail}; freed by the operator's sweep")


def state_after_exit(code: int, stop_asked: bool, cancel_requested: bool, pause_requested: bool,
                     cause: str = "", budget_left: bool = False) -> JobState:
    """How an exit ends a job (`verdict_for_exit` in scripts/_lib.lua, applied by finish.lua for a worker and
    by reconcile_apply.lua for the supervisor): exit 0 is success whatever was asked; otherwise a persisted
    cancel, then a persisted pause, wins; an OOM kill (`cause` OOM) fails; an exit after jobpool asked the
    job to stop is handed back to its place; a crash (`cause` CRASHED: its daemon ended it) is queued again
    while recovery budget is left (`budget_left`), else failed; any other exit fails. `stop_asked`: for a
    worker, that its watcher sent the stop signal (a drain, or a pause or cancel since withdrawn); the
    supervisor cannot know that and takes an `EXIT_TEMPFAIL` exit, the job's own word that it was
    interrupted at a boundary, as asked."""
    if code == 0:
        return JobState.SUCCEEDED
    if cancel_requested:
        return JobState.CANCELLED
    if pause_requested:
        return JobState.PAUSED
    if cause == OOM:
        return JobState.FAILED
    if stop_asked:
        return JobState.QUEUED
    if cause == CRASHED:
        return JobState.QUEUED if budget_left else JobState.FAILED
    return JobState.FAILED


def expected_state(row: RowSnapshot, verdict: Verdict, settings: Settings) -> str:
    """The state the row will be in once the verdict is applied (what a dry run shows): what
    scripts/reconcile_apply.lua and evict.lua do, checked against them by tests/unit/test_exit_verdicts.py."""
    if verdict.kind in EXIT_KINDS:
        if verdict.exit_code is None:  # reconcile_apply.lua refuses an exit without a code: nothing changes
            return JobState.RUNNING.value
        if verdict.kind is Kind.CRASHED and not verdict.reason:  # refused too: a crash names its evidence
            return JobState.RUNNING.value
        code = verdict.exit_code
        cause = {Kind.OOM: OOM, Kind.CRASHED: CRASHED}.get(verdict.kind, "")
        return state_after_exit(code, code == EXIT_TEMPFAIL, row.cancel_requested, row.pause_requested,
                                cause, row.recovery_attempts < settings.recovery_budget).value
    if verdict.kind is Kind.ABSENT:
        if row.cancel_requested:
            return JobState.CANCELLED.value
        if row.pause_requested:
            return JobState.PAUSED.value
        budget_left = row.recovery_attempts < settings.recovery_budget
        return JobState.QUEUED.value if budget_left else JobState.FAILED.value
    if verdict.kind is Kind.EVICT:
        return JobState.FAILED.value
    if verdict.kind is Kind.DROP:
        return "dropped"
    return JobState.RUNNING.value
