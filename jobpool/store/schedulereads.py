"""`ScheduleReads`: what is read of a pool's schedules outside their scripts (jobpool/schedules.py judges it):
which are due, one schedule's definition and watermark with the server's time as one snapshot, all of them for
a listing, and the tick each last job was fired for. Every change is a script (store/calls.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from .keys import PoolKeys
from .runner import call_redis


@dataclass(frozen=True)
class ScheduleSnapshot:
    """One schedule as read in one step: the server's time (ms), its definition (JSON; None when there is no
    such schedule) and its watermark record ('tick|job|at'; None when there is none)."""

    now_ms: int
    definition: str | None
    ticks: str | None


@dataclass(frozen=True)
class ScheduleTable:
    """Every schedule of a pool as stored: definitions, watermark records and next ticks (ms), by name."""

    definitions: dict[str, str]
    ticks: dict[str, str]
    next_ms: dict[str, int]


class ScheduleReads:
    """A pool's schedules, read (a part of `store.calls.Store`)."""

    client: redis.Redis
    keys: PoolKeys

    def due_schedules(self, now_ms: int, most: int) -> list[str]:
        """The names of up to `most` schedules whose next tick is at or before `now_ms` (Redis time), soonest
        first."""
        return list(call_redis(self.client.zrangebyscore, self.keys.schedule_next, "-inf", now_ms, 0, most,
                               what="due schedules"))

    def schedule_snapshot(self, name: str) -> ScheduleSnapshot:
        """Schedule `name` and the server's time, read in one transaction: the tick computed from them is
        never later than the time they were true at."""
        pipe = self.client.pipeline(transaction=True)
        pipe.time()
        pipe.hget(self.keys.schedules, name)
        pipe.hget(self.keys.schedule_ticks, name)
        (secs, usecs), definition, ticks = call_redis(pipe.execute, what="reading a schedule")
        return ScheduleSnapshot(int(secs) * 1000 + int(usecs) // 1000, definition, ticks)

    def schedule_table(self) -> ScheduleTable:
        """Every schedule, in one transaction."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hgetall(self.keys.schedules)
        pipe.hgetall(self.keys.schedule_ticks)
        pipe.zrange(self.keys.schedule_next, 0, -1, withscores=True)
        definitions, ticks, nexts = call_redis(pipe.execute, what="reading the schedules")
        return ScheduleTable(dict(definitions), dict(ticks), {str(n): int(s) for n, s in nexts})

    def fired_ticks(self, job_ids: Sequence[str]) -> list[Any]:
        """The `tick` field of each job's row (None for a row that is gone or has none), in order."""
        if not job_ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(self.keys.job(job_id), "tick")
        return list(call_redis(pipe.execute, raise_on_error=False, what="reading schedules' last jobs"))
