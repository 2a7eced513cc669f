"""`SweepIO`: what a supervisor's sweep reads of Redis for its evidence (jobpool/supervisor/evidence.py
judges it): the running rows and their leases, whole rows, owners' boot records, what RQ holds of the
unclaimed jobs, daemons' inventories; the sweep's record of itself (`record_sweep`), and the pointer to a
job's latest adoption request (`repoint_adoption`). Every change a sweep makes to a job is a script
(store/sweepcalls.py).

An error reply of one command (a key of the wrong type) is left in that command's place, for the judge to
call that row's problem and not the sweep's, except where said.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import redis

from ..errors import Conflict
from .keys import PoolKeys
from .runner import call_redis, wrap_redis_error

#: Keys read per pipeline when whole rows are read.
READ_CHUNK = 1000
#: Running rows read per command by `running_brief` (about 5 ms of Redis's time), and how many rows each
#: slice reads again of the one before.
BRIEF_SLICE = 1000
BRIEF_OVERLAP = 50


def run_pipeline(pipe: Any, raise_on_error: bool = True, what: str = "sweep read") -> list[Any]:
    """Run a pipeline of sweep reads; with `raise_on_error` False, an error reply of one command is left in
    its place."""
    try:
        return list(pipe.execute(raise_on_error=raise_on_error))
    except redis.RedisError as exc:
        raise wrap_redis_error(exc, what) from None


class SweepIO:
    """A sweep's reads and record of one pool (a part of `store.calls.Store`). Keeps what it learnt of the
    server: whether it has SORT_RO."""

    client: redis.Redis
    keys: PoolKeys
    #: Until the server says it has no SORT_RO (Redis < 7).
    _sort_ro: bool = True

    def running_brief(self, fields: Sequence[str], all_rows: bool) -> tuple[int, list[tuple[Any, ...]]]:
        """The server's time (ms) and, with `all_rows`, every running row as (id, its `fields`, its lease).

        SORT_RO ... BY nosort GET reads each member's hash fields and lease in the `running` index's order
        (the patterns carry the pool's hash tag, so they stay in the key's cluster slot), `BRIEF_SLICE` rows a
        command: one command for every row held Redis for a third of a second at 100,000 rows, every other
        client waiting behind it. Consecutive slices overlap by `BRIEF_OVERLAP` rows, so a row is missed only
        if that many rows before it leave the index between two slices (a few ms); one read again (the
        overlap, rows entering before it, a row promoted again meanwhile) is kept once. A row missed is judged
        at the next sweep, as one that started after the read. SORT_RO, not SORT: SORT counts as a write (it
        can STORE), so a replica or a server at its memory limit refuses it, and the sweep must read there
        too. Redis 6.2 has no SORT_RO; there plain SORT is used."""
        k = self.keys
        get = ["#", *(f"{k.job('*')}->{f}" for f in fields), k.lease("*")]
        gets = [a for g in get for a in ("GET", g)]

        def sort(offset: int) -> list[Any]:
            # By hand: redis-py's `sort_ro()` (8.1) sends a plain SORT.
            return ["SORT_RO" if self._sort_ro else "SORT", k.running, "BY", "nosort", "LIMIT", offset,
                    BRIEF_SLICE, *gets]

        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        if all_rows:
            pipe.execute_command(*sort(0))
        replies = self._brief_replies(pipe.execute)
        if replies is None:
            return self.running_brief(fields, all_rows)
        secs, micros = replies[0]
        now_ms = int(secs) * 1000 + int(micros) // 1000
        if not all_rows:
            return now_ms, []
        found = list(zip(*[iter(replies[1])] * len(get), strict=True))  # consecutive groups of len(get)
        rows, offset = found, 0
        seen = {row[0] for row in found}
        while len(found) == BRIEF_SLICE:
            offset += BRIEF_SLICE - BRIEF_OVERLAP
            reply = self._brief_replies(functools.partial(self.client.execute_command, *sort(offset)))
            if reply is None:
                return self.running_brief(fields, all_rows)
            found = list(zip(*[iter(reply)] * len(get), strict=True))
            # Read before: the overlap, rows after rows that entered, a row promoted again meanwhile (moved
            # to the end of the index): each is kept once, as first read.
            fresh = [row for row in found if row[0] not in seen]
            seen.update(row[0] for row in fresh)
            rows.extend(fresh)
        return now_ms, rows

    def _brief_replies(self, read: Any) -> Any:
        """What `read()` returns; None when the server turned out to have no SORT_RO (then SORT is used)."""
        try:
            return read()
        except redis.ResponseError as exc:
            if self._sort_ro and "unknown command" in str(exc).lower():
                self._sort_ro = False
                return None
            raise wrap_redis_error(exc, "sweep read") from None
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, "sweep read") from None

    def brief_of(self, ids: Sequence[str], fields: Sequence[str]) -> list[tuple[Any, ...]]:
        """`running_brief`'s rows for given ids (an operator's one-job call); a row that cannot be read has
        None for each field."""
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(self.keys.job(job_id), fields)
        pipe.mget([self.keys.lease(job_id) for job_id in ids])
        *rows, leases = run_pipeline(pipe, raise_on_error=False)
        if isinstance(leases, Exception):
            leases = [None] * len(ids)
        return [(job_id, *(row if isinstance(row, list) else [None] * len(fields)), lease)
                for job_id, row, lease in zip(ids, rows, leases, strict=True)]

    def row_fields(self, ids: Sequence[str], fields: Sequence[str]) -> Iterator[tuple[str, Any]]:
        """Each id with its row's `fields` (a list, None where missing) or the error its read met, read
        `READ_CHUNK` rows per round trip."""
        for start in range(0, len(ids), READ_CHUNK):
            chunk = ids[start:start + READ_CHUNK]
            pipe = self.client.pipeline(transaction=False)
            for job_id in chunk:
                pipe.hmget(self.keys.job(job_id), fields)
            yield from zip(chunk, run_pipeline(pipe, raise_on_error=False), strict=True)

    def live_leases(self, ids: Sequence[str]) -> dict[str, bool]:
        """Whether each id's lease key still has a TTL (any value)."""
        if not ids:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.pttl(self.keys.lease(job_id))
        replies = run_pipeline(pipe, raise_on_error=False)
        return {job_id: isinstance(ttl, int) and ttl > 0 for job_id, ttl in zip(ids, replies, strict=True)}

    def boot_fields(self, boots: Sequence[str], fields: Sequence[str]) -> dict[str, list[Any]]:
        """Each boot record's `fields`, for the boots whose record could be read."""
        if not boots:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for boot in boots:
            pipe.hmget(self.keys.boot(boot), fields)
        replies = run_pipeline(pipe, raise_on_error=False)
        return {boot: v for boot, v in zip(boots, replies, strict=True) if isinstance(v, list)}

    def rq_holds(self, queue_of: Mapping[str, str], started_keys: Sequence[str],
                 ) -> tuple[dict[str, tuple[bool, bool]], list[list[tuple[str, float]]]]:
        """For each id, whether RQ's list `queue_of[id]` holds it and whether that list's intermediate list
        does; and the entries (member, expiry) of each of RQ's started registries `started_keys`. Any error
        fails the read."""
        pipe = self.client.pipeline(transaction=False)
        for job_id, q in queue_of.items():
            pipe.lpos(q, job_id)
            pipe.lpos(q + ":intermediate", job_id)
        for key in started_keys:
            pipe.zrange(key, 0, -1, withscores=True)
        replies = run_pipeline(pipe)
        positions, registries = replies[:2 * len(queue_of)], replies[2 * len(queue_of):]
        held = {job_id: (positions[2 * i] is not None, positions[2 * i + 1] is not None)
                for i, job_id in enumerate(queue_of)}
        return held, registries

    def record_sweep(self, last_sweep: str, increments: Mapping[str, int], sum_ms: float) -> None:
        """The sweep's last-sweep record and its counters (jobpool/metrics.py), in one MULTI, so a sweep is
        counted exactly when it is recorded."""
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self.keys.last_sweep, last_sweep)
        for name, n in increments.items():
            pipe.hincrby(self.keys.metrics, name, n)
        pipe.hincrbyfloat(self.keys.metrics, "sweep_duration:sum_ms", round(sum_ms, 3))
        call_redis(pipe.execute, what="recording the sweep")

    # ---- the fleet's workers (jobpool/supervisor/adoption.py) ------------------------------------------

    def fleet_boots(self) -> list[str]:
        """Every worker boot in the `boots` index (the fleet's, records expired lately included)."""
        return [str(b) for b in call_redis(self.client.zrange, self.keys.boots, 0, -1,
                                           what="reading the fleet's boots")]

    def boots_alive(self, boot_ids: Sequence[str]) -> list[bool]:
        """Whether each boot's record is still there (its process heartbeats it; a crash lets it expire)."""
        pipe = self.client.pipeline(transaction=False)
        for boot in boot_ids:
            pipe.exists(self.keys.boot(boot))
        return [bool(alive) for alive in run_pipeline(pipe)]

    # ---- adoption requests (jobpool/supervisor/adoption.py) ---------------------------------------------

    def rq_job_status(self, rq_ids: Sequence[str]) -> list[tuple[str, str]]:
        """RQ's status of each RQ job and the worker it names ('' where its hash or the field is missing), in
        one round trip; any error fails the read."""
        pipe = self.client.pipeline(transaction=False)
        for rq_id in rq_ids:
            pipe.hmget(self.keys.rq_job(rq_id), ["status", "worker_name"])
        return [(status or "", worker or "") for status, worker in run_pipeline(pipe)]

    def repoint_adoption(self, job_id: str, rq_id: str, ttl_secs: int) -> None:
        """Point a job's adoption pointer at the new request `rq_id` (kept `ttl_secs`), unless another writer
        changed it meanwhile (WATCH: `Conflict`, nothing written: two supervisors asking at once make one
        request); then delete the RQ hash of the request it named before, so that one (ended, or its worker
        died) cannot be run late."""
        pointer = self.keys.adoption(job_id)
        try:
            with self.client.pipeline() as pipe:
                pipe.watch(pointer)
                before = pipe.get(pointer)
                pipe.multi()
                pipe.set(pointer, rq_id, ex=ttl_secs)
                pipe.execute()
            if before is not None and before != rq_id:
                self.client.delete(self.keys.rq_job(str(before)))
        except redis.WatchError:
            raise Conflict(f"the adoption request of job {job_id} changed meanwhile") from None
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, "adoption request") from None

    # ---- daemons' inventories (jobpool/supervisor/remote.py) ---------------------------------------------

    def inventory_index(self) -> tuple[dict[str, int], dict[str, str]]:
        """When each daemon last published (ms), and the daemons declared gone for good (identity -> JSON);
        either empty when it cannot be read."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(self.keys.inventories, 0, -1, withscores=True)
        pipe.hgetall(self.keys.gone_daemons)
        index, gone = run_pipeline(pipe, raise_on_error=False, what=_INVENTORIES)
        return ({str(d): int(s) for d, s in index} if isinstance(index, list) else {},
                {str(d): str(v) for d, v in gone.items()} if isinstance(gone, dict) else {})

    def inventory_fields(self, daemons: Sequence[str], fields: Sequence[str]) -> dict[str, list[Any]]:
        """Each daemon's inventory `fields`, for those whose inventory could be read."""
        pipe = self.client.pipeline(transaction=False)
        for name in daemons:
            pipe.hmget(self.keys.inventory(name), fields)
        replies = run_pipeline(pipe, raise_on_error=False, what=_INVENTORIES)
        return {name: v for name, v in zip(daemons, replies, strict=True) if isinstance(v, list)}

    # ---- leftovers of ended attempts (jobpool/supervisor/volumes.py) -------------------------------------

    def states_and_attempts(self, ids: Sequence[str]) -> list[list[Any]]:
        """Each row's state and attempt (None for a missing row); any error fails the read."""
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(self.keys.job(job_id), "state", "attempt")
        return list(call_redis(pipe.execute, what="reading the rows of ended containers"))

    def states(self, ids: Sequence[str]) -> list[str | None]:
        """Each row's state (None for a missing row); any error fails the read."""
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(self.keys.job(job_id), "state")
        return list(call_redis(pipe.execute, what="reading the states of checkpointed jobs"))


_INVENTORIES = "sweep read of inventories"
