"""`EventReads`: the reads of the pool's event stream and of a job's own history (jobpool/events.py makes
events of them), each as the stream or the row holds it.
"""

from __future__ import annotations

from typing import Any

import redis

from .keys import PoolKeys
from .runner import call_redis, wrap_redis_error

#: Stream entries as redis-py reads them: (id, fields).
Entries = list[tuple[str, dict[str, str]]]


class EventReads:
    """The event reads of one pool (a part of `store.calls.Store`)."""

    client: redis.Redis
    keys: PoolKeys

    def history_and_newest(self, job_id: str) -> tuple[str | None, Entries]:
        """A job's `history` field (None when the row keeps none, or its key holds no hash) and the newest
        stream entry then, in one transaction, so a follow from it has no gap and no repeat."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hget(self.keys.job(job_id), "history")
        pipe.xrevrange(self.keys.events, "+", "-", 1)
        found, newest = call_redis(pipe.execute, raise_on_error=False, what="history")
        if isinstance(newest, redis.RedisError):
            raise wrap_redis_error(newest, "history")
        if isinstance(found, redis.ResponseError):  # the job's key holds no hash: not a row that keeps one
            found = None
        return found, newest

    def events_after(self, after: str, count: int) -> Entries:
        """At most `count` entries from `after` ("-" or a stream id, "(" first: exclusive), oldest first."""
        return list(call_redis(self.client.xrange, self.keys.events, after, "+", count))

    def events_before(self, upper: str, count: int) -> Entries:
        """At most `count` entries up to `upper` ("+" or a stream id, "(" first: exclusive), newest first."""
        return list(call_redis(self.client.xrevrange, self.keys.events, upper, "-", count))

    def events_following(self, after: str, count: int, block_ms: int) -> Any:
        """Entries after stream id `after`, waiting at most `block_ms` on the server for the first; redis-py's
        XREAD reply ([(stream, entries)], or None when none came)."""
        return call_redis(self.client.xread, {self.keys.events: after}, count=count, block=block_ms)
