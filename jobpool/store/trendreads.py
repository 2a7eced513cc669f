"""`TrendReads`: what is read for the pool's history (jobpool/trends.py): the times of the jobs that ended in
one point's span, for its percentiles, and the recorded points. Recording one is a script
(scripts/trend_sample.lua, store/calls.py)."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from .keys import PoolKeys
from .runner import call_redis

#: The terminal states (models.TERMINAL), in the order scripts/trend_sample.lua records their counts.
ENDED = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class EndedTimes:
    """One job that ended in a point's span: when it was enqueued, claimed (its last attempt's start; None
    for a job that never ran) and ended, in ms of Redis time."""

    created_ms: int
    claimed_ms: int | None
    finished_ms: int


def _ms(raw: object) -> int | None:
    try:
        return int(str(raw))
    except ValueError:
        return None


class TrendReads:
    """The pool's history, read (a part of `store.calls.Store`)."""

    client: redis.Redis
    keys: PoolKeys

    def ended_between(self, start_ms: int, end_ms: int, most: int) -> list[EndedTimes]:
        """Up to `most` jobs per terminal state that ended in [start_ms, end_ms): two round trips whatever the
        pool holds (the terminal indexes are scored by when each job ended). A row pruned meanwhile, or one
        whose times cannot be read, is left out."""
        pipe = self.client.pipeline(transaction=False)
        for state in ENDED:
            pipe.zrangebyscore(self.keys.state_index(state), start_ms, f"({end_ms}", start=0, num=most)
        ids = [i for got in call_redis(pipe.execute, what="jobs ended in a history point") for i in got]
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(self.keys.job(job_id), "created_at", "claimed_at", "finished_at")
        times = []
        for reply in call_redis(pipe.execute, raise_on_error=False, what="jobs ended in a history point"):
            if isinstance(reply, Exception):  # a key that is no hash: no row to read
                continue
            created, claimed, finished = reply
            c, f = _ms(created), _ms(finished)
            if c is not None and f is not None:
                times.append(EndedTimes(c, None if claimed is None else _ms(claimed), f))
        return times

    def trend_points(self) -> dict[str, str]:
        """Every recorded point as stored (position -> record), at most TREND_POINTS (contract.py)."""
        return dict(call_redis(self.client.hgetall, self.keys.trends, what="the pool's history"))
