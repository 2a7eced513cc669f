"""`OrderReads`: what is read of order and limits outside the scripts (docs/architecture.md, "Order and
limits"): the named limits with their use, and what holds a queued job back, for `jobpool show`, `status`,
the dashboard and /metrics. The scripts keep these structures (scripts/_lib.lua, "Order and limits"); a read
here is a snapshot from one MULTI and decides nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .reads import Reads, slots_used_of
from .runner import call_redis


@dataclass(frozen=True)
class LimitUse:
    """One named limit: its name (a name, or a prefix and '*': each name under it has its own `size`), its
    size, and the units in use under it (a pattern's names summed)."""

    name: str
    size: int
    used: int


@dataclass(frozen=True)
class QueueFacts:
    """What the scripts know of one queued job's wait, read at one moment: its place among the promotable
    (None while parked), what it is parked on ('' for nothing: a limit's name, '#slots', '#reserved'), the
    slots in use and the limit, the reservation's holder ('' for none), and whether promotion is paused."""

    ahead: int | None
    parked_on: str
    slots_used: int
    slots: int
    reserved: str
    queue_paused: bool


def _whole(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class OrderReads(Reads):
    """The reads of order and limits."""

    def limits(self) -> list[LimitUse]:
        """Every named limit, by name, with its use (one MULTI)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hgetall(self.keys.limits)
        pipe.hgetall(self.keys.limit_used)
        sizes, used = call_redis(pipe.execute, what="reading the limits")
        return [LimitUse(name, _whole(size), _whole(used.get("=" + name)))
                for name, size in sorted(sizes.items())]

    def names_in_use(self, names: Sequence[str]) -> dict[str, int]:
        """Units in use of each of `names` (0 for none)."""
        if not names:
            return {}
        values = call_redis(self.client.hmget, self.keys.limit_used, list(names), what="reading limit use")
        return {name: _whole(v) for name, v in zip(names, values, strict=True)}

    def holds(self) -> dict[str, str]:
        """What each running job holds beyond one plain slot: id -> 'weight|name=amount=limit;...'
        (bounded by the running jobs)."""
        return dict(call_redis(self.client.hgetall, self.keys.holds, what="reading the holds"))

    def slots_in_use(self) -> int:
        """Slots in use, weights counted (`Reads.slots`)."""
        return self.slots()[0]

    def queue_facts(self, job_id: str, parked: str) -> QueueFacts:
        """The facts of one queued job's wait (`parked`: its row's `parked` member, '' for none)."""
        k = self.keys
        pipe = self.client.pipeline(transaction=True)
        pipe.zrank(k.ready, job_id)
        pipe.zscore(k.blocked, parked) if parked else pipe.echo("")
        pipe.hmget(k.config, "slots_used", "max_concurrent_jobs", "reserved")
        pipe.zcard(k.running)
        pipe.exists(k.paused)
        replies = call_redis(pipe.execute, what="reading a wait")
        rank, parked_score, (used, size, reserved), running, paused = replies
        on = parked.split(" ", 1)[0] if parked and parked_score not in (None, "") else ""
        return QueueFacts(ahead=None if rank is None else int(rank), parked_on=on,
                          slots_used=slots_used_of(used, running), slots=self.limit(size),
                          reserved=(reserved or "").split("|", 1)[0], queue_paused=bool(paused))
