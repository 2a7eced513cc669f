"""The status report's types: what `Pool.status()` returns (jobpool/status/read.py reads it, jobpool/status/
health.py judges it), each with the `to_dict()` that `jobpool status --json` prints, and the small text and
number helpers the report's readers share (a time ago, a span, a URL fit to print, a stored number).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..fastinit import Assembler
from ..fleet.strays import Stray
from ..store import redisurl
from ..store.orderreads import LimitUse
from ..store.redispolicy import PolicyCheck

TRUTHY = ("1", "true", "yes")


def ago(ms: int | None, now_ms: int) -> str:
    """'3 min ago' for a time in ms since the epoch; '-' when there is none."""
    if ms is None:
        return "-"
    secs = (now_ms - ms) / 1000
    if secs < 0:
        return "in the future"  # clock skew between whoever wrote it and the Redis server
    if secs < 1:
        return "just now"
    return f"{coarse_span(secs)} ago"


def coarse_span(secs: float) -> str:
    """A span as people read it at a glance, in its largest whole unit: '3 d', '2 h', '5 min', '12 s'
    (at least '1 s')."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if secs >= size:
            return f"{int(secs // size)} {unit}"
    return f"{max(int(secs), 1)} s"


def safe_url(url: str) -> str:
    """The Redis URL with any password replaced, fit to print (jobpool/store/redisurl.py)."""
    return redisurl.safe(url)


def stored_int(value: Any) -> int | None:
    """A stored number, or None when it is missing or not one (records may be edited by hand). Whole
    numbers, what is stored, are read without a float between (a status read takes thousands)."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        pass
    try:
        return int(float(value))
    except (TypeError, ValueError, OverflowError):
        return None


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Slots:
    used: int
    max: int

    def to_dict(self) -> dict[str, Any]:
        return {"used": self.used, "max": self.max}


@dataclass(frozen=True)
class Queue:
    """The queue's head: how many jobs wait, and how long the first of them has waited since it was
    enqueued (None when the queue is empty)."""

    depth: int
    oldest_job: str | None = None
    oldest_wait_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"depth": self.depth, "oldest_job": self.oldest_job, "oldest_wait_ms": self.oldest_wait_ms}


@dataclass(frozen=True)
class Waiting:
    """The jobs held before the queue by time or by the jobs they wait for (docs/architecture.md, "Time and
    dependencies"): how many, and the one due soonest with when (ms); `next_due_ms` is None when none is
    held by time (only the jobs they wait for hold them: their end makes them due)."""

    count: int
    next_job: str | None = None
    next_due_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "next_job": self.next_job, "next_due_ms": self.next_due_ms}


@dataclass(frozen=True)
class Promotion:
    """Whether promotion is paused (`jobpool pause` with no job), by whom, why and since when (ms)."""

    paused: bool
    by: str | None = None
    reason: str | None = None
    since: int | None = None


@dataclass(frozen=True)
class Worker:
    """One live worker boot, from its record (workers/boot.py) and the running jobs whose rows name it as
    their owner (as the scripts place them: scripts/_lib.lua `place_running`)."""

    id: str
    host: str = ""
    pid: int | None = None
    pidns: str = ""
    kernel_boot_id: str = ""
    daemon_id: str = ""
    executor: str = ""
    started_at: int | None = None
    draining: bool = False
    #: Why it holds its claims ('' when it does not): its own host fails its check (workers/hostcheck.py).
    cannot_claim: str = ""
    #: Its last heartbeat (ms since the epoch, the `boots` index score) and its age on the server's clock.
    heartbeat_ms: int | None = None
    heartbeat_age_ms: int | None = None
    #: The first `WORKER_JOBS` of the running jobs whose rows name this boot as owner (one at a time, unless
    #: it adopted others or rows were edited), and how many there are.
    jobs: tuple[str, ...] = ()
    running: int = 0
    #: Why its work loop cannot take work, as its last beat said ('' when it can: workers/horses.py,
    #: `HorseWorker.stuck`): its heartbeat thread beats on regardless, so a live record alone is no proof.
    stuck: str = ""
    #: Whether its Docker daemon runs with live-restore, as the worker last read it (workers/boot.py,
    #: `live_restore_of`): None when unknown (not read yet, the subprocess executor, an older worker).
    live_restore: bool | None = None
    #: Its daemon is a Swarm node (live-restore off, as Swarm requires: a drain, not live-restore, keeps its
    #: jobs through a daemon restart).
    swarm: bool = False

    @classmethod
    def from_record(cls, boot_id: str, row: Mapping[str, str], heartbeat_ms: float, now_ms: int,
                    jobs: tuple[str, ...], running: int | None = None) -> Worker:
        """Made without the dataclass `__init__` (jobpool/fastinit.py): a status read makes one per live
        worker, a thousand in a large fleet, and `__init__` was half of each one's cost."""
        beat = stored_int(heartbeat_ms)
        get = row.get
        restore = get("live_restore", "")
        return _assemble_worker({
            "id": boot_id, "host": get("host", ""), "pid": stored_int(get("pid")), "pidns": get("pidns", ""),
            "kernel_boot_id": get("kernel_boot_id", ""), "daemon_id": get("daemon_id", ""),
            "executor": get("executor", ""), "started_at": stored_int(get("started_at")),
            "draining": get("draining", "").lower() in TRUTHY, "cannot_claim": get("cannot_claim", ""),
            "heartbeat_ms": beat, "heartbeat_age_ms": None if beat is None else now_ms - beat, "jobs": jobs,
            "running": len(jobs) if running is None else running, "stuck": get("stuck", ""),
            "live_restore": _LIVE_RESTORE.get(restore), "swarm": restore == "swarm"})

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "host": self.host, "pid": self.pid, "pidns": self.pidns,
                "kernel_boot_id": self.kernel_boot_id, "daemon_id": self.daemon_id, "executor": self.executor,
                "started_at": self.started_at, "draining": self.draining, "cannot_claim": self.cannot_claim,
                "heartbeat_ms": self.heartbeat_ms,
                "heartbeat_age_ms": self.heartbeat_age_ms, "jobs": list(self.jobs), "running": self.running,
                "stuck": self.stuck,
                "live_restore": self.live_restore, "swarm": self.swarm}


