"""`FleetReads`: the reads of what the fleet's processes record about their Docker daemons outside the
scripts: the daemon marks and the collisions they found (jobpool/fleet/markrecords.py), and which running
jobs a daemon holds and which daemons were declared gone (jobpool/fleet/gone.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from .keys import PoolKeys
from .runner import call_redis

_MARKS = "reading daemon marks"
_SHARED = "reading shared daemons"


class FleetReads:
    """The fleet's records of one pool (a part of `store.calls.Store`)."""

    client: redis.Redis
    keys: PoolKeys

    def daemon_mark_ids(self) -> list[str]:
        """Every process in the `daemon_marks` index."""
        return [str(i) for i in call_redis(self.client.zrange, self.keys.daemon_marks, 0, -1, what=_MARKS)]

    def daemon_mark_ids_of(self, daemon_id: str) -> list[str]:
        """The processes in `daemon_id`'s index (scripts/daemon_mark.lua): those of that identity."""
        return [str(i) for i in call_redis(self.client.zrange, self.keys.daemon_marks_of(daemon_id), 0, -1,
                                           what=_MARKS)]

    def daemon_mark_unindexed(self, process_ids: Sequence[str]) -> list[tuple[str, str]]:
        """(process id, daemon identity) of each record among `process_ids` that lacks `indexed` (written by
        an earlier release), in one round trip of one HMGET each."""
        pipe = self.client.pipeline(transaction=False)
        for process_id in process_ids:
            pipe.hmget(self.keys.daemon_mark(process_id), "indexed", "daemon_id")
        out = []
        for process_id, reply in zip(process_ids, call_redis(pipe.execute, raise_on_error=False, what=_MARKS),
                                     strict=True):
            if isinstance(reply, list) and reply[0] is None and reply[1]:
                out.append((process_id, str(reply[1])))
        return out

    def daemon_mark_records(self, process_ids: Sequence[str]) -> list[Any]:
        """Each process's mark record ({} for none), or the error its read met, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for process_id in process_ids:
            pipe.hgetall(self.keys.daemon_mark(process_id))
        return list(call_redis(pipe.execute, raise_on_error=False, what=_MARKS))

    def daemon_mark_exists(self, process_id: str) -> bool:
        return bool(call_redis(self.client.exists, self.keys.daemon_mark(process_id), what="a gone mark"))

    def standing_collision(self, identity: str) -> str | None:
        """The standing report of a collision on `identity` as stored (JSON), None for none."""
        text = call_redis(self.client.hget, self.keys.shared_daemons, identity, what=_SHARED)
        return None if text is None else str(text)

    def standing_collisions(self) -> dict[str, str]:
        """Every standing report of a collision, identity -> JSON."""
        raw = call_redis(self.client.hgetall, self.keys.shared_daemons, what=_SHARED)
        return {str(i): str(t) for i, t in raw.items()}

    def running_ids(self) -> list[str]:
        """Every id in `running` (at most the slot limit)."""
        return list(call_redis(self.client.zrange, self.keys.running, 0, -1, what="reading the running jobs"))

    def daemons_of(self, job_ids: Sequence[str]) -> list[Any]:
        """Each row's `daemon_id` and `affinity` (a list), or the error its read met, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(self.keys.job(job_id), "daemon_id", "affinity")
        return list(call_redis(pipe.execute, raise_on_error=False, what="reading the running jobs' daemons"))

    def gone_daemon_records(self) -> dict[str, str]:
        """The declarations that daemons are gone for good, identity -> JSON {at, actor, note}."""
        raw = call_redis(lambda: self.client.hgetall(self.keys.gone_daemons), what="reading the gone daemons")
        return {str(d): str(t) for d, t in raw.items()}
