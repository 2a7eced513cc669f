"""Retention: how many finished jobs a pool keeps, and pruning the rest in bounded batches.

A pool that runs for months must not keep every job it ever ran: Redis would fill, refuse writes, and the
queue would stop. Each terminal state has two caps (Settings: `keep_<state>` newest jobs, none older than
`keep_<state>_secs`; 0 turns a cap off), and a job past either is removed with everything it left
(scripts/prune.lua). The terminal indexes are scored by finish time, so the jobs past a cap are always a
prefix of their index, oldest first: finding them reads only what will be removed.

The supervisor prunes a bounded amount each sweep (`prune(..., budget_secs=...)`), so a backlog of millions
never makes one sweep slow; `jobpool prune` runs to the end. Each batch is one script, which judges every
candidate again atomically, so a job finishing meanwhile is never removed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .contract import ADOPT_RQ_PREFIX, TERMINAL, JobState

if TYPE_CHECKING:
    from .config import Settings
    from .store.calls import Store

#: Rows removed by one script: big enough that pruning keeps up with any pool, small enough that one script
#: holds Redis for a few milliseconds.
BATCH = 200
#: How long a sweep spends pruning at most; the rest waits for the next sweep.
SWEEP_BUDGET_SECS = 0.2
#: Ids a dry run lists per state (it counts them all).
DRY_RUN_IDS = 1000


@dataclass(frozen=True)
class Cap:
    """The retention of one terminal state."""

    state: JobState
    keep: int
    max_age_secs: int

    def cutoff_ms(self, now_ms: int) -> int:
        """Jobs that finished before this are past the age cap (0: no age cap)."""
        return now_ms - self.max_age_secs * 1000 if self.max_age_secs else 0

    def describe(self) -> str:
        parts = [f"newest {self.keep}" if self.keep else "any number",
                 f"none older than {_duration(self.max_age_secs)}" if self.max_age_secs else "of any age"]
        return " and ".join(parts)


def caps(settings: Settings) -> tuple[Cap, ...]:
    """The retention caps of every terminal state, from the settings."""
    return tuple(Cap(state, int(getattr(settings, f"keep_{state.value}")),
                     int(getattr(settings, f"keep_{state.value}_secs")))
                 for state in sorted(TERMINAL, key=lambda s: s.value))


@dataclass
class PruneReport:
    """What a prune removed (or, in a dry run, would remove), per terminal state."""

    dry_run: bool
    counts: dict[str, int] = field(default_factory=dict)
    ids: dict[str, list[str]] = field(default_factory=dict)
    #: False when the time budget ran out with jobs still past their caps.
    complete: bool = True
    caps: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "complete": self.complete, "total": self.total,
                "states": {s: {"count": self.counts.get(s, 0), "ids": self.ids.get(s, []),
                               "kept": self.caps.get(s, "")} for s in self.caps}}


def past_caps(store: Store, cap: Cap, now_ms: int, limit: int) -> tuple[list[str], int]:
    """The oldest at most `limit` ids of `cap.state` that are past a cap now (oldest first), and how many
    are past a cap in all. Read only: scripts/prune.lua judges each again before it removes anything."""
    cutoff = cap.cutoff_ms(now_ms)
    card, old, head = store.retention_index(cap.state.value, cutoff, limit)
    over = max(card - cap.keep, 0) if cap.keep else 0
    total = max(over, old if cutoff else 0)
    return list(head[:min(total, limit)]), total


def prune(store: Store, dry_run: bool = False, budget_secs: float | None = None, batch: int = BATCH, *,
          actor: str) -> PruneReport:
    """Remove every finished job past its state's caps (at most `budget_secs` of work, when given), or with
    `dry_run` say how many would go and list the first of them."""
    report = PruneReport(dry_run=dry_run)
    deadline = None if budget_secs is None else time.monotonic() + budget_secs
    for cap in caps(store.settings):
        state = cap.state.value
        report.caps[state] = cap.describe()
        report.counts[state], report.ids[state] = 0, []
        if dry_run:
            ids, total = past_caps(store, cap, store.now_ms(), DRY_RUN_IDS)
            report.counts[state], report.ids[state] = total, ids
            continue
        while True:
            if deadline is not None and time.monotonic() > deadline:
                report.complete = False
                return report
            now = store.now_ms()
            ids, _ = past_caps(store, cap, now, batch)
            if not ids:
                break
            removed = _prune_batch(store, cap, ids, cap.cutoff_ms(now), actor)
            report.counts[state] += len(removed)
            report.ids[state] += removed
            if not removed:  # every candidate changed under us (a concurrent prune): read again next time
                break
    return report


def batch_keys(store: Store, ids: list[str]) -> list[str]:
    """The prune script's per-job keys for `ids` (scripts/prune.lua): what each job may have left, and the
    RQ hash of the adoption request its pointer names, which the script cannot name alone (it is read here
    and compared again there); '' when there is none."""
    keys: list[str] = []
    requests = store.adoption_requests(ids)
    for job_id, request in zip(ids, requests, strict=True):
        ours = isinstance(request, str) and request.startswith(f"{ADOPT_RQ_PREFIX}{job_id}-")
        keys += [*store.keys.leftovers(job_id), store.keys.rq_job(request) if ours else ""]
    return keys


def _prune_batch(store: Store, cap: Cap, ids: list[str], cutoff_ms: int, actor: str) -> list[str]:
    return store.prune(cap.state.value, cap.keep, cutoff_ms, actor, ids, batch_keys(store, ids))


def _duration(secs: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size and secs % size == 0:
            return f"{secs // size}{unit}"
    return f"{secs}s"