_assemble_worker = Assembler(Worker)
#: A worker record's `live_restore` (workers/boot.py): on, off, off on a Swarm node; anything else unknown.
_LIVE_RESTORE = {"1": True, "0": False, "swarm": False}


@dataclass(frozen=True)
class Workers:
    """Live boots (draining ones among them: they take no new job) and boots whose record expired."""

    live: int
    draining: int
    stale: int
    boots: tuple[Worker, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"live": self.live, "draining": self.draining, "stale": self.stale,
                "boots": [b.to_dict() for b in self.boots]}


@dataclass(frozen=True)
class UnknownHeld:
    """A running job whose slot the last sweep kept because its evidence was unknown, and why."""

    job: str
    attempt: int | None = None
    reason: str = ""
    evidence: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "attempt": self.attempt, "reason": self.reason, "evidence": self.evidence}


def _unknown_jobs(found: Any) -> tuple[UnknownHeld, ...]:
    items = found if isinstance(found, list) else []
    return tuple(UnknownHeld(str(d["job"]), stored_int(d.get("attempt")), str(d.get("reason", "")),
                             str(d.get("evidence", "")))
                 for d in items if isinstance(d, dict) and d.get("job"))


@dataclass(frozen=True)
class Sweep:
    """The supervisor's last sweep, as it recorded it (supervisor/report.py `SweepReport.summary`)."""

    at: int
    age_ms: int
    rows: int | None = None
    unknown: int = 0
    conflicts: int = 0
    promoted: int = 0
    duration_ms: float | None = None
    verdicts: Mapping[str, int] = field(default_factory=dict)
    phases_ms: Mapping[str, float] = field(default_factory=dict)
    #: The first of the `unknown` jobs, with the verdict's reason and evidence (a bounded list).
    unknown_jobs: tuple[UnknownHeld, ...] = ()
    #: The sweep interval it ran under, and whether it took longer (supervisor/sweep.py: the ticks it covered
    #: were dropped, so dead jobs' slots are freed that much later).
    interval_ms: float | None = None
    overran: bool = False

    @classmethod
    def parse(cls, raw: str, now_ms: int) -> Sweep:
        """The record's fields; `ValueError` when it is not a JSON object with a time in it."""
        doc = json.loads(raw)
        at = stored_int(doc.get("at")) if isinstance(doc, dict) else None
        if at is None:
            raise ValueError("not a JSON object with a time 'at'")
        verdicts, phases, duration = doc.get("verdicts"), doc.get("phases_ms"), doc.get("duration_ms")
        return cls(at=at, age_ms=now_ms - at, rows=stored_int(doc.get("rows")),
                   unknown=stored_int(doc.get("unknown")) or 0,
                   conflicts=stored_int(doc.get("conflicts")) or 0,
                   promoted=stored_int(doc.get("promoted")) or 0,
                   duration_ms=float(duration) if is_number(duration) else None,
                   verdicts={str(k): int(v) for k, v in verdicts.items() if is_number(v)}
                   if isinstance(verdicts, dict) else {},
                   phases_ms={str(k): float(v) for k, v in phases.items() if is_number(v)}
                   if isinstance(phases, dict) else {}, unknown_jobs=_unknown_jobs(doc.get("unknown_jobs")),
                   interval_ms=float(doc["interval_ms"]) if is_number(doc.get("interval_ms")) else None,
                   overran=doc.get("overran") is True)

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "age_ms": self.age_ms, "rows": self.rows, "unknown": self.unknown,
                "conflicts": self.conflicts, "promoted": self.promoted, "duration_ms": self.duration_ms,
                "verdicts": dict(self.verdicts), "phases_ms": dict(self.phases_ms),
                "unknown_jobs": [u.to_dict() for u in self.unknown_jobs], "interval_ms": self.interval_ms,
                "overran": self.overran}


