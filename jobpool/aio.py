"""`AsyncPool`: the pool's API for asyncio programs (FastAPI, aiohttp), on redis-py's asyncio client.

The same scripts, inputs and errors as `Pool` (jobpool/api.py): its validation, the spec's checks
(jobpool/submit.py `prepare`), the scripts' KEYS and ARGV and the reading of their replies
(jobpool/store/calls.py) are shared, so a job enqueued here is the job `Pool.enqueue` makes, and a refusal is
the same typed exception. Only the round trips differ (jobpool/store/asyncstore.py).

`wait` does not poll: it wakes on the job's own transition, read from the pool's event stream (every
transition is written there by the script that makes it: scripts/_lib.lua `event`) by one XREAD BLOCK per
`AsyncPool` shared by all its waiters, and reads the job again only then. A poll every `fallback_secs` is the
safety net for what the stream cannot say (Redis restarted or rolled back past the id read from, a stream
trimmed faster than it is read).
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import datetime
import logging
import time
from collections.abc import AsyncIterator, Generator, Iterable, Mapping, Sequence
from typing import Any

from . import apichecks, errors, livelogs, logtail, submit
from . import events as event_stream
from .apichecks import MAX_LIST
from .config import Settings
from .contract import LIVE_LOG_POLL_SECS, LIVE_LOG_WATCH_SECS
from .models import TERMINAL, Job, JobState
from .store.asyncstore import AsyncRedis, AsyncStore
from .store.redisurl import connect_async
from .submit import BATCH_SIZE, MAX_BATCH_SIZE, Prepared

log = logging.getLogger("jobpool")

#: How long one XREAD of the waiters' reader blocks on the server before it reads again.
FOLLOW_BLOCK_MS = 5000
#: Stream entries one XREAD of the waiters' reader takes at most.
FOLLOW_COUNT = 1000


class EventFollower:
    """`AsyncPool.follow_events`'s follower: an async iterator of the events after its position, which is
    fixed when it is awaited, or at the first event asked for (the stream's newest id then, unless given)."""

    def __init__(self, store: AsyncStore, job_id: str | None, after: str | None, block_ms: int) -> None:
        self._store = store
        self._job_id = job_id
        self._position = after
        self._block_ms = block_ms
        self._ready: collections.deque[dict[str, str]] = collections.deque()

    def __await__(self) -> Generator[Any, None, EventFollower]:
        return self._fixed().__await__()

    async def _fixed(self) -> EventFollower:
        await self._start()
        return self

    async def _start(self) -> str:
        if self._position is None:
            self._position = await self._store.newest_event_id()
        return self._position

    def __aiter__(self) -> EventFollower:
        return self

    async def __anext__(self) -> dict[str, str]:
        position = await self._start()
        while not self._ready:
            reply = await self._store.events_following(position, FOLLOW_COUNT, self._block_ms)
            for _stream, entries in reply or []:
                self._ready.extend(event_stream.stream_entries(entries, self._job_id))
                if entries:
                    position = self._position = entries[-1][0]  # a concrete id, never "$": no gap
        return self._ready.popleft()


class AsyncPool:
    """One pool, for asyncio: `enqueue`, `enqueue_many`, `get`, `list`, `cancel`, `pause`, `resume`,
    `events`, `follow_events`, `logs` and a `wait` that wakes on the job's transition. Close it with
    `await pool.close()` (or `async with`)."""

    def __init__(self, client: AsyncRedis, settings: Settings | None = None,
                 actor: str = "api") -> None:
        self.settings = settings or Settings()
        #: Who is recorded in events for this pool's actions, as `Pool.actor`.
        self.actor = actor
        self.store = AsyncStore(client, self.settings)
        self.keys = self.store.keys
        self._waiters = _Waiters(self.store)

    @classmethod
    def from_url(cls, url: str, name: str = "default", **settings: Any) -> AsyncPool:
        s = Settings.from_env({}, redis_url=url, pool=name, **settings)
        return cls(connect_async(s.redis_url), s)

    @classmethod
    def from_env(cls, **overrides: Any) -> AsyncPool:
        s = Settings.from_env(**overrides)
        return cls(connect_async(s.redis_url), s)

    async def close(self) -> None:
        """Stop the waiters' reader and close the Redis connections (those too when this close is itself
        cancelled while it waits for the reader)."""
        try:
            await self._waiters.close()
        finally:
            await self.store.close()

    async def __aenter__(self) -> AsyncPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- submission ---------------------------------------------------------------------------------

    async def enqueue(self, image: str, command: Sequence[str], env: dict[str, str] | None = None,
                      coalesce: bool = False, coalesce_key: str | None = None,
                      not_before: datetime.datetime | float | None = None, after: Sequence[str] | None = None,
                      **spec: Any) -> Job:
        """`Pool.enqueue`: queue a job (with `coalesce`, return the queued job it equals, if any)."""
        holds = {k: v for k, v in (("not_before", not_before), ("after", after)) if v is not None}
        job = submit.prepare({"image": image, "command": command, "env": env, **spec}, coalesce, coalesce_key,
                             self.settings.bind_roots, holds=holds)
        return (await self._send_all([job], BATCH_SIZE))[0]

    async def enqueue_many(self, specs: Iterable[Mapping[str, Any]],
                           batch_size: int = BATCH_SIZE) -> builtins.list[Job]:
        """`Pool.enqueue_many`: every item validated before anything is sent, then `batch_size` jobs per
        script call, in order; on a failure what was enqueued is a prefix, and the error says how long
        (`JobpoolError.enqueued`, `.unknown`)."""
        apichecks.check_count("batch_size", batch_size, MAX_BATCH_SIZE)
        if isinstance(specs, (str, bytes, Mapping)) or not isinstance(specs, Iterable):
            raise errors.InvalidArgument("specs must be an iterable of mappings (one per job)")
        jobs = submit.prepare_all(specs, tuple(self.settings.bind_roots))
        await self._check_dependencies_exist(jobs)
        return await self._send_all(jobs, batch_size)

    async def _send_all(self, jobs: list[Prepared], batch_size: int) -> builtins.list[Job]:
        made: list[Job] = []
        for start in range(0, len(jobs), batch_size):
            batch = jobs[start:start + batch_size]
            call = self.store.enqueue_call(self.actor, [p.script_args() for p in batch])
            try:
                reply = await self.store.enqueue(call)
            except errors.JobpoolError as exc:
                raise await self._settled(exc, batch, start, len(jobs)) from None
            try:
                await self.store.finish_promotion(reply, self.actor)  # the batch stands either way
                made.extend(await self._resolved(submit.jobs_made(batch, reply)))
            except errors.JobpoolError as exc:
                raise submit.counted(exc, start + len(batch), len(jobs)) from None
        return made

    async def _settled(self, exc: errors.JobpoolError, batch: list[Prepared], start: int,
                       total: int) -> errors.JobpoolError:
        """jobpool/submit.py `_settled`: a failure after the call was sent may have been applied, so Redis is
        asked whether any of the batch's rows exists."""
        if not submit.needs_lookup(exc, sent=True):
            return submit.counted(exc, start, total)
        try:
            found: int | errors.JobpoolError = await self.store.rows_found(
                [p.id for p in batch], what="enqueue_many's look for its last batch")
        except errors.JobpoolError as why:
            found = why
        return submit.settled_by(exc, batch, start, total, found, self.settings.redis_wait_replicas)

    async def _check_dependencies_exist(self, jobs: list[Prepared]) -> None:
        named = submit.dependencies_named(jobs)
        if not named or await self.store.rows_found(list(named), what="the jobs waited for") == len(named):
            return
        for dep, i in sorted(named.items(), key=lambda kv: kv[1]):
            if not await self.store.rows_found([dep], what="a job waited for"):
                raise errors.InvalidSpec(f"it waits for job {dep}, which does not exist", index=i)

    async def _resolved(self, made: builtins.list[Job | str]) -> builtins.list[Job]:
        twin_ids = sorted({j for j in made if isinstance(j, str)})
        if not twin_ids:
            return made  # type: ignore[return-value]  # no str left in it
        found = submit.twins_from_rows(twin_ids, await self.store.rows(twin_ids))
        return [found[j] if isinstance(j, str) else j for j in made]

    # ---- reading ------------------------------------------------------------------------------------

    async def get(self, job_id: str, coalesced: bool = False) -> Job:
        """`Pool.get`: the job's row; `NotFound`, `CorruptRow`."""
        apichecks.check_id(job_id)
        return await self.store.job(job_id, coalesced)

    async def list(self, state: str | JobState | None = None, limit: int = 100) -> builtins.list[Job]:
        """`Pool.list`: the jobs of one state in its order, or the newest `limit` of every state."""
        apichecks.check_count("limit", limit, MAX_LIST)
        if state is None:
            jobs: builtins.list[Job] = []
            for st in JobState:
                jobs += await self.list(st, limit)
            jobs.sort(key=lambda j: j.seq)
            return jobs[-limit:]
        st = apichecks.check_state(state)
        ids = await self.store.state_ids(st.value, limit, newest_first=st in TERMINAL)
        return apichecks.jobs_of(ids, await self.store.rows(ids), self.keys.pool)

    async def logs(self, job_id: str) -> str:
        """`Pool.logs`: while the job runs, what its live log holds; once it ended, the last 64 KiB of its
        output (jobpool/livelogs.py)."""
        apichecks.check_id(job_id)
        state, _ = await self.store.log_end(job_id)
        if state is None:
            raise errors.NotFound(errors.no_job(job_id))
        if not livelogs.ended(state):
            await self.store.watch_log(job_id, LIVE_LOG_WATCH_SECS)
            found: builtins.list[livelogs.Piece] = []
            while batch := livelogs.pieces(await self.store.log_after(
                    job_id, found[-1].end if found else 0, livelogs.READ_ENTRIES)):
                found += batch
            if found:
                return livelogs.text_of(found)
        return logtail.decode(await self.store.log_tail(job_id))

    def follow_logs(self, job_id: str, block_secs: float = LIVE_LOG_POLL_SECS) -> AsyncIterator[str]:
        """`Pool.logs(job_id, follow=True)`: the job's output, line by line, as it is printed, from the
        oldest its live log still holds; ends once the job has ended (a job that ended already yields its
        row's log tail). Each wait blocks on the server at most `block_secs`. An id that cannot be a job's is
        `NotFound` at once; a job that is not there, at the first line."""
        apichecks.check_id(job_id)
        return self._follow_logs(job_id, max(1, int(block_secs * 1000)))

    async def _follow_logs(self, job_id: str, block_ms: int) -> AsyncIterator[str]:
        state, _ = await self.store.log_end(job_id)
        if state is None:
            raise errors.NotFound(errors.no_job(job_id))
        lines = livelogs.Following()
        if livelogs.ended(state):
            for line in logtail.decode(await self.store.log_tail(job_id)).splitlines():
                yield line
            return
        while True:
            if lines.watch_due():
                await self.store.watch_log(job_id, LIVE_LOG_WATCH_SECS)
            batch = livelogs.pieces(
                await self.store.log_following(job_id, lines.offset, livelogs.READ_ENTRIES, block_ms))
            for line in lines.take(batch):
                yield line
            if not batch:
                now, newest = await self.store.log_end(job_id)
                if lines.idle(now, newest):
                    break
        for line in await self._rest_of_log(job_id, lines, now):
            yield line

    async def _rest_of_log(self, job_id: str, lines: livelogs.Following,
                           state: str | None) -> builtins.list[str]:
        """Once the job ended: the log read to its end (the worker's last append), or its row's tail."""
        out: builtins.list[str] = []
        read = livelogs.READ_ENTRIES
        while batch := livelogs.pieces(await self.store.log_after(job_id, lines.offset, read)):
            out += lines.take(batch)
        out += lines.rest()
        if state is not None:
            out += lines.tail_lines(*await self.store.log_tail_and_attempt(job_id))
        return out

    async def events(self, job_id: str | None = None, count: int = 1000,
                     after: str = "-") -> builtins.list[dict[str, str]]:
        """`Pool.events`: transitions in order, oldest first: the stream, or one job's whole history."""
        event_stream.check_read(job_id, count, after)
        if job_id is not None:
            found, _ = await self.store.history_and_newest(job_id)
            own = event_stream.history_entries(job_id, found)
            if own is not None:
                return event_stream.own_after(own, after, count)
        return event_stream.stream_entries(await self.store.events_after(after, count), job_id)

    def follow_events(self, job_id: str | None = None, after: str | None = None,
                      block_secs: float = 1.0) -> EventFollower:
        """`Pool.follow_events`: the events written after stream id `after` (default: from now on), as they
        come (those of `job_id` alone when it is given); never ends by itself: stop iterating to stop. Each
        wait blocks on the server at most `block_secs`, on a connection of the client's pool. The arguments
        are checked at once, as `Pool`'s are.

        "Now" takes a read of the stream, which a plain call cannot make: await the follower to fix it at
        once (`events = await pool.follow_events()`, then act, then `async for e in events`), as `Pool`'s
        call does; iterated without, "now" is when the first event is asked for."""
        event_stream.check_follow(job_id, after, block_secs)
        return EventFollower(self.store, job_id, after, int(block_secs * 1000))

    async def wait(self, job_id: str, timeout: float = 60.0, states: Iterable[str | JobState] = TERMINAL,
                   fallback_secs: float = 5.0) -> Job:
        """Until the job is in one of `states` (terminal by default); `JobTimeout` after `timeout` s. Woken by
        the job's own transitions, not by polling; its row is read again at least every `fallback_secs`
        whatever the stream says."""
        wanted = apichecks.check_states(states)
        apichecks.check_wait_args(timeout, fallback_secs, "fallback_secs")
        apichecks.check_id(job_id)
        deadline = time.monotonic() + timeout
        async with self._waiters.waiting_for(job_id) as woken:
            while True:
                job = await self.store.job(job_id)
                if job.state in wanted:
                    return job
                left = deadline - time.monotonic()
                if left <= 0:
                    raise errors.JobTimeout(f"job {job_id} is still {job.state} after {timeout:g}s")
                # asyncio.wait, not wait_for: wait_for (Python 3.10, 3.11) returns the result of a wake that
                # comes with the caller's cancellation, losing the cancellation, and on 3.10 raises its own
                # TimeoutError; wait neither raises on a timeout nor keeps a cancellation from its caller.
                wake = asyncio.ensure_future(woken.wait())
                try:
                    await asyncio.wait({wake}, timeout=min(left, fallback_secs))
                finally:
                    wake.cancel()
                woken.clear()

    # ---- control ------------------------------------------------------------------------------------

    async def cancel(self, job_id: str, reason: str = "") -> Job:
        """`Pool.cancel`: a running job is asked to stop (the request is persisted)."""
        apichecks.check_id(job_id)
        apichecks.check_text("reason", reason)
        await self.store.finish_promotion(await self.store.cancel(job_id, reason, self.actor), self.actor)
        return await self.get(job_id)

    async def pause(self, job_id: str | None = None, reason: str = "") -> Job | None:
        """`Pool.pause`: one job, or with no id the whole queue's promotion."""
        if job_id is not None:
            apichecks.check_id(job_id)
        apichecks.check_text("reason", reason)
        if job_id is None:
            await self.store.pause_queue(self.actor, reason)
            return None
        await self.store.finish_promotion(await self.store.pause_job(job_id, reason, self.actor), self.actor)
        return await self.get(job_id)

    async def resume(self, job_id: str | None = None, anywhere: bool = False) -> Job | None:
        """`Pool.resume`: one paused job (it keeps its place), or the whole queue's promotion."""
        if not isinstance(anywhere, bool) or (job_id is None and anywhere):
            raise errors.InvalidArgument(f"anywhere must be True (with a job id) or False, got {anywhere!r}")
        if job_id is None:
            await self.store.finish_promotion(await self.store.resume_queue(self.actor), self.actor)
            return None
        apichecks.check_id(job_id)
        moved = await self.store.resume_job(job_id, self.actor, anywhere)
        await self.store.finish_promotion(moved, self.actor)
        return await self.get(job_id)


class _Waiters:
    """The waiters of one `AsyncPool`, by job id, and the one reader of the event stream that wakes them:
    started by the first waiter, from the stream's newest id read before that waiter reads its job (so no
    transition after the read is missed), stopped with the last."""

    def __init__(self, store: AsyncStore) -> None:
        self.store = store
        self.by_job: dict[str, set[asyncio.Event]] = {}
        self.reader: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def waiting_for(self, job_id: str) -> Any:
        woken = asyncio.Event()
        self.by_job.setdefault(job_id, set()).add(woken)
        try:
            async with self._starting:  # two first waiters at once start one reader
                if self.reader is None or self.reader.done():
                    after = await self.store.newest_event_id()
                    self.reader = asyncio.create_task(self._read(after), name="jobpool-aio-waiters")
        except BaseException:
            await self._leave(job_id, woken)
            raise
        try:
            yield woken
        finally:
            await self._leave(job_id, woken)

    async def _leave(self, job_id: str, woken: asyncio.Event) -> None:
        waiting = self.by_job.get(job_id, set())
        waiting.discard(woken)
        if not waiting:
            self.by_job.pop(job_id, None)
        if not self.by_job:
            await self.close()

    async def _read(self, after: str) -> None:
        """Wake the waiters of each job a new stream entry names, for as long as there are waiters. A read
        that fails is tried again after a second: the waiters poll meanwhile (`fallback_secs`)."""
        while self.reader is asyncio.current_task():
            try:
                reply = await self.store.events_following(after, FOLLOW_COUNT, FOLLOW_BLOCK_MS)
            except errors.JobpoolError as exc:
                # redis-py may turn the cancellation of a blocked read into a connection error: a reader
                # that was stopped (`close`) is no longer `self.reader`, and ends here.
                log.debug("waiters' reader: %s", exc)
                if self.reader is asyncio.current_task():
                    await asyncio.sleep(1)
                continue
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    after = entry_id
                    for woken in self.by_job.get(fields.get("job", ""), ()):
                        woken.set()

    async def close(self) -> None:
        """Stop the reader, and wait (a moment at most) for it to end. Its end is awaited through
        `asyncio.wait`, which neither raises its cancellation here nor swallows this task's own."""
        reader, self.reader = self.reader, None
        if reader is not None and not reader.done():
            reader.cancel()
            await asyncio.wait({reader}, timeout=FOLLOW_BLOCK_MS / 1000)

