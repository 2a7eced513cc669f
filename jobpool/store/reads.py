"""`Reads`: what is read from a pool's Redis outside the scripts, on the store's client: a job's row, the
counts, the limit, the clock and whether a worker boot lives, which every reader shares (`Pool`, the
supervisor, the workers). `store.calls.Store` is these plus the scripts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from .. import errors
from ..config import Settings
from ..contract import JobState
from ..digits import ascii_whole
from ..models import Job
from .keys import PoolKeys
from .redispolicy import PolicyCheck, check_at_start
from .runner import call_redis


def slots_used_of(stored: Any, running: Any) -> int:
    """The slots in use: the scripts' count of the running jobs' weights (`slots_used`, scripts/_lib.lua), or
    for a pool from before weights, where every running job holds one, their count."""
    value = ascii_whole(stored) if isinstance(stored, str) else None
    return value if value is not None else int(running)


@dataclass(frozen=True)
class ServerRun:
    """Which redis-server process answers, as its INFO says (jobpool/redistrust.py judges it): its run id,
    new at each start ('' when not said), how long it has been up (None when not said or unreadable), and
    its replication id ('' when not said), new whenever it is promoted: a primary that failed over to a
    replica and back keeps its run id and its uptime, but not its replication id. (A primary also takes a
    new one when it makes its replication backlog anew: its first replica attaching, or one coming back
    after `repl-backlog-ttl`; jobpool/redistrust.py then holds for a lease too, as for a failover.)"""

    run_id: str
    uptime_secs: int | None
    replid: str = ""


class Reads:
    """One pool's keys and settings on one Redis client (replies decoded: redisurl.connect)."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self.keys = PoolKeys(settings.pool)

    def row(self, job_id: str) -> dict[str, str]:
        """A job's row as stored ({} for none; `CorruptRow` when its key is not a hash)."""
        return dict(call_redis(self.client.hgetall, self.keys.job(job_id)))

    def job(self, job_id: str, coalesced: bool = False) -> Job:
        """A job's row read back as a `Job` (`coalesced`: what an enqueue that found it says); `NotFound` for
        none, `CorruptRow` when it holds something that cannot be read."""
        try:
            row = self.row(job_id)
        except errors.CorruptRow as exc:
            raise errors.CorruptRow(f"job {job_id}: its row is not a hash ({exc})", job_id) from None
        if not row:
            raise errors.NotFound(errors.no_job(job_id))
        return Job.from_row(row, coalesced=coalesced, job_id=job_id)

    def rows(self, ids: Sequence[str]) -> list[Any]:
        """Each job's row as stored ({} for none), or the error its read met, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.keys.job(job_id))
        return list(call_redis(pipe.execute, raise_on_error=False))

    def rows_found(self, job_ids: Sequence[str], what: str) -> int:
        """How many of these jobs have a row (one EXISTS); `what` names the read in an error."""
        return int(call_redis(self.client.exists, *[self.keys.job(job_id) for job_id in job_ids], what=what))

    def state_ids(self, state: str, limit: int, newest_first: bool) -> list[str]:
        """The first `limit` ids of a state's index, oldest first or newest first."""
        key = self.keys.state_index(state)
        read = self.client.zrevrange if newest_first else self.client.zrange
        return list(call_redis(read, key, 0, limit - 1))

    def state_page(self, state: str, offset: int, limit: int, newest_first: bool) -> tuple[int, list[str]]:
        """How many ids a state's index holds, and ids `offset` to `offset + limit` of it, from one moment
        (one MULTI)."""
        key = self.keys.state_index(state)
        pipe = self.client.pipeline(transaction=True)
        pipe.zcard(key)
        if newest_first:
            pipe.zrevrange(key, offset, offset + limit - 1)
        else:
            pipe.zrange(key, offset, offset + limit - 1)
        total, ids = call_redis(pipe.execute, what="page")
        return int(total), list(ids)

    def retention_index(self, state: str, cutoff_ms: int, limit: int) -> tuple[int, int, list[str]]:
        """Of a finished state's index, from one moment (one MULTI): how many ids it holds, how many finished
        before `cutoff_ms` (none asked when it is 0), and its oldest `limit` ids (at least one)."""
        index = self.keys.state_index(state)
        pipe = self.client.pipeline(transaction=True)
        pipe.zcard(index)
        pipe.zcount(index, "-inf", f"({cutoff_ms}" if cutoff_ms else "-inf")
        pipe.zrange(index, 0, max(limit, 1) - 1)
        card, old, head = call_redis(pipe.execute, what="reading the retention index")
        return int(card), int(old), list(head)

    def adoption_requests(self, job_ids: Sequence[str]) -> list[Any]:
        """The RQ job id of each job's latest adoption request (None for none)."""
        if not job_ids:
            return []
        return list(call_redis(self.client.mget, [self.keys.adoption(job_id) for job_id in job_ids],
                               what="reading adoption requests"))

    def log_tail(self, job_id: str) -> str | None:
        """The log tail field of a job's row as stored (jobpool/logtail.py decodes it)."""
        tail: str | None = call_redis(self.client.hget, self.keys.job(job_id), "log_tail")
        return tail

    def boot_exists(self, boot_id: str) -> bool:
        """Whether a worker boot's record is there (its process heartbeats it; a crash lets it expire)."""
        return bool(call_redis(self.client.exists, self.keys.boot(boot_id)))

    def boot_is_live(self, boot_id: str) -> bool:
        """Whether a worker boot's record is still there: its process heartbeats it, a crash lets it expire
        (workers/boot.py). False for an empty id (a row no worker has claimed)."""
        return bool(boot_id) and self.boot_exists(boot_id)

    def now_ms(self) -> int:
        """Now on the Redis server's clock: the clock every time in a row, an event or a record is on."""
        secs, usecs = call_redis(self.client.time)
        return int(secs) * 1000 + int(usecs) // 1000

    def ping(self) -> None:
        """One round trip, for a process that wants its connection open before it needs it (redis-py's
        errors raised as they are)."""
        self.client.ping()

    def server_run(self) -> ServerRun:
        """Which server process answers (INFO server and INFO replication, one round trip; Redis 6.2 takes
        one section a call). Unknown when INFO is refused (an ACL, a renamed command): then restarts and
        failovers cannot be seen, only outages. `RedisUnavailable` when Redis does not answer (its message
        names redis-py's error)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.info("server")
        pipe.info("replication")
        try:
            info, replication = pipe.execute(raise_on_error=False)
        except (redis.RedisError, OSError) as exc:
            raise errors.RedisUnavailable(f"redis does not answer ({type(exc).__name__})") from None
        replid = "" if isinstance(replication, Exception) else str(replication.get("master_replid", ""))
        if isinstance(info, Exception):
            return ServerRun("", None, replid)
        try:
            uptime: int | None = int(info["uptime_in_seconds"])
        except (KeyError, ValueError, TypeError):
            uptime = None
        return ServerRun(str(info.get("run_id", "")), uptime, replid)

    def check_policy(self) -> PolicyCheck:
        """What every long-running process does before its first write (store/redispolicy.py
        `check_at_start`): `EvictingRedis` for a Redis that may evict job rows, a warning for one that may
        evict leases or whose policy cannot be read."""
        return check_at_start(self.client)

    def counters(self) -> dict[str, str]:
        """The pool's `metrics` hash as stored (jobpool/metrics.py reads it): one read of one hash, a bounded
        number of fields whatever the pool holds."""
        return dict(call_redis(self.client.hgetall, self.keys.metrics, what="reading the counters"))

    def limit(self, stored: str | None) -> int:
        """The limit the scripts use (scripts/_lib.lua max_slots): the stored one if it is a number, else
        this pool's default, which every script is given (store/runner.py Scripts)."""
        try:
            value = float(stored) if stored is not None else math.nan
        except ValueError:
            value = math.nan
        return int(value) if math.isfinite(value) else self.settings.max_concurrent_jobs

    def slots(self) -> tuple[int, int]:
        """(used, max) of the fleet-wide limit, each running job counted by its weight."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.keys.running)
        pipe.hmget(self.keys.config, "max_concurrent_jobs", "slots_used")
        running, (mx, used) = call_redis(pipe.execute)
        return slots_used_of(used, running), self.limit(mx)

    def stats(self) -> dict[str, Any]:
        """Counts per state, slots, and whether promotion is paused (by whom, why, since when)."""
        pipe = self.client.pipeline(transaction=False)
        for st in JobState:
            pipe.zcard(self.keys.state_index(st.value))
        pipe.hmget(self.keys.config, "max_concurrent_jobs", "slots_used")
        pipe.hgetall(self.keys.paused)
        *replies, (mx, used), paused = call_redis(pipe.execute)
        counts = {st.value: int(c) for st, c in zip(JobState, replies, strict=True)}
        return {
            "pool": self.keys.pool,
            "counts": counts,
            "slots": {"used": slots_used_of(used, counts[JobState.RUNNING.value]), "max": self.limit(mx)},
            "queue_paused": bool(paused),
            "paused_by": paused.get("by") if paused else None,
            "paused_reason": paused.get("reason") if paused else None,
            "paused_since": ascii_whole(paused.get("since")) if paused else None,
        }
