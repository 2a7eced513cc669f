"""Why a queued job waits, in words: what `jobpool show`, the dashboard's job page and `Pool.why_waiting`
say (docs/architecture.md, "Order and limits").

The scripts park a queued job that cannot start under what it waits for (a limit's name, '#slots' for its
weight, '#reserved' for a reservation ahead of it); a job not parked waits for its turn. This module reads
those facts (jobpool/store/orderreads.py) and the limits, and says them; it decides nothing, and a fact read
a moment ago may be gone by the time it is shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from .models import Job, JobState
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
