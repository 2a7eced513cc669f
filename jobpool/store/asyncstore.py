"""`AsyncStore`: one pool's Redis on redis.asyncio, for the asyncio API (jobpool/aio.py).

The same scripts with the same KEYS, ARGV and settings (their builders and reply readers are those of
store/calls.py, store/scriptcalls.py and runner.py), the same error mapping, and the same rules for sending
again: a script refused whole (a server that lost its scripts, NOSCRIPT; a demoted primary, READONLY) is sent
again, anything else is the caller's, because a lost reply may have been applied. The pool's layout version is
checked before the first script and again once `schema.RECHECK_SECS` have passed (store/schema.py), as
`Scripts` does.

Only what the asyncio API offers is here: submitting, the changes a user makes to a job, and the reads.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio

from .. import errors
from ..config import Settings
from ..models import Job
from . import schema
from .calls import (
    EnqueueCall,
    cancel_call,
    cancelled,
    enqueue_call,
    enqueued,
    pause_job_call,
    queue_resumed,
    released,
    resume_job_call,
)
from .keys import PoolKeys
from .luatext import script_text, shape
from .replies import Cancelled, Enqueued, Moved, QueueResumed, Release
from .runner import (
    FAILOVER_RETRY_SECS,
    SCRIPT_NAMES,
    decode_reply,
    demoted,
    raise_for_code,
    script_settings,
    wrap_redis_error,
)
from .scriptcalls import CANDIDATES_ON_PROMOTE, CANDIDATES_ON_RELEASE, PROMOTE_ROUNDS, candidate_keys, moved

#: The client type `AsyncStore` takes (redisurl.connect_async makes one).
AsyncRedis = redis.asyncio.Redis

log = logging.getLogger("jobpool")


class AsyncStore:
    """One pool's keys and scripts on one redis.asyncio client (replies decoded: redisurl.connect_async)."""

    def __init__(self, client: redis.asyncio.Redis, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self.keys = PoolKeys(settings.pool)
        self._texts = {name: script_text(name) for name in SCRIPT_NAMES}
        self._shas = {name: hashlib.sha1(text.encode()).hexdigest() for name, text in self._texts.items()}
        self._settings = script_settings(settings.max_concurrent_jobs, settings.events_maxlen,
                                         settings.reserve_after_secs, settings.retry_delay_max_secs)
        self._pool_keys = {name: self.keys.named(shape(name).pool_keys) for name in SCRIPT_NAMES}
        self._wait_ms = max(1, round(settings.redis_wait_timeout_secs * 1000))
        self._schema_read_at = -math.inf

    async def close(self) -> None:
        await self.client.aclose()

    async def call(self, fn: Any, *args: Any, what: str = "a read", **kwargs: Any) -> Any:
        """An awaited redis-py call, its errors mapped as `runner.call_redis` maps them."""
        try:
            return await fn(*args, **kwargs)
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, what) from None

    # ---- scripts -------------------------------------------------------------------------------------

    async def check_schema(self) -> None:
        """`PoolTooNew` when the pool's layout is newer than this release knows; read at most once per
        `schema.RECHECK_SECS`."""
        if time.monotonic() - self._schema_read_at < schema.RECHECK_SECS:
            return
        raw = await self.call(self.client.hget, self.keys.config, schema.FIELD,
                              what="reading the pool's layout version")
        schema.refuse_newer(self.keys.pool, raw)
        self._schema_read_at = time.monotonic()

    async def run(self, op: str, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
        """Script `op` with its own `keys` then its pool keys (`Store.run`)."""
        return await self.run_full(op, [*keys, *self._pool_keys[op]], args)

    async def run_full(self, op: str, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
        """Script `op` with all its `keys`, its settings after `args`; its reply decoded, or the mapped
        exception (runner.Scripts.run: the same rules)."""
        await self.check_schema()
        full_keys = list(keys)
        full_args = [*args, *self._settings[op]]
        deadline, delay = time.monotonic() + FAILOVER_RETRY_SECS, 0.05
        while True:
            try:
                reply = await self._call(op, full_keys, full_args)
                break
            except redis.RedisError as exc:
                if not demoted(exc) or time.monotonic() + delay > deadline:
                    raise wrap_redis_error(exc, op) from None
                log.info("%s: the primary was demoted (%s); sending it again", op, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        decoded: list[Any] = decode_reply(reply)
        raise_for_code(op, decoded)
        return decoded

    async def _call(self, op: str, keys: list[str], args: list[Any]) -> Any:
        """One EVALSHA (and WAIT, when replicas are asked for, down the same connection); on NOSCRIPT the
        script is loaded and run again."""
        try:
            return await self._send(op, keys, args)
        except redis.exceptions.NoScriptError:
            await self.client.script_load(self._texts[op])
            return await self._send(op, keys, args)

    async def _send(self, op: str, keys: list[str], args: list[Any]) -> Any:
        if not self.settings.redis_wait_replicas:
            return await self.client.execute_command("EVALSHA", self._shas[op], len(keys), *keys, *args)
        return await self._call_and_wait(op, keys, args)

    async def _call_and_wait(self, op: str, keys: list[str], args: list[Any]) -> Any:
        pipe = self.client.pipeline(transaction=False)
        pipe.execute_command("EVALSHA", self._shas[op], len(keys), *keys, *args)
        pipe.wait(self.settings.redis_wait_replicas, self._wait_ms)
        reply, acked = await pipe.execute()
        if int(acked) < self.settings.redis_wait_replicas:
            raise errors.NotReplicated(
                f"{op}: applied on the primary but acknowledged by {acked} of "
                f"{self.settings.redis_wait_replicas} replicas within {self._wait_ms} ms, so a failover now "
                "could lose it")
        return reply

    # ---- the queue and a user's changes of a job --------------------------------------------------------

    async def candidates(self, n: int) -> list[str]:
        """`Store.candidates`: the keys of the first `n` jobs of `ready`, for a script that may promote."""
        ids = await self.call(self.client.zrange, self.keys.ready, 0, n - 1, what="candidates")
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(self.keys.job(job_id), "affinity_queue")
        routes = await self.call(pipe.execute, raise_on_error=False, what="candidates")
        return candidate_keys(self.keys, ids, routes)

    async def promote(self, actor: str) -> Release:
        return released(await self.run("promote", await self.candidates(CANDIDATES_ON_PROMOTE), [actor]))

    async def promote_all(self, actor: str) -> int:
        total = 0
        for _ in range(PROMOTE_ROUNDS):
            done = await self.promote(actor)
            total += done.promoted
            if not done.promote_again:
                break
        return total

    async def finish_promotion(self, release: Release, actor: str) -> None:
        if release.promote_again:
            await self.promote_all(actor)

    def enqueue_call(self, actor: str,
                     jobs: Sequence[tuple[str, str, str, str, str, str]]) -> EnqueueCall:
        return enqueue_call(self.keys, self._pool_keys["enqueue"], actor, jobs)

    async def enqueue(self, call: EnqueueCall) -> Enqueued:
        # The call's keys end with the script's pool keys already (`enqueue_call`).
        return enqueued(await self.run_full("enqueue", call.keys, call.args))

    async def cancel(self, job_id: str, reason: str, actor: str) -> Cancelled:
        cands = await self.candidates(CANDIDATES_ON_RELEASE)
        return cancelled(await self.run("cancel", *cancel_call(self.keys, job_id, reason, actor, cands)))

    async def pause_job(self, job_id: str, reason: str, actor: str) -> Moved:
        cands = await self.candidates(CANDIDATES_ON_RELEASE)
        return moved(await self.run("pause_job", *pause_job_call(self.keys, job_id, reason, actor, cands)))

    async def resume_job(self, job_id: str, actor: str, anywhere: bool) -> Moved:
        cands = await self.candidates(CANDIDATES_ON_RELEASE)
        call = resume_job_call(self.keys, job_id, actor, anywhere, cands)
        return moved(await self.run("resume_job", *call))

    async def pause_queue(self, actor: str, reason: str) -> bool:
        return bool(int((await self.run("pause_queue", [], [actor, reason]))[1]))

    async def resume_queue(self, actor: str) -> QueueResumed:
        return queue_resumed(await self.run("resume_queue", await self.candidates(CANDIDATES_ON_PROMOTE),
                                            [actor]))

    # ---- reads ---------------------------------------------------------------------------------------

    async def job(self, job_id: str, coalesced: bool = False) -> Job:
        """`Reads.job`: a job's row as a `Job`; `NotFound` for none, `CorruptRow` for one unreadable."""
        try:
            row = await self.call(self.client.hgetall, self.keys.job(job_id), what="hgetall")
        except errors.CorruptRow as exc:
            raise errors.CorruptRow(f"job {job_id}: its row is not a hash ({exc})", job_id) from None
        if not row:
            raise errors.NotFound(errors.no_job(job_id))
        return Job.from_row(dict(row), coalesced=coalesced, job_id=job_id)

    async def rows(self, ids: Sequence[str]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.keys.job(job_id))
        return list(await self.call(pipe.execute, raise_on_error=False, what="rows"))

    async def rows_found(self, job_ids: Sequence[str], what: str) -> int:
        return int(await self.call(self.client.exists, *[self.keys.job(j) for j in job_ids], what=what))

    async def state_ids(self, state: str, limit: int, newest_first: bool) -> list[str]:
        key = self.keys.state_index(state)
        read = self.client.zrevrange if newest_first else self.client.zrange
        return list(await self.call(read, key, 0, limit - 1, what="state ids"))

    async def log_tail(self, job_id: str) -> str | None:
        tail: str | None = await self.call(self.client.hget, self.keys.job(job_id), "log_tail", what="logs")
        return tail

    async def log_tail_and_attempt(self, job_id: str) -> tuple[str | None, str]:
        """`LogReads.log_tail_and_attempt`."""
        tail, attempt = await self.call(self.client.hmget, self.keys.job(job_id), ["log_tail", "attempt"],
                                        what="live log")
        return tail, attempt or ""

    async def watch_log(self, job_id: str, secs: float) -> None:
        """`LogReads.watch_log`: the job's live log is being read (refused: left at its slower rate)."""
        try:
            await self.client.set(self.keys.log_watch(job_id), "1", px=int(secs * 1000))
        except redis.ResponseError:
            return
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, "live log") from None

    async def log_end(self, job_id: str) -> tuple[str | None, list[Any]]:
        """`LogReads.log_end`: the job's state and its live log's newest entry, at one time."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hget(self.keys.job(job_id), "state")
        pipe.xrevrange(self.keys.job_log(job_id), "+", "-", 1)
        state, newest = await self.call(pipe.execute, raise_on_error=False, what="live log")
        for reply in (state, newest):
            if isinstance(reply, redis.RedisError) and not isinstance(reply, redis.ResponseError):
                raise wrap_redis_error(reply, "live log")
        return (state if isinstance(state, str) else None,
                list(newest) if isinstance(newest, list) else [])

    async def log_following(self, job_id: str, offset: int, count: int, block_ms: int) -> list[Any]:
        """`LogReads.log_following`: entries past byte `offset`, waiting at most `block_ms` for the first."""
        reply = await self.call(self.client.xread, {self.keys.job_log(job_id): f"{offset}-0"}, count=count,
                                block=block_ms, what="live log")
        return list(reply[0][1]) if reply else []

    async def log_after(self, job_id: str, offset: int, count: int) -> list[Any]:
        """`LogReads.log_after`: entries of the job's live log that end past byte `offset`."""
        after = f"({offset}-0" if offset else "-"
        return list(await self.call(self.client.xrange, self.keys.job_log(job_id), after, "+", count,
                                    what="live log"))

    async def history_and_newest(self, job_id: str) -> tuple[str | None, list[Any]]:
        """`EventReads.history_and_newest`, in one transaction."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hget(self.keys.job(job_id), "history")
        pipe.xrevrange(self.keys.events, "+", "-", 1)
        found, newest = await self.call(pipe.execute, raise_on_error=False, what="history")
        if isinstance(newest, redis.RedisError):
            raise wrap_redis_error(newest, "history")
        if isinstance(found, redis.ResponseError):
            found = None
        return found, list(newest)

    async def events_after(self, after: str, count: int) -> list[Any]:
        return list(await self.call(self.client.xrange, self.keys.events, after, "+", count, what="events"))

    async def newest_event_id(self) -> str:
        """The newest entry's id in the event stream ('0-0' when it is empty)."""
        newest = await self.call(self.client.xrevrange, self.keys.events, "+", "-", 1, what="events")
        return str(newest[0][0]) if newest else "0-0"

    async def events_following(self, after: str, count: int, block_ms: int) -> Any:
        """Entries after stream id `after`, waiting at most `block_ms` for the first (XREAD's reply)."""
        return await self.call(self.client.xread, {self.keys.events: after}, count=count, block=block_ms,
                               what="following events")
