"""Reading a pool's status report from Redis (jobpool/store/statusreads.py makes the round trips) and judging
it (jobpool/status/health.py). Its cost is what the fleet's workers, daemons and processes are, whatever runs
(docs/architecture.md, "Status at scale").
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import errors
from ..fleet import markrecords, strays
from ..fleet.daemonid import is_identity
from ..fleet.inventory import FORGET_MS
from ..fleet.strays import Stray
from ..store import redispolicy
from .health import judge
from .report import (
    Daemons,
    Health,
    Promotion,
    Queue,
    ReturnedDaemon,
    Slots,
    StaleDaemon,
    StatusReport,
    Sweep,
    Waiting,
    Worker,
    Workers,
    safe_url,
    stored_int,
)

if TYPE_CHECKING:
    from ..store.calls import Store

#: How many boots the report looks at (newest heartbeats first); the workers prune older ones
#: (workers/boot.py).
MAX_BOOTS = 1000
#: How many of a worker's running jobs the report names (`Worker.running` counts them all): a worker runs one
#: at a time, more only when it adopted others or rows were edited.
WORKER_JOBS = 10


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
    created_at = stored_int(created) if head else None
    report = StatusReport(
        pool=store.keys.pool, redis_url=url, reachable=True, health=Health(), now_ms=now,
        slots=Slots(**stats["slots"]), counts=stats["counts"],
        queue=Queue(depth=stats["counts"]["queued"], oldest_job=head[0] if head else None,
                    oldest_wait_ms=None if created_at is None else now - created_at),
        waiting=_waiting(stats["counts"].get("waiting", 0), due),
        promotion=Promotion(stats["queue_paused"], stats["paused_by"], stats["paused_reason"],
                            stored_int(stats["paused_since"])),
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
                   {d: n for d, raw in counts.items() if (n := stored_int(raw))})

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
    return {identity: s.line for identity, s in markrecords.read_standing(store).items()}


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
                 if (at := stored_int(raw_at)) is not None and now - at <= stale_ms
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
        at, last = stored_int(raw_at), stored_int(raw_last)
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
            order = stored_int(promoted) or 0
            if state == "running" and owner and daemon_id == daemon and not lease:
                held.append((order, job_id, stored_int(beat)))
            elif state == "running" and not owner and affinity == daemon:
                # Promoted, waiting on the queue of the daemon holding its checkpoint: its workers take it.
                held.append((order, job_id, stored_int(promoted)))
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
                          stored_int(doc.get("at")), stored_int(doc.get("forgotten_at")),
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
