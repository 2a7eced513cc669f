"""`Store`: one pool's Redis, its reads and one typed method per Lua script; the API's script calls here.

Each method takes the script's inputs by name, builds the KEYS and ARGV that script's header declares (in
jobpool/scripts/), runs it (jobpool/store/runner.py: by SHA, codes mapped to exceptions) and reads its reply
into a value of jobpool/store/replies.py. Callers never see KEYS, ARGV or a reply's positions: a script's
layout changes here (or in the part of the store its caller uses: store/scriptcalls.py says which) and in its
Lua file only.

The scripts that may free a slot take the head of the queue as promotion candidates (`candidates`, read
just before the call); when the candidates ran out or went stale the reply says so, and a caller that
promotes (`finish_promotion`) finishes the promotion with fresh ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import redis
from rq.connections import parse_connection

from .. import errors
from ..config import Settings
from ..errors import JobpoolError
from . import schema
from .eventreads import EventReads
from .fleetcalls import FleetCalls
from .fleetreads import FleetReads
from .logreads import LogReads
from .luatext import shape
from .orderreads import OrderReads
from .redisurl import connect
from .replies import Cancelled, Enqueued, LimitSet, Moved, QueueResumed, Release, SlotsSet
from .runner import SCRIPT_NAMES, Scripts, call_redis
from .schedulereads import ScheduleReads
from .scriptcalls import CANDIDATES_ON_PROMOTE, CANDIDATES_ON_RELEASE, PROMOTE_ROUNDS, Call, moved
from .statusreads import StatusReads
from .sweepcalls import SweepCalls
from .sweepio import SweepIO
from .threadclients import ThreadClients
from .trendreads import TrendReads
from .workercalls import WorkerCalls
from .workerio import WorkerIO


@dataclass(frozen=True)
class EnqueueCall:
    """The enqueue script's KEYS and ARGV for one batch, made ahead of the call (jobpool/submit.py makes the
    next batch's while the server runs the current one)."""

    keys: list[str]
    args: list[Any]


def cancel_call(keys: Any, job_id: str, reason: str, actor: str, candidates: list[str]) -> Call:
    """cancel.lua's own KEYS and ARGV."""
    return [keys.job(job_id), keys.lease(job_id), *candidates], [job_id, reason, actor]


def pause_job_call(keys: Any, job_id: str, reason: str, actor: str, candidates: list[str]) -> Call:
    """pause_job.lua's own KEYS and ARGV."""
    return [keys.job(job_id), keys.lease(job_id), *candidates], [job_id, reason, actor]


def resume_job_call(keys: Any, job_id: str, actor: str, anywhere: bool, candidates: list[str]) -> Call:
    """resume_job.lua's own KEYS and ARGV (`anywhere`: release the job's affinity first)."""
    return [keys.job(job_id), *candidates], [job_id, actor, "1" if anywhere else "0"]


def enqueue_call(keys: Any, pool_keys: list[str], actor: str,
                 jobs: Iterable[tuple[str, str, str, str, str, str]], fire: str = "") -> EnqueueCall:
    """The enqueue script's inputs for `jobs`, each (id, spec JSON, coalesce key or '', its order and
    limits: `JobSpec.schedule_arg`, what it waits for: jobpool/submit.py `Prepared.holds`, its retries:
    `JobSpec.retry_arg`); `fire` a schedule's 'name|tick|next tick' (jobpool/schedules.py); `pool_keys` the
    script's pool keys."""
    key_list: list[str] = []
    args: list[Any] = [actor, fire]
    for job in jobs:
        key_list += (keys.job(job[0]), keys.rq_job(job[0]))
        args += job
    key_list += pool_keys
    return EnqueueCall(key_list, args)


def cancelled(reply: list[Any]) -> Cancelled:
    """cancel.lua's reply."""
    return Cancelled(state=str(reply[1]), promoted=int(reply[2]), why_stopped=reply[3],
                     owner_boot=reply[4] or "", attempt="" if reply[5] is None else str(reply[5]))


def enqueued(reply: list[Any]) -> Enqueued:
    """enqueue.lua's reply. Positional: this is every enqueue's path (bench/enqueue.py), and keywords cost
    it more."""
    return Enqueued(reply[2], reply[3], reply[1], reply[4], tuple(reply[5:]))


def queue_resumed(reply: list[Any]) -> QueueResumed:
    """resume_queue.lua's reply."""
    return QueueResumed(was_paused=bool(int(reply[1])), promoted=int(reply[2]), why_stopped=reply[3])


def released(reply: list[Any]) -> Release:
    """promote.lua's reply."""
    return Release(promoted=int(reply[2]), why_stopped=reply[3])


class HasStore(Protocol):
    """What holds a pool's store: `Pool`, as the public functions outside api.py that take a pool see it."""

    @property
    def store(self) -> Store: ...


