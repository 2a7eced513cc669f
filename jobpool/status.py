"""A pool's status as one typed report, and the health rules that judge it: what `Pool.status()` returns.

The CLI's `status`, the Python API and anything that serves a dashboard or metrics read this one report, so
they cannot disagree about what "healthy" means. It is read, never written: the facts come from the keys the
scripts, the workers' boot records and the supervisor's last-sweep record keep (docs/architecture.md, "The
Redis data model"). `to_dict()` is the JSON form `jobpool status --json` prints.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import errors
from .fastinit import Assembler
from .fleet import daemonmark, strays
from .fleet.daemonid import is_identity
from .fleet.inventory import FORGET_MS
from .fleet.strays import Stray
from .store import redispolicy, redisurl
from .store.orderreads import LimitUse
from .store.redispolicy import PolicyCheck, Verdict

if TYPE_CHECKING:
    from .store.calls import Store

#: The supervisor counts as dead when its last sweep is older than this many sweep intervals.
SWEEP_GRACE_INTERVALS = 3
#: How many boots the report looks at (newest heartbeats first); the workers prune older ones
#: (workers/boot.py).
MAX_BOOTS = 1000
TRUTHY = ("1", "true", "yes")
#: How many workers, daemons or jobs one note names before it says '...' (and how many more).
_NAMED, _NAMED_WORKERS = 5, 3
#: How many of a worker's running jobs the report names (`Worker.running` counts them all): a worker runs one
#: at a time, more only when it adopted others or rows were edited.
WORKER_JOBS = 10


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


def _int(value: Any) -> int | None:
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


def _is_number(value: Any) -> bool:
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
        beat = _int(heartbeat_ms)
        get = row.get
        restore = get("live_restore", "")
        return _assemble_worker({
            "id": boot_id, "host": get("host", ""), "pid": _int(get("pid")), "pidns": get("pidns", ""),
            "kernel_boot_id": get("kernel_boot_id", ""), "daemon_id": get("daemon_id", ""),
            "executor": get("executor", ""), "started_at": _int(get("started_at")),
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
    return tuple(UnknownHeld(str(d["job"]), _int(d.get("attempt")), str(d.get("reason", "")),
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
        at = _int(doc.get("at")) if isinstance(doc, dict) else None
        if at is None:
            raise ValueError("not a JSON object with a time 'at'")
        verdicts, phases, duration = doc.get("verdicts"), doc.get("phases_ms"), doc.get("duration_ms")
        return cls(at=at, age_ms=now_ms - at, rows=_int(doc.get("rows")),
                   unknown=_int(doc.get("unknown")) or 0, conflicts=_int(doc.get("conflicts")) or 0,
                   promoted=_int(doc.get("promoted")) or 0,
                   duration_ms=float(duration) if _is_number(duration) else None,
                   verdicts={str(k): int(v) for k, v in verdicts.items() if _is_number(v)}
                   if isinstance(verdicts, dict) else {},
                   phases_ms={str(k): float(v) for k, v in phases.items() if _is_number(v)}
                   if isinstance(phases, dict) else {}, unknown_jobs=_unknown_jobs(doc.get("unknown_jobs")),
                   interval_ms=float(doc["interval_ms"]) if _is_number(doc.get("interval_ms")) else None,
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


def judge(report: StatusReport, sweep_interval_secs: float, warnings: tuple[str, ...] = ()) -> Health:
    """The health rules: unhealthy without a supervisor that swept lately, with fewer ready workers than
    slots (a slot no worker can take is a job that waits for nothing; a worker whose host fails its check is
    not ready, a warning naming why; one whose work loop is stuck on its horse holds work it cannot do, a
    reason of its own) or on a Redis
    that may evict job rows (a policy that may evict leases, or one that could not be read, is a warning).
    A Docker daemon without live-restore is a warning: its jobs run, but its restart would stop them."""
    reasons: list[str] = []
    notes = list(warnings)
    policy = report.redis_policy
    if policy is not None and policy.verdict is not Verdict.OK:
        (reasons if policy.verdict is Verdict.REFUSE else notes).append(policy.message)
    now, sweep = report.now_ms or 0, report.last_sweep
    if sweep is None:
        reasons.append("no live supervisor: no sweep has been recorded for this pool")
    elif now - sweep.at > SWEEP_GRACE_INTERVALS * sweep_interval_secs * 1000:
        reasons.append(f"no live supervisor: the last sweep was {ago(sweep.at, now)}, more than "
                       f"{SWEEP_GRACE_INTERVALS} x JOBPOOL_SWEEP_INTERVAL_SECS ({sweep_interval_secs:g} s)")
    if sweep is not None and sweep.overran:
        notes.append(f"the last sweep took {sweep.duration_ms or 0:.0f} ms, longer than its interval of "
                     f"{(sweep.interval_ms or 0) / 1000:g} s: slots of dead jobs are freed that much later "
                     "(`jobpool_sweep_overruns_total` counts them)")
    mx = report.slots.max if report.slots else 0
    ready = (report.workers.live - report.workers.draining) if report.workers else 0
    held = [w for w in report.workers.boots if w.cannot_claim] if report.workers else []
    # Stuck on its horse (workers/horses.py, `HorseWorker.stuck`), and not counted twice.
    stuck = [w for w in report.workers.boots if w.stuck and not w.cannot_claim] if report.workers else []
    ready -= sum(not w.draining for w in held + stuck)
    if ready < mx:
        whys = ([f"{len(held)} not claiming: its host fails its check"] if held else []) + (
            [f"{len(stuck)} stuck on its horse"] if stuck else [])
        why = f" ({'; '.join(whys)})" if whys else ""
        reasons.append(f"fewer live workers than slots: {ready} ready for {mx} slot{'s' * (mx != 1)}{why}")
    notes += [f"worker {w.id} on {w.host or '?'} is not claiming: {w.cannot_claim}" for w in held[:_NAMED]]
    if len(held) > _NAMED:
        notes.append(f"... and {len(held) - _NAMED} more workers not claiming")
    # A worker stuck on its horse holds work it cannot do (the job it was handed, or runs): unhealthy whatever
    # the other workers can take.
    reasons += [f"worker {w.id} on {w.host or '?'} cannot take work: {w.stuck}" for w in stuck[:_NAMED]]
    if report.strays:
        daemons = sorted({x.daemon_id for x in report.strays})
        reasons.append(f"{len(report.strays)} stray container(s) run outside any slot on daemon(s) "
                       f"{', '.join(daemons)}: their workers are stopping them (see `strays`)")
    # Each names both daemons' hosts and sockets; it stands until an operator clears it (daemonmark.py).
    reasons.extend(line if daemonmark.clear_command(d) in line else
                   f"{line}; it stands until cleared, once one daemon has an identity of its own: "
                   f"{daemonmark.clear_command(d)}" for d, line in report.shared_daemons.items())
    if report.unknown:
        notes.append(f"{report.unknown} running job(s) could not be probed (Docker unreachable?); "
                     "their slots are kept until the probe answers")
    if report.promotion and report.promotion.paused:
        notes.append("promotion is paused: queued jobs will not start until `jobpool resume`")
    notes += _daemon_notes(report.daemons, now)
    notes += _live_restore_notes(report.workers)
    return Health(tuple(reasons), tuple(notes))


def _live_restore_notes(workers: Workers | None) -> list[str]:
    """One warning naming the Docker daemons whose workers read them running without live-restore, once per
    daemon identity (many workers share one daemon): restarting such a daemon stops every job running on it,
    charged to each as a crash or, stopped cleanly, as its own exit (README.md, "The container contract")."""
    without: dict[str, list[Worker]] = {}
    swarm: dict[str, list[Worker]] = {}
    for w in workers.boots if workers else ():
        if w.live_restore is False:
            (swarm if w.swarm else without).setdefault(
                w.daemon_id or f"the daemon of host {w.host or '?'}", []).append(w)
    notes = []
    if without:
        notes.append(f"{len(without)} Docker daemon(s) run without live-restore, so restarting one stops the "
                     f"jobs running on it: {_named(without)}. Turn it on: \"live-restore\": true in "
                     "/etc/docker/daemon.json, then reload dockerd")
    if swarm:  # Swarm refuses live-restore: the advice above would keep the daemon from starting
        notes.append(f"{len(swarm)} Docker daemon(s) are Swarm nodes, which cannot run with live-restore, so "
                     f"restarting one stops its jobs and its worker: {_named(swarm)}. Drain the node first "
                     "(docker node update --availability drain NODE): its jobs are handed back or resume")
    return notes


def _named(daemons: dict[str, list[Worker]]) -> str:
    named = [f"{daemon} (host {', '.join(sorted({w.host or '?' for w in ws}))}: worker "
             f"{', '.join(w.id for w in ws[:_NAMED_WORKERS])}{' ...' if len(ws) > _NAMED_WORKERS else ''})"
             for daemon, ws in sorted(daemons.items())[:_NAMED]]
    more = f"; ... and {len(daemons) - _NAMED} more" if len(daemons) > _NAMED else ""
    return "; ".join(named) + more


def _daemon_notes(daemons: Daemons | None, now: int) -> list[str]:
    """Warnings: slots held on a daemon's stale evidence (and the command that frees them if its host is gone
    for good), and daemons back after a declaration (what ran on it may have run twice)."""
    notes = []
    for d in daemons.stale if daemons else ():
        last = (f"last published {ago(d.last_published_ms, now)}" if d.last_published_ms is not None
                else "not published within a week")
        notes.append(f"daemon {d.daemon_id} holds {len(d.jobs)} slot(s) on stale evidence since "
                     f"{ago(d.since_ms, now)} (its inventory {last}; jobs {', '.join(d.jobs[:_NAMED])}"
                     f"{' ...' if len(d.jobs) > _NAMED else ''}): "
                     f"if its host is gone for good, `{d.command}`")
    for r in daemons.returned if daemons else ():
        what = ("it came back, publishing again" if r.how == "published"
                else f"the declaration was withdrawn by {r.by or '?'}")
        notes.append(f"daemon {r.daemon_id} declared gone by {r.forgotten_by or '?'} "
                     f"{ago(r.forgotten_at, now)}: {what} {ago(r.at, now)}; jobs judged absent on the "
                     "declaration meanwhile may have run twice")
    return notes


def read_status(store: Store, detail: bool = True) -> StatusReport:
    """Read and judge the pool's status; an unreachable Redis is an unhealthy report, not an error.

    Its cost is what the workers, daemons and processes of the fleet are, whatever runs: where the running
    jobs are is read as the scripts place them (scripts/_lib.lua `place_running`), and rows only of the jobs
    a daemon holds on stale evidence. Without `detail` (the metrics, which serve none of them) neither the
    workers' jobs nor the `daemons` section are read: the health verdict is the same, its warnings about
    daemons are not there."""
    url = safe_url(store.settings.redis_url)
    try:
        report, warnings = _read(store, url, detail)
    except errors.RedisUnavailable as exc:
        return StatusReport(pool=store.keys.pool, redis_url=url, reachable=False, health=Health((str(exc),)))
    return dataclasses.replace(report, health=judge(report, store.settings.sweep_interval_secs, warnings))


def _read(store: Store, url: str, detail: bool) -> tuple[StatusReport, tuple[str, ...]]:
    stats = store.stats()
    now, raw_sweep, boots, head, due, config, placed = store.status_head(MAX_BOOTS)
    warnings: list[str] = []
    sweep = _sweep(raw_sweep, now, warnings)
    boot_ids = [b for b, _ in boots]
    records, created = store.status_rows(boot_ids, head)
    jobs_of: dict[str, list[str]] = {}
    daemons = None
    inventories = store.inventories()
    if detail:
        where = _Placement.read(store, boot_ids) if placed else _Placement.recount(store)
        jobs_of, daemons = where.jobs_of, _daemons(store, where, inventories, now)
    found = _strays(store, inventories, now)
    created_at = _int(created) if head else None
    report = StatusReport(
        pool=store.keys.pool, redis_url=url, reachable=True, health=Health(), now_ms=now,
        slots=Slots(**stats["slots"]), counts=stats["counts"],
        queue=Queue(depth=stats["counts"]["queued"], oldest_job=head[0] if head else None,
                    oldest_wait_ms=None if created_at is None else now - created_at),
        waiting=_waiting(stats["counts"].get("waiting", 0), due),
        promotion=Promotion(stats["queue_paused"], stats["paused_by"], stats["paused_reason"],
                            _int(stats["paused_since"])),
        workers=_workers(boots, records, jobs_of, now), last_sweep=sweep,
        redis_policy=redispolicy.from_reply(config),  # a CONFIG GET refused (an ACL) is a warning
        strays=found, daemons=daemons, shared_daemons=_shared(store),
        limits=tuple(store.limits()))
    return report, tuple(warnings)


@dataclass(frozen=True)
class _Placement:
    """Where the running jobs are: the ids each boot owns, how many rows each daemon has placed under it,
    and (read from the rows) those rows' ids, or None where they are to be read from `running_on`."""

    jobs_of: dict[str, list[str]]
    counts: dict[str, int]
    on: dict[str, list[str]] | None = None

    @classmethod
    def read(cls, store: Store, boot_ids: list[str]) -> _Placement:
        """As the scripts keep it: one round trip, whatever runs."""
        owned, counts = store.placement(boot_ids)
        return cls({b: ids.split() for b, ids in zip(boot_ids, owned, strict=True) if ids},
                   {d: n for d, raw in counts.items() if (n := _int(raw))})

    @classmethod
    def recount(cls, store: Store) -> _Placement:
        """From every running row, for a pool whose running jobs are not all placed yet: one started before
        the scripts placed them runs still (`placed_kept` is written once none does)."""
        running = store.running_ids()
        jobs_of: dict[str, list[str]] = {}
        on: dict[str, list[str]] = {}
        for job_id, (fields, _) in zip(running, store.running_rows(running), strict=True):
            state, daemon_id, owner, _, affinity, _ = fields if isinstance(fields, list) else (None,) * 6
            if state != "running":
                continue
            if owner:
                jobs_of.setdefault(owner, []).append(job_id)
            if daemon := (daemon_id if owner else affinity):
                on.setdefault(daemon, []).append(job_id)
        return cls(jobs_of, {d: len(ids) for d, ids in on.items()}, on)


