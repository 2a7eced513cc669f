"""`LogReads`: the reads of a job's live log (scripts/log_append.lua writes it; jobpool/livelogs.py reads
lines of it), each as the stream holds it. A position in the log is a byte offset: entry ids are
'<offset>-0', the offset being how many bytes of the log end with that entry.
"""

from __future__ import annotations

import redis

from .eventreads import Entries
from .keys import PoolKeys
from .runner import call_redis, wrap_redis_error


class LogReads:
    """The live log reads of one pool (a part of `store.calls.Store`)."""

    client: redis.Redis
    keys: PoolKeys

    def log_after(self, job_id: str, offset: int, count: int) -> Entries:
        """At most `count` entries of the job's live log that end past byte `offset`, oldest first."""
        after = f"({offset}-0" if offset else "-"
        return list(call_redis(self.client.xrange, self.keys.job_log(job_id), after, "+", count))

    def log_following(self, job_id: str, offset: int, count: int, block_ms: int) -> Entries:
        """`log_after`, waiting at most `block_ms` on the server for the first entry (none when none came)."""
        reply = call_redis(self.client.xread, {self.keys.job_log(job_id): f"{offset}-0"}, count=count,
                           block=block_ms)
        return list(reply[0][1]) if reply else []

    def log_tail_and_attempt(self, job_id: str) -> tuple[str | None, str]:
        """The row's log tail as stored (jobpool/logtail.py decodes it) and its attempt ('' with no row)."""
        tail, attempt = call_redis(self.client.hmget, self.keys.job(job_id), ["log_tail", "attempt"],
                                   what="live log")
        return tail, attempt or ""

    def watch_log(self, job_id: str, secs: float) -> None:
        """Say that the job's live log is being read, for `secs`: its worker then sends it every second
        (heartbeat.lua tells it). A presence mark of the reader, no state of the job's: it only expires. A
        Redis that refuses it (a reader's ACL with no writes) leaves the log at its slower rate; the read
        goes on."""
        try:
            self.client.set(self.keys.log_watch(job_id), "1", px=int(secs * 1000))
        except redis.ResponseError:
            return
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, "live log") from None

    def log_end(self, job_id: str) -> tuple[str | None, Entries]:
        """The job's state (None with no row) and its live log's newest entry (none: no log), at one time."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hget(self.keys.job(job_id), "state")
        pipe.xrevrange(self.keys.job_log(job_id), "+", "-", 1)
        state, newest = call_redis(pipe.execute, raise_on_error=False, what="live log")
        for reply in (state, newest):
            if isinstance(reply, redis.RedisError) and not isinstance(reply, redis.ResponseError):
                raise wrap_redis_error(reply, "live log")
        return (state if isinstance(state, str) else None,
                list(newest) if isinstance(newest, list) else [])  # a key of another type: no log