class Store(OrderReads, EventReads, LogReads, FleetReads, StatusReads, SweepIO, WorkerIO, ScheduleReads,
            TrendReads, WorkerCalls, SweepCalls, FleetCalls):
    """One pool's keys and scripts on one Redis client."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        super().__init__(client, settings)
        #: The single-connection client each thread runs the enqueue script on.
        self.thread_clients = ThreadClients()
        self.scripts = Scripts(client, settings.max_concurrent_jobs, settings.events_maxlen,
                               settings.redis_wait_replicas, settings.redis_wait_timeout_secs,
                               settings.reserve_after_secs, settings.retry_delay_max_secs)
        self.scripts.config_key, self.scripts.pool = self.keys.config, self.keys.pool
        self._pool_keys = {name: self.keys.named(shape(name).pool_keys) for name in SCRIPT_NAMES}

    def close(self) -> None:
        """Close the Redis connections (the store may be used again: redis-py reconnects)."""
        self.thread_clients.close()
        self.client.close()

    def rq_client(self) -> redis.Redis:
        """A new client of the same server for RQ's own calls: RQ needs one that does not decode replies;
        built the way RQ rebuilds connections (rq.connections.parse_connection)."""
        cls, conn_cls, kwargs = parse_connection(self.client)
        kwargs = {**kwargs, "decode_responses": False}
        client: redis.Redis = cls(connection_pool=redis.ConnectionPool(connection_class=conn_cls, **kwargs))
        return client

    def promote_all(self, actor: str) -> int:
        """Promote queued jobs into free slots until the queue, the slots or promotion stop it."""
        total = 0
        for _ in range(PROMOTE_ROUNDS):
            done = self.promote(actor)
            total += done.promoted
            if not done.promote_again:
                break
        return total

    def finish_promotion(self, release: Release, actor: str) -> None:
        """After a script that may free a slot: when its candidates ran out or went stale, promote again."""
        if release.promote_again:
            self.promote_all(actor)

    # ---- the queue and the API's changes of a job -----------------------------------------------------

    def enqueue_call(self, actor: str, jobs: Iterable[tuple[str, str, str, str, str, str]],
                     fire: str = "") -> EnqueueCall:
        """The enqueue script's inputs for `jobs` (`enqueue_call`)."""
        return enqueue_call(self.keys, self._pool_keys["enqueue"], actor, jobs, fire)

    def enqueue(self, call: EnqueueCall, meanwhile: Callable[[], None] | None = None) -> Enqueued:
        """scripts/enqueue.lua for one batch, on this thread's single-connection client (`thread_clients`),
        with `meanwhile` run while the server works (runner.Scripts.run). Making that client connects at
        once, so a Redis that cannot be reached fails there, before anything is sent: typed like the call's
        own failures."""
        client = call_redis(self.thread_clients.get, self.client, what="enqueue")
        return enqueued(self.scripts.run("enqueue", call.keys, call.args, client=client, meanwhile=meanwhile))

    def promote(self, actor: str) -> Release:
        """One round of scripts/promote.lua with the queue's head as candidates."""
        return released(self.run("promote", self.candidates(CANDIDATES_ON_PROMOTE), [actor]))

    def retry_job(self, job_id: str, actor: str) -> str:
        """A failed or cancelled job again as a new attempt (scripts/retry_job.lua); the state it is in after
        (queued or waiting). The caller promotes."""
        return str(self.run("retry_job", [self.keys.job(job_id)],
                            [job_id, actor])[1])

    def due_waiting(self, now_ms: int, most: int) -> list[str]:
        """The ids of up to `most` waiting jobs due at `now_ms` (Redis time), soonest first."""
        return list(call_redis(self.client.zrangebyscore, self.keys.waiting, "-inf", now_ms, 0, most,
                               what="due waiting jobs"))

    def release_waiting(self, job_ids: Sequence[str], actor: str) -> tuple[int, int, int]:
        """Judge the due waiting jobs `job_ids` again (scripts/release_waiting.lua): how many were queued,
        cancelled, and left waiting."""
        reply = self.run("release_waiting", [self.keys.job(j) for j in job_ids], [actor, *job_ids])
        return int(reply[1]), int(reply[2]), int(reply[3])

    # ---- schedules (jobpool/schedules.py) ---------------------------------------------------------------

    def schedule_set(self, name: str, definition: str, now_ms: int, next_ms: int, replace: bool,
                     actor: str) -> bool:
        """Add schedule `name`, or with `replace` replace its definition (scripts/schedule_set.lua); True when
        one was replaced. `AlreadyExists` when it exists and not `replace`."""
        reply = self.run("schedule_set", [],
                         [name, definition, now_ms, next_ms, "1" if replace else "0", actor])
        return bool(int(reply[1]))

    def schedule_remove(self, name: str, actor: str) -> None:
        """Remove schedule `name` (scripts/schedule_remove.lua); `NotFound` when there is none."""
        self.run("schedule_remove", [], [name, actor])

    def schedule_pause(self, name: str, pause: bool, actor: str) -> bool:
        """Pause or resume schedule `name` (scripts/schedule_pause.lua); False when it was so already."""
        return bool(int(self.run("schedule_pause", [], [name, "1" if pause else "0", actor])[1]))

    def schedule_skip(self, name: str, seen: str, tick_ms: int | None, next_ms: int, why: str,
                      actor: str) -> None:
        """Record `tick_ms` of schedule `name` as skipped, or with None only set its next tick, if its
        watermark is still `seen` (as read; '' for none) (scripts/schedule_skip.lua): `AlreadyExists` when
        it moved, `InvalidState` when it is paused, `NotFound` when it is gone."""
        self.run("schedule_skip", [], [name, seen, "" if tick_ms is None else tick_ms, next_ms, why, actor])

    def cancel(self, job_id: str, reason: str, actor: str) -> Cancelled:
        return cancelled(self.run("cancel", *cancel_call(self.keys, job_id, reason, actor,
                                                         self.candidates(CANDIDATES_ON_RELEASE))))

    def pause_job(self, job_id: str, reason: str, actor: str) -> Moved:
        return moved(self.run("pause_job", *pause_job_call(self.keys, job_id, reason, actor,
                                                           self.candidates(CANDIDATES_ON_RELEASE))))

    def resume_job(self, job_id: str, actor: str, anywhere: bool = False) -> Moved:
        """Resume a paused job, withdraw a pause requested of a running one; `anywhere` first releases its
        affinity (scripts/resume_job.lua)."""
        return moved(self.run("resume_job", *resume_job_call(self.keys, job_id, actor, anywhere,
                                                             self.candidates(CANDIDATES_ON_RELEASE))))

    def release_affinity(self, job_id: str, daemon_id: str, actor: str) -> Moved:
        """Only release the job's affinity to `daemon_id`, if its row still names it (scripts/resume_job.lua
        with an expected affinity: nothing else is resumed; `Conflict` when the row names another)."""
        return moved(self.run("resume_job", [self.keys.job(job_id)], [job_id, actor, "1", daemon_id]))

    def pause_queue(self, actor: str, reason: str) -> bool:
        """Hold promotion; True when it was not held before."""
        return bool(int(self.run("pause_queue", [], [actor, reason])[1]))

    def resume_queue(self, actor: str) -> QueueResumed:
        return queue_resumed(self.run("resume_queue", self.candidates(CANDIDATES_ON_PROMOTE), [actor]))

    def set_limit(self, name: str, size: int | None, actor: str) -> LimitSet:
        """Set a named limit to `size`, or remove it (None; `NotFound` when there is none): limit.lua."""
        args = [name, "" if size is None else size, actor]
        reply = self.run("limit", self.candidates(CANDIDATES_ON_PROMOTE), args)
        return LimitSet(old=None if reply[1] == "" else int(reply[1]), promoted=int(reply[2]),
                        why_stopped=reply[3])

    def trend_sample(self, point: int, width_ms: int, percentiles: str) -> bool:
        """Record point `point` of the pool's history, unless recorded already (scripts/trend_sample.lua);
        True when this call recorded it. `percentiles` as jobpool/trends.py `percentiles_arg` makes it."""
        return bool(int(self.run("trend_sample", [], [point, width_ms, percentiles])[1]))

    def check_schema(self) -> int:
        """The pool's layout version, read now; `PoolTooNew` when this release does not know it (what a
        process does at its start, beside `check_policy`: jobpool/store/schema.py)."""
        return cast(int, self.scripts.check_schema(force=True))

    def recorded_schema(self) -> str | None:
        """The layout version the pool records, as stored (None: none recorded, a pool of jobpool 0.1.0)."""
        raw = call_redis(self.client.hget, self.keys.config, schema.FIELD,
                         what="reading the pool's layout version")
        return None if raw is None else str(raw)

    def set_schema(self, version: int) -> str:
        """Record that the pool holds layout `version` (scripts/set_schema.lua): the version recorded before
        ('' for none); `PoolTooNew` when the pool records a newer one (nothing changed)."""
        try:
            return str(self.run("set_schema", [], [version])[1])
        except JobpoolError as exc:
            if not isinstance(exc, errors.Conflict):
                raise
            schema.refuse_newer(self.keys.pool, self.recorded_schema())
            raise  # recorded newer than `version`, yet known to this release: a caller's mistake

    def set_slots(self, n: int, actor: str) -> SlotsSet:
        reply = self.run("set_slots", self.candidates(CANDIDATES_ON_PROMOTE), [n, actor])
        return SlotsSet(old=int(reply[1]), promoted=int(reply[2]), why_stopped=reply[3])

    # ---- made by a process ------------------------------------------------------------------------------

    @classmethod
    def from_settings(cls, settings: Settings) -> Store:
        """The store of `settings.pool` on a new client of `settings.redis_url` (redisurl.connect: no round
        trip yet), for a process that works on a pool below the public API (a supervisor, a worker, the
        metrics server)."""
        return cls(connect(settings.redis_url), settings)