def _shared(store: Store) -> dict[str, str]:
    """The standing collisions (one read, whatever the fleet): every process that finds two daemons sharing
    its identity records it there in the very step that writes its report (scripts/daemon_collision.lua), so
    the processes' records, one read each, would add nothing. (A report an operator's `forget-collision`
    missed, a process registering as it ran, stands again at that process's next period.)"""
    return {identity: s.line for identity, s in daemonmark.read_standing(store).items()}


def _waiting(count: int, due: list[tuple[str, float]]) -> Waiting:
    """The waiting jobs: their count, and the first of their index (soonest due; +inf: none is held by
    time)."""
    if not due:
        return Waiting(count)
    job_id, score = due[0]
    return Waiting(count, job_id, int(score) if score != float("inf") else None)


def _strays(store: Store, inventories: Mapping[str, tuple[Any, Any, Any]], now: int) -> tuple[Stray, ...]:
    """The strays the fresh inventories list (`inventories`: one read per daemon of the `inventories`
    index). A stale one's list is not news: its workers are not there to stop them, and `daemons` names it
    instead; an inventory that cannot be read lists none."""
    stale_ms = store.settings.inventory_stale_secs * 1000
    return tuple(x for daemon, (raw_at, raw, _) in inventories.items()
                 if (at := _int(raw_at)) is not None and now - at <= stale_ms
                 for x in strays.decode(raw, daemon))


