"""Why a job waits, in words: what `jobpool show`, `jobpool ls`, the dashboard's pages and `Pool.why_waiting`
say (docs/architecture.md, "Order and limits" and "Time and dependencies").

The scripts park a queued job that cannot start under what it waits for (a limit's name, '#slots' for its
weight, '#reserved' for a reservation ahead of it); a job not parked waits for its turn. This module reads
those facts (jobpool/store/orderreads.py) and the limits, and says them; it decides nothing, and a fact read
a moment ago may be gone by the time it is shown. A `waiting` job is held before the queue, by time (its
row's `wait_until` and `wait_reason`) or by the jobs of its `after`, whose states are read to say which of
them it still waits for (`why_held`; `wait_note` says it in a few words from the row alone).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Protocol

from .models import Job, JobState
from .status import coarse_span
from .store.orderreads import LimitUse, QueueFacts

#: How many holders of a full limit are named.
HOLDERS_SHOWN = 3


class OrderFacts(Protocol):
    """What is read to say why a job waits (jobpool/store/orderreads.py)."""

    def queue_facts(self, job_id: str, parked: str) -> QueueFacts: ...

    def limits(self) -> list[LimitUse]: ...

    def holds(self) -> dict[str, str]: ...

    def names_in_use(self, names: list[str]) -> dict[str, int]: ...


def covering(sizes: Mapping[str, int], name: str) -> str | None:
    """The limit over `name`, as the scripts resolve it (scripts/_lib.lua `limit_for`): its own, else the
    longest pattern over it; None for none."""
    if name in sizes:
        return name
    patterns = [p for p in sizes if p.endswith("*") and name.startswith(p[:-1])]
    return max(patterns, key=len) if patterns else None


def holders_of(holds: Mapping[str, str], name: str) -> list[str]:
    """The running jobs holding units of `name`, from `holds` (id -> 'weight|name=amount=limit;...')."""
    found = []
    for job_id, hold in holds.items():
        uses = hold.partition("|")[2]
        if any(part.split("=", 1)[0] == name for part in uses.split(";") if part):
            found.append(job_id)
    return sorted(found)


def _limit_line(facts: OrderFacts, job: Job, name: str) -> str:
    sizes = {u.name: u.size for u in facts.limits()}
    limit = covering(sizes, name)
    if limit is None:
        return f"no limit covers {name} any more: it waits until one does (jobpool limit {name} N)"
    used = facts.names_in_use([name])[name]
    holders = holders_of(facts.holds(), name)
    shown = ", ".join(holders[:HOLDERS_SHOWN]) + (f" and {len(holders) - HOLDERS_SHOWN} more"
                                                 if len(holders) > HOLDERS_SHOWN else "")
    via = "" if limit == name else f" (limit {limit})"
    return (f"{name} {used}/{sizes[limit]}{via}, needs {job.spec.uses.get(name, 1)}"
            + (f", held by {shown}" if shown else ""))


def why_waiting(facts: OrderFacts, job: Job, parked: str) -> list[str]:
    """What holds queued job `job` back, one line each ([] for a job that is not queued). `parked` is its
    row's `parked` member ('' for none)."""
    if job.state is not JobState.QUEUED:
        return []
    f = facts.queue_facts(job.id, parked)
    lines = []
    if f.queue_paused:
        lines.append("the queue is paused (jobpool resume)")
    free = max(0, f.slots - f.slots_used)
    if f.parked_on == "#slots":
        lines.append(f"needs {job.spec.slots} slots, {free} free of {f.slots}")
    elif f.parked_on == "#reserved":
        held = f.reserved or "a job passed over"
        lines.append(f"a reservation ahead of it: {held} waits for what it needs")
    elif f.parked_on:
        lines.append(_limit_line(facts, job, f.parked_on))
    elif f.ahead is not None:
        lines.append(f"{f.ahead} ahead of it" if f.ahead else "next in line")
        if free < job.spec.slots:
            lines.append(f"the pool is full: {f.slots_used} of {f.slots} slots in use")
    return lines


# ---- waiting jobs: time and dependencies ----------------------------------------------------------------

#: How many of the jobs a waiting job waits for `why_held` names (those not succeeded first).
DEPENDENCIES_SHOWN = 10
#: How many of them a list's note names (past that it counts them).
NOTE_NAMES = 2


class HoldFacts(Protocol):
    """What is read to say what a waiting job waits for (jobpool/store/statusreads.py)."""

    def job_states(self, job_ids: Sequence[str]) -> list[str | None]: ...


def utc_text(ms: int) -> str:
    """A time (ms since the epoch) as ISO-8601 UTC to the second."""
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def until_words(ms: int, now_ms: int) -> str:
    """'in 5 min' for a time to come (ms); 'due now' for one reached."""
    secs = (ms - now_ms) / 1000
    if secs <= 0:
        return "due now"
    return f"in {coarse_span(secs)}"


def _why_timed(job: Job) -> str:
    """Why a time holds a waiting job (its row's `wait_reason`, scripts/_lib.lua "Time and dependencies"):
    its retry (which of how many, after what) or its delayed start."""
    if job.wait_reason == "retry":
        after = f", after {job.error_reason}" if job.error_reason else ""
        return f"retry {job.retries_used} of {job.spec.retries}{after}"
    return "delayed start"


def _dependencies(job: Job) -> tuple[str, ...]:
    """The jobs a waiting job may still wait for: none while it waits out a retry's delay (it ran, so they
    had all succeeded)."""
    return () if job.wait_reason == "retry" else job.after


def wait_note(job: Job, now_ms: int) -> str:
    """A waiting job's hold in a few words, from its row alone (a list's note: `ls`, the dashboard's lists):
    the jobs it waits for, counted, and until when and why a time holds it; '' for a job not waiting."""
    if job.state is not JobState.WAITING:
        return ""
    parts, after = [], _dependencies(job)
    if after:
        parts.append(f"after {', '.join(after)}" if len(after) <= NOTE_NAMES else f"after {len(after)} jobs")
    if job.wait_until is not None and (job.wait_until > now_ms or not after):
        parts.append(f"until {utc_text(job.wait_until)} ({until_words(job.wait_until, now_ms)}; "
                     f"{_why_timed(job)})")
    return "; ".join(parts)


def why_held(facts: HoldFacts, job: Job, now_ms: int) -> list[str]:
    """What holds waiting job `job`, one line each ([] for a job that is not waiting): the jobs it waits for
    with their states (those not succeeded first, at most DEPENDENCIES_SHOWN named), then until when a time
    holds it and why; or, when nothing holds it any more, that the release step is due to queue it."""
    if job.state is not JobState.WAITING:
        return []
    lines, after = [], _dependencies(job)
    states = dict(zip(after, facts.job_states(list(after)), strict=True)) if after else {}
    left = [d for d in after if states.get(d) != JobState.SUCCEEDED.value]
    if after:
        named = (left + [d for d in after if d not in left])[:DEPENDENCIES_SHOWN]
        text = ", ".join(f"{d} ({states.get(d) or 'gone'})" for d in named)
        more = len(after) - len(named)
        lines.append(f"jobs {text}" + (f" and {more} more" if more else "")
                     + f": {len(after) - len(left)} of {len(after)} succeeded")
    until = job.wait_until if job.wait_until is not None and job.wait_until > now_ms else None
    if until is not None:
        lines.append(f"until {utc_text(until)}, {until_words(until, now_ms)} ({_why_timed(job)})")
    if not left and until is None:
        lines.append("nothing any more: a supervisor's timer queues it (or cancels it, a job it waited for "
                     "having failed) at its next tick")
    return lines
