"""`StatusReads`: the reads the status report is made of (jobpool/status/read.py judges them), each a bounded
number of round trips whatever the pool holds. What cannot be read of one key is left as None (or as its
error, where said), never failing the report: the report is about the pool, not one row. Also the states of
the jobs a waiting job waits for, which `show` and the dashboard's job page report (jobpool/waiting.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

import redis

from .keys import PoolKeys
from .redispolicy import SETTING
from .runner import call_redis, wrap_redis_error
from .workerio import TWIN_ID

_WHAT = "status"


def _or_none(replies: list[Any]) -> list[Any]:
    return [None if isinstance(r, Exception) else r for r in replies]


def _pairs(reply: Any) -> list[tuple[str, float]]:
    """A WITHSCORES reply as (member, score) pairs: a flat list over RESP2, a list of pairs over RESP3."""
    if not reply:
        return []
    if isinstance(reply[0], list):
        return [(member, float(score)) for member, score in reply]
    it = iter(reply)
    return [(member, float(score)) for member, score in zip(it, it, strict=True)]


def _records(boot_ids: Sequence[str], twins: list[Any]) -> list[dict[str, str] | None]:
    """The boot records of `boot_ids` from their JSON twins, None for each that is missing or not the record
    of its boot (it names another, or is not one JSON object: a twin edited by hand). The twins are parsed
    as one JSON array, which shares the parser's memo of the records' keys (a thousand parsed one by one
    take twice as long); each record must then name its own boot, so a twin edited to hold two records or
    half of one cannot shift another boot's. Otherwise each is parsed alone."""
    present = [t for t in twins if isinstance(t, str)]
    joined = _parsed("[" + ",".join(present) + "]")
    if isinstance(joined, list) and len(joined) == len(present):
        records = _own(boot_ids, twins, joined)
        if sum(r is not None for r in records) == len(present):  # every twin read is its boot's record
            return records
    return _own(boot_ids, twins, [_parsed(t) for t in present])


def _own(boot_ids: Sequence[str], twins: list[Any], parsed: list[Any]) -> list[dict[str, str] | None]:
    """Each boot's record among `parsed` (the present twins' values, in order), None where its twin is
    missing or its value is not a JSON object naming that boot."""
    values = iter(parsed)
    records: list[dict[str, str] | None] = []
    for boot_id, twin in zip(boot_ids, twins, strict=True):
        record = next(values) if isinstance(twin, str) else None
        # Popped: a record is the hash's fields alone (a value parsed here is never read elsewhere).
        ok = isinstance(record, dict) and record.pop(TWIN_ID, None) == boot_id
        records.append(record if ok else None)
    return records