def _daemons(store: Store, where: _Placement, inventories: Mapping[str, tuple[Any, Any, Any]],
             now: int) -> Daemons:
    """The daemons declared gone and back, and those holding slots on stale evidence: of the daemons with
    running rows placed under them (neither declared nor a value no identity has), those whose inventory is
    stale or missing, and of their rows those with no lease (claimed there; promoted to wait for it, any).
    Each daemon's inventory is as `inventories` read it (the index's daemons), read here only for a daemon
    not in the index; rows are read only of the daemons found stale. A value that cannot be read counts as
    missing."""
    gone_keys, returned = store.declared_daemons(now - FORGET_MS)
    gone = sorted(str(d) for d in gone_keys or ())
    candidates = [d for d in sorted(where.counts) if is_identity(d) and d not in gone]
    unindexed = [d for d in candidates if d not in inventories]
    ats = {**{d: (at, last) for d, (at, _, last) in inventories.items()},
           **dict(zip(unindexed, store.inventory_ats(unindexed), strict=True))}
    stale_ms = store.settings.inventory_stale_secs * 1000
    silent: dict[str, tuple[int | None, int | None]] = {}
    for daemon in candidates:
        raw_at, raw_last = ats[daemon]
        at, last = _int(raw_at), _int(raw_last)
        if at is None or now - at > stale_ms:  # (from a fresh one the sweep judges its jobs)
            silent[daemon] = (at, last)
    on = where.on or {}
    ids_of = (dict(zip(silent, store.placed_on(list(silent)), strict=True)) if where.on is None
              else {d: on.get(d, []) for d in silent})
    ids = [j for d in silent for j in ids_of[d]]
    rows = dict(zip(ids, store.running_rows(ids), strict=True))
    stale = []
    for daemon, (at, published) in silent.items():
        held: list[tuple[int, str, int | None]] = []  # (promoted at, id, since): in promotion order
        for job_id in ids_of[daemon]:
            fields, lease = rows[job_id]
            state, daemon_id, owner, beat, affinity, promoted = (
                fields if isinstance(fields, list) else (None,) * 6)
            order = _int(promoted) or 0
            if state == "running" and owner and daemon_id == daemon and not lease:
                held.append((order, job_id, _int(beat)))
            elif state == "running" and not owner and affinity == daemon:
                # Promoted, waiting on the queue of the daemon holding its checkpoint: its workers take it.
                held.append((order, job_id, _int(promoted)))
        if not held:
            continue
        held.sort()
        last = at if at is not None else published
        beats = [b for _, _, b in held if b is not None]
        stale.append(StaleDaemon(daemon, tuple(j for _, j, _ in held),
                                 last if last is not None else max(beats, default=None), last))
    return Daemons(tuple(stale), tuple(gone), tuple(_returned(r) for r in returned or ()))