@dataclass(frozen=True)
class StaleDaemon:
    """A Docker daemon whose jobs hold slots on stale evidence: their leases are gone (or, promoted, they wait
    on its queue for a checkpoint affinity to it) and the daemon's inventory is stale or missing, so the
    sweep keeps them for as long as that lasts (supervisor/remote.py). `since_ms` is its last publication,
    else (aged out of the index after a week, or never published) the last heartbeat (or promotion) its jobs
    recorded. If its host is gone for good, `command` frees them (jobpool/fleet/gone.py)."""

    daemon_id: str
    jobs: tuple[str, ...]
    since_ms: int | None = None
    last_published_ms: int | None = None

    @property
    def command(self) -> str:
        return f"jobpool forget-daemon {self.daemon_id}"

    def to_dict(self) -> dict[str, Any]:
        return {"daemon_id": self.daemon_id, "jobs": list(self.jobs), "since_ms": self.since_ms,
                "last_published_ms": self.last_published_ms, "command": self.command}


@dataclass(frozen=True)
class ReturnedDaemon:
    """A daemon declared gone whose declaration was lifted within a week (jobpool/fleet/gone.py): `how` is
    'published' (it came back: its workers publish again) or 'withdrawn' (by hand), `by` who, `at` when.
    Jobs judged absent on the declaration meanwhile may have run twice."""

    daemon_id: str
    how: str
    by: str = ""
    at: int | None = None
    forgotten_at: int | None = None
    forgotten_by: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"daemon_id": self.daemon_id, "how": self.how, "by": self.by, "at": self.at,
                "forgotten_at": self.forgotten_at, "forgotten_by": self.forgotten_by}


@dataclass(frozen=True)
class Daemons:
    """Daemons the operator must know of: holding slots on stale evidence, declared gone (identities), and
    back after a declaration."""

    stale: tuple[StaleDaemon, ...] = ()
    gone: tuple[str, ...] = ()
    returned: tuple[ReturnedDaemon, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"stale": [d.to_dict() for d in self.stale], "gone": list(self.gone),
                "returned": [d.to_dict() for d in self.returned]}


@dataclass(frozen=True)
class Health:
    """The verdict: healthy unless there is a reason; warnings are worth knowing but not unhealthy."""

    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        return not self.reasons

    def to_dict(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "reasons": list(self.reasons), "warnings": list(self.warnings)}


@dataclass(frozen=True)
class StatusReport:
    """Everything `status` shows. When Redis could not be read, only `pool`, `redis_url`, `reachable` and
    `health` (which says why) are filled."""

    pool: str
    redis_url: str
    reachable: bool
    health: Health
    now_ms: int | None = None
    slots: Slots | None = None
    counts: Mapping[str, int] = field(default_factory=dict)
    queue: Queue | None = None
    waiting: Waiting | None = None
    promotion: Promotion | None = None
    workers: Workers | None = None
    last_sweep: Sweep | None = None
    #: Redis's `maxmemory-policy` and the verdict on it (jobpool/store/redispolicy.py).
    redis_policy: PolicyCheck | None = None
    #: Running containers no row accounts for, as their daemons' inventories list them while their workers
    #: stop them (jobpool/fleet/strays.py).
    strays: tuple[Stray, ...] = ()
    daemons: Daemons | None = None
    #: Daemon identity -> why two Docker daemons share it: its standing collision, recorded with the first
    #: process's report of it and held until an operator clears it (`jobpool forget-collision`;
    #: jobpool/fleet/daemonmark.py).
    shared_daemons: Mapping[str, str] = field(default_factory=dict)
    #: The named limits, by name, with their size and the units in use ("Order and limits").
    limits: tuple[LimitUse, ...] = ()

    @property
    def healthy(self) -> bool:
        return self.health.healthy

    @property
    def unknown(self) -> int | None:
        """Running jobs the last sweep could not probe (their slots are kept until a probe answers)."""
        if not self.reachable:
            return None
        return self.last_sweep.unknown if self.last_sweep else 0

    def to_dict(self) -> dict[str, Any]:
        promotion = self.promotion
        return {
            "pool": self.pool, "now": self.now_ms,
            "redis": {"url": self.redis_url, "reachable": self.reachable,
                      **(self.redis_policy.to_dict() if self.redis_policy else {})},
            "slots": self.slots.to_dict() if self.slots else None, "counts": dict(self.counts),
            "queue": self.queue.to_dict() if self.queue else None,
            "waiting": self.waiting.to_dict() if self.waiting else None,
            # Flat, as `status --json` has printed them from the start (and `pause --json` still does).
            "queue_paused": promotion.paused if promotion else None,
            "paused_by": promotion.by if promotion else None,
            "paused_reason": promotion.reason if promotion else None,
            "paused_since": promotion.since if promotion else None,
            "workers": self.workers.to_dict() if self.workers else None,
            "last_sweep": self.last_sweep.to_dict() if self.last_sweep else None,
            "daemons": self.daemons.to_dict() if self.daemons else None,
            "unknown": self.unknown, "strays": [x.to_dict() for x in self.strays],
            "shared_daemons": dict(self.shared_daemons),
            "limits": [{"name": u.name, "max": u.size, "used": u.used} for u in self.limits],
            **self.health.to_dict(),
        }