def _parsed(text: str) -> Any:
    """`text` as JSON; None when it is not (nested past the parser's depth, too)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


class StatusReads:
    """The status report's reads of one pool (a part of `store.calls.Store`)."""

    client: redis.Redis
    keys: PoolKeys

    def status_head(self, most_boots: int) -> tuple[int, Any, list[Any], list[str], list[tuple[str, float]],
                                                    Any, bool]:
        """In one round trip: the server's time (ms); the last-sweep record (or the error its read met: it
        alone may be unreadable); the newest `most_boots` boots with their last heartbeats; the head of the
        queue; the waiting job due soonest with when (ms; +inf while only jobs it waits for hold it); the
        reply to CONFIG GET of the eviction policy (or its error); and whether the scripts place every running
        job (`placed_kept`: scripts/_lib.lua `place_running`), so that where they are is read from that."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.get(k.last_sweep)
        # By hand: redis-py's own parse of the scores costs more than the read (1.5 of 2 ms at 1,000 boots).
        pipe.execute_command("ZREVRANGE", k.boots, 0, most_boots - 1, "WITHSCORES")
        pipe.zrange(k.queued, 0, 0)
        pipe.zrange(k.waiting, 0, 0, withscores=True)
        pipe.hget(k.config, "placed_kept")
        pipe.config_get(SETTING)
        replies = call_redis(pipe.execute, raise_on_error=False, what=_WHAT)
        for i, reply in enumerate(replies[:-1]):
            if isinstance(reply, Exception) and i != 1:
                raise wrap_redis_error(reply, _WHAT)  # type: ignore[arg-type]
        (secs, usecs), raw_sweep, boots, head, due, placed, config = replies
        return (int(secs) * 1000 + int(usecs) // 1000, raw_sweep, _pairs(boots), head, due, config,
                placed is not None)

    def inventories(self) -> dict[str, tuple[Any, Any, Any]]:
        """Each daemon of the `inventories` index with its inventory's `at` and `strays` (None where they
        cannot be read) and its last publication in the index, in two round trips."""
        index = call_redis(self.client.execute_command, "ZRANGE", self.keys.inventories, 0, -1, "WITHSCORES",
                           what=_WHAT)
        published = _pairs(index)
        if not published:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for daemon, _ in published:
            pipe.hmget(self.keys.inventory(daemon), "at", "strays")
        replies = call_redis(pipe.execute, raise_on_error=False, what=_WHAT)
        return {daemon: (*(reply if isinstance(reply, list) else (None, None)), last)
                for (daemon, last), reply in zip(published, replies, strict=True)}

    def declared_daemons(self, returned_since_ms: int) -> tuple[Any, Any]:
        """In one round trip: the daemons declared gone; the records of declarations lifted since
        `returned_since_ms`."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hkeys(self.keys.gone_daemons)
        pipe.zrangebyscore(self.keys.returned_daemons, returned_since_ms, "+inf")
        gone, returned = _or_none(call_redis(pipe.execute, raise_on_error=False, what=_WHAT))
        return gone, returned

    def placement(self, boot_ids: Sequence[str]) -> tuple[list[str | None], dict[str, str]]:
        """Where the running jobs are, as the scripts place them (scripts/_lib.lua `place_running`), in one
        round trip of two commands: the ids each of `boot_ids` owns (space-separated; None for none), and each
        daemon's count of the running rows placed under it. Costs what the boots and daemons are."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.keys.running_by, [f"b:{b}" for b in boot_ids]) if boot_ids else pipe.echo("")
        pipe.hgetall(self.keys.running_daemons)
        owned, counts = _or_none(call_redis(pipe.execute, raise_on_error=False, what=_WHAT))
        return (list(owned) if boot_ids and isinstance(owned, list) else [None] * len(boot_ids),
                counts if isinstance(counts, dict) else {})

    def placed_on(self, daemons: Sequence[str]) -> list[list[str]]:
        """The ids of the running rows placed under each of `daemons` (one range of `running_on` each)."""
        if not daemons:
            return []
        pipe = self.client.pipeline(transaction=False)
        for daemon in daemons:
            pipe.zrangebylex(self.keys.running_on, f"[{daemon} ", f"({daemon}!")
        replies = _or_none(call_redis(pipe.execute, raise_on_error=False, what=_WHAT))
        return [[m.rpartition(" ")[2] for m in r] if isinstance(r, list) else [] for r in replies]

    def running_rows(self, job_ids: Sequence[str]) -> list[tuple[Any, Any]]:
        """In one round trip: each row's state, daemon_id, owner_boot, heartbeat_at, affinity and promoted_at
        (None when unreadable), with whether its lease exists."""
        if not job_ids:
            return []
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(k.job(job_id), "state", "daemon_id", "owner_boot", "heartbeat_at", "affinity",
                       "promoted_at")
            pipe.exists(k.lease(job_id))
        replies = _or_none(call_redis(pipe.execute, raise_on_error=False, what=_WHAT))
        return [(replies[2 * i], replies[2 * i + 1]) for i in range(len(job_ids))]

    def running_ids(self) -> list[str]:
        """Every running id: for a pool whose running jobs are not all placed yet (`status_head`)."""
        return list(call_redis(self.client.zrange, self.keys.running, 0, -1, what=_WHAT))

    def inventory_ats(self, daemons: Sequence[str]) -> list[tuple[Any, Any]]:
        """Each daemon's inventory `at` and its last publication in the `inventories` index."""
        if not daemons:
            return []
        pipe = self.client.pipeline(transaction=False)
        for daemon in daemons:
            pipe.hget(self.keys.inventory(daemon), "at")
            pipe.zscore(self.keys.inventories, daemon)
        inv = _or_none(call_redis(pipe.execute, raise_on_error=False, what=_WHAT))
        return [(inv[2 * i], inv[2 * i + 1]) for i in range(len(daemons))]

    def status_rows(self, boot_ids: Sequence[str], head: Sequence[str]) -> tuple[list[dict[str, str]], Any]:
        """The boot records ({} for none), and the `created_at` of the head of the queue (None when there is
        none). One round trip: the records' JSON twins in one MGET (store/workerio.py, `beat_boot`); a second
        only for the boots with no readable twin, read from their hashes (an expired boot, a worker of an
        earlier release)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.mget([self.keys.boot_json(b) for b in boot_ids]) if boot_ids else pipe.echo("")
        for job_id in head:
            pipe.hget(self.keys.job(job_id), "created_at")
        replies = _or_none(call_redis(pipe.execute, raise_on_error=False, what=_WHAT))
        twins = replies[0] if boot_ids and isinstance(replies[0], list) else [None] * len(boot_ids)
        records = _records(boot_ids, twins)
        unread = [i for i, r in enumerate(records) if r is None]
        if unread:
            pipe = self.client.pipeline(transaction=False)
            for i in unread:
                pipe.hgetall(self.keys.boot(boot_ids[i]))
            for i, r in zip(unread, _or_none(call_redis(pipe.execute, raise_on_error=False, what=_WHAT)),
                            strict=True):
                records[i] = r if isinstance(r, dict) else {}
        return cast("list[dict[str, str]]", records), replies[-1] if head else None

    def job_states(self, job_ids: Sequence[str]) -> list[str | None]:
        """Each job's `state` in one round trip, None for a job whose row is gone (or unreadable)."""
        if not job_ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(self.keys.job(job_id), "state")
        return [r if isinstance(r, str) else None
                for r in call_redis(pipe.execute, raise_on_error=False, what="job states")]
