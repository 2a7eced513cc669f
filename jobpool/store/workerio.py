"""`WorkerIO`: what a worker process reads and writes outside the scripts: its boot record (the heartbeat
every reader takes for a live worker: jobpool/workers/boot.py), the rows of the containers it finds on its
daemon (jobpool/workers/strays.py, jobpool/workers/inventory.py), and an entry RQ cannot load taken off
RQ's intermediate list (jobpool/workers/rqworker.py).

The boot record's writes and that removal raise redis-py's own errors: the worker judges them as it judges
every outage (jobpool/workers/outage.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from .keys import PoolKeys
from .runner import call_redis

#: The field of a boot record's JSON twin that names its boot (the hash has none: its key does).
TWIN_ID = "boot_id"


class WorkerIO:
    """A worker's reads and writes of one pool (a part of `store.calls.Store`)."""

    client: redis.Redis
    keys: PoolKeys

    def beat_boot(self, boot_id: str, record: Mapping[Any, str | int], ttl_ms: int, now_ms: int) -> None:
        """Write a boot's record whole with a TTL of `ttl_ms`, and its place in the `boots` index; forget
        boots whose records expired long ago, so the index stays the size of the fleet. One MULTI.

        The record is written twice, as the hash every reader of one boot reads (HMGET of its fields, EXISTS)
        and as its JSON twin (`boot_json`, the values as the hash returns them: strings, and the boot's id
        under `TWIN_ID`, which a reader checks), which a status read takes for the whole fleet in one MGET
        instead of a HGETALL per boot. Both in the same MULTI with the same TTL, removed together
        (`remove_boot`): they agree, unless the hash's key was replaced by hand with another type (its write
        then fails in the MULTI, the twin's does not). A boot with no twin (a worker of an earlier release)
        is read from its hash."""
        key = self.keys.boot(boot_id)
        fields: dict[Any, str] = {str(k): str(v) for k, v in record.items()}
        twin = json.dumps({**fields, TWIN_ID: boot_id}, separators=(",", ":"))
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping=fields)
        pipe.pexpire(key, ttl_ms)
        pipe.set(self.keys.boot_json(boot_id), twin, px=ttl_ms)
        pipe.zadd(self.keys.boots, {boot_id: now_ms})
        pipe.zremrangebyscore(self.keys.boots, 0, now_ms - 10 * ttl_ms)
        pipe.execute()

    def remove_boot(self, boot_id: str) -> None:
        """A clean exit's removal of a boot's record and index entry (a crash lets the record expire)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.keys.boot(boot_id), self.keys.boot_json(boot_id))
        pipe.zrem(self.keys.boots, boot_id)
        pipe.execute()

    def drop_taken(self, intermediate_key: str, job_id: str) -> None:
        """Take one entry off an RQ queue's intermediate list, where RQ's BLMOVE leaves what a worker took: an
        entry RQ cannot load, which RQ's maintenance would choke on there too."""
        self.client.lrem(intermediate_key, 1, job_id)

    def rows_and_boots(self, job_ids: Sequence[str], fields: Sequence[str],
                       boots: Sequence[str]) -> tuple[list[Any], list[bool]]:
        """Each job's `fields` (all None for no row) or the error its read met, and whether each boot is one
        this pool's `boots` index knows, in one round trip."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(k.job(job_id), fields)
        for boot in boots:
            pipe.zscore(k.boots, boot or "-")
        replies = call_redis(pipe.execute, raise_on_error=False, what="reading running containers' rows")
        n = len(job_ids)
        return list(replies[:n]), [not isinstance(r, Exception) and r is not None for r in replies[n:]]

    def rows_and_leases(self, job_ids: Sequence[str]) -> list[tuple[Any, Any]]:
        """Each job's (state, attempt) and its lease's value, in one round trip; an error reply is left in
        the place of what it was read for. redis-py's errors are raised as they are (the inventory thread
        judges them)."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(k.job(job_id), ["state", "attempt"])
            pipe.get(k.lease(job_id))
        replies = pipe.execute(raise_on_error=False)
        return [(replies[2 * i], replies[2 * i + 1]) for i in range(len(job_ids))]