def _returned(raw: str) -> ReturnedDaemon:
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    doc = doc if isinstance(doc, dict) else {}
    return ReturnedDaemon(str(doc.get("daemon", "?")), str(doc.get("how", "")), str(doc.get("by", "")),
                          _int(doc.get("at")), _int(doc.get("forgotten_at")),
                          str(doc.get("forgotten_by", "")))


def _sweep(raw: str | Exception | None, now: int, warnings: list[str]) -> Sweep | None:
    """The last-sweep record; one that cannot be read is a warning (and, like none, no live supervisor)."""
    if raw is None:
        return None
    try:
        if isinstance(raw, Exception):
            raise ValueError(str(raw))
        return Sweep.parse(raw, now)
    except ValueError:
        warnings.append(f"the last-sweep record is unreadable: {str(raw)[:80]!r}")
        return None


def _workers(boots: list[tuple[str, float]], records: list[dict[str, str]],
             jobs_of: Mapping[str, list[str]], now: int) -> Workers:
    shown: list[Worker] = []
    stale = 0
    for (boot_id, score), row in zip(boots, records, strict=True):
        if not row:  # its TTL ran out: the process is gone
            stale += 1
        elif row.get("role", "worker") == "worker":  # a boot record of another process kind is not counted
            jobs = jobs_of.get(boot_id, [])
            shown.append(Worker.from_record(boot_id, row, score, now, tuple(jobs[:WORKER_JOBS]), len(jobs)))
    return Workers(live=len(shown), draining=sum(w.draining for w in shown), stale=stale, boots=tuple(shown))
