"""`Store`: one pool's Redis, and one typed method per Lua script.

Each method takes the script's inputs by name, builds the KEYS and ARGV that script's header declares (in
jobpool/scripts/), runs it (jobpool/store/runner.py: by SHA, codes mapped to exceptions) and reads its reply
into a value of jobpool/store/replies.py. Callers never see KEYS, ARGV or a reply's positions: a script's
layout changes here and in its Lua file only.

The scripts that may free a slot take the head of the queue as promotion candidates (`candidates`, read
just before the call); when the candidates ran out or went stale the reply says so, and a caller that
promotes (`finish_promotion`) finishes the promotion with fresh ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import redis
from rq.connections import parse_connection

from .. import errors
from ..config import Settings
from ..contract import LIVE_LOG_CAP_BYTES
from ..errors import JobpoolError
from . import schema
from .eventreads import EventReads
from .fleetreads import FleetReads
from .logreads import LogReads
from .luatext import shape
from .orderreads import OrderReads
from .redisurl import connect
from .replies import (
    Adopted,
    Cancelled,
    Claimed,
    CollisionCleared,
    Enqueued,
    GhostDropped,
    Lead,
    LimitSet,
    Marked,
    Moved,
    QueueResumed,
    Release,
    Requests,
    SlotsSet,
)
from .runner import SCRIPT_NAMES, Scripts, call_redis
from .schedulereads import ScheduleReads
from .statusreads import StatusReads
from .sweepio import SweepIO
from .threadclients import ThreadClients
from .trendreads import TrendReads
from .workerio import WorkerIO

#: How many head-of-queue candidates a slot-freeing call carries (scripts/_lib.lua caps a batch at 64).
CANDIDATES_ON_RELEASE = 4
CANDIDATES_ON_PROMOTE = 32
#: A promotion finished by `promote_all` is bounded: each round promotes or stops.
PROMOTE_ROUNDS = 1000


@dataclass(frozen=True)
class EnqueueCall:
    """The enqueue script's KEYS and ARGV for one batch, made ahead of the call (jobpool/submit.py makes the
    next batch's while the server runs the current one)."""

    keys: list[str]
    args: list[Any]


@dataclass(frozen=True)
class InventoryFence:
    """Evidence read from a daemon's inventory (jobpool/supervisor/remote.py): reconcile_apply is applied only
    while that inventory is the very one judged (same `at`) and no older than `max_age_ms`."""

    daemon_id: str
    at: int
    max_age_ms: int


@dataclass(frozen=True)
class ReconcileCall:
    """One verdict for `Store.reconcile_apply_many`: what `Store.reconcile_apply` takes."""

    job_id: str
    attempt: int
    owner_boot: str
    container_id: str
    verdict: str
    reason: str
    exit_code: int | None
    recovery_budget: int
    evidence: str
    actor: str
    route: str | None = None
    fence: InventoryFence | None = None


def candidate_keys(keys: Any, ids: Sequence[str], routes: Sequence[Any]) -> list[str]:
    """The promotion candidates' keys for queued `ids` and the RQ list each row routes it to (`routes`: its
    `affinity_queue` as read, else the pool's queue): what `Store.candidates` and the asyncio store pass."""
    return [key for job_id, route in zip(ids, routes, strict=True)  # a row not a hash: the script drops
            for key in (keys.job(job_id), keys.rq_job(job_id),
                        route if isinstance(route, str) and route else keys.rq_queue)]


#: A script's own KEYS and ARGV, as both stores (this one and store/asyncstore.py) send them: (keys, args).
Call = tuple[list[str], list[Any]]


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


def _requests(pause: Any, cancel: Any) -> Requests:
    return Requests(pause == "1", cancel == "1")


def moved(reply: list[Any]) -> Moved:
    """The reply of a script that moves a job and may promote (pause_job.lua, resume_job.lua, ...)."""
    return Moved(state=str(reply[1]), promoted=int(reply[2]), why_stopped=reply[3])


class HasStore(Protocol):
    """What holds a pool's store: `Pool`, as the public functions outside api.py that take a pool see it."""

    @property
    def store(self) -> Store: ...


class Store(OrderReads, EventReads, LogReads, FleetReads, StatusReads, SweepIO, WorkerIO, ScheduleReads,
            TrendReads):
    """One pool's keys and scripts on one Redis client."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        super().__init__(client, settings)
        #: The single-connection client each thread runs the enqueue script on.
        self.thread_clients = ThreadClients()
        self.scripts = Scripts(client, settings.max_concurrent_jobs, settings.events_maxlen,
                               settings.redis_wait_replicas, settings.redis_wait_timeout_secs,
                               settings.reserve_after_secs, settings.retry_delay_max_secs)
        self.scripts.config_key, self.scripts.pool = self.keys.config, self.keys.pool
        #: Each script's pool keys, in the order its header names them (luatext.shape): after its own KEYS.
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

    # ---- plumbing ------------------------------------------------------------------------------------

    def pool_keys(self, op: str) -> list[str]:
        """The pool keys script `op` takes after its own (its header's `Pool keys:`; a fresh list)."""
        return list(self._pool_keys[op])

    def run(self, op: str, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
        """Script `op` with its own `keys`, then the pool keys it names (scripts/_lib.lua), its reply as a
        list: what the typed methods below use, and what the scripts' own tests call to reach a script's raw
        contract."""
        return self.scripts.run(op, [*keys, *self._pool_keys[op]], args)

    def candidates(self, n: int) -> list[str]:
        """Keys of the first `n` jobs of `ready` (the queued less the parked), what a slot-freeing script may
        promote (checked there): row, RQ
        job hash, and the RQ list the row routes it to (`affinity_queue`, else the pool's queue)."""
        ids = call_redis(self.client.zrange, self.keys.ready, 0, n - 1)
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(self.keys.job(job_id), "affinity_queue")
        routes = call_redis(pipe.execute, raise_on_error=False, what="candidates") if ids else []
        return candidate_keys(self.keys, ids, routes)

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

    def evict(self, job_id: str, attempt: int, reason: str, evidence: str, actor: str,
              daemon_id: str = "") -> Moved:
        """Fail a running job if it is still at `attempt` (and on `daemon_id`, when given)."""
        return moved(self.run("evict", [self.keys.job(job_id), self.keys.lease(job_id),
                                         *self.candidates(CANDIDATES_ON_RELEASE)],
                               [job_id, attempt, reason, evidence, actor, daemon_id]))

    def prune(self, state: str, keep: int, cutoff_ms: int, actor: str, ids: Sequence[str],
              job_keys: Sequence[str]) -> list[str]:
        """Remove the finished jobs `ids` still past retention; returns the ids removed. `job_keys` are the
        seven keys per job scripts/prune.lua takes (jobpool/retention.py `batch_keys`)."""
        keys = [self.keys.rq_finished, self.keys.rq_failed, *job_keys]
        reply = self.run("prune", keys, [state, keep, cutoff_ms, actor, *ids])
        return [str(i) for i in reply[2:]]

    # ---- the supervisor's verdicts -------------------------------------------------------------------

    def reconcile_apply(self, job_id: str, attempt: int, owner_boot: str, container_id: str, verdict: str,
                        reason: str, exit_code: int | None, recovery_budget: int, evidence: str, actor: str,
                        route: str | None = None, fence: InventoryFence | None = None) -> Moved:
        """Apply a verdict on a row whose owner is gone, only while the row is as the evidence found it
        (scripts/reconcile_apply.lua). `route`: for a redispatch, the RQ list the row routes it to (it
        promotes nothing); `fence`: evidence from a daemon's inventory."""
        keys, args = self._reconcile_call(ReconcileCall(job_id, attempt, owner_boot, container_id, verdict,
                                                        reason, exit_code, recovery_budget, evidence, actor,
                                                        route, fence), self.candidates(CANDIDATES_ON_RELEASE))
        return moved(self.scripts.run("reconcile_apply", keys, args))

    def reconcile_apply_many(self, calls: Sequence[ReconcileCall]) -> list[Moved | JobpoolError]:
        """`reconcile_apply` for many rows in one round trip (a sweep's verdicts: runner.Scripts.run_many),
        each its own compare-and-set: a row that moved on is its own `Conflict`, in its place. They share one
        read of the promotion candidates, which each script checks against the queue's head."""
        if not calls:
            return []
        candidates = self.candidates(CANDIDATES_ON_RELEASE)
        replies = self.scripts.run_many("reconcile_apply",
                                        [self._reconcile_call(c, candidates) for c in calls])
        return [r if isinstance(r, JobpoolError) else moved(r) for r in replies]

    def _reconcile_call(self, c: ReconcileCall, candidates: list[str]) -> tuple[list[str], list[Any]]:
        k = self.keys
        keys = [k.job(c.job_id), k.lease(c.job_id), k.rq_job(c.job_id)]
        if c.route is not None:
            keys.append(c.route)
        else:
            if c.fence is not None:
                keys.append(k.inventory(c.fence.daemon_id))
            keys += candidates
        args = [c.job_id, c.attempt, c.owner_boot, c.container_id, c.verdict, c.reason,
                "" if c.exit_code is None else c.exit_code, c.recovery_budget, c.evidence, c.actor,
                *([c.fence.at, c.fence.max_age_ms] if c.fence else [])]
        return [*keys, *self._pool_keys["reconcile_apply"]], args

    def drop_ghost(self, job_id: str, evidence: str, actor: str) -> GhostDropped:
        reply = self.run("drop_ghost", [self.keys.job(job_id), self.keys.lease(job_id),
                                        *self.candidates(CANDIDATES_ON_RELEASE)], [job_id, evidence, actor])
        return GhostDropped(dropped=bool(int(reply[1])), promoted=int(reply[2]), why_stopped=reply[3])

    # ---- one attempt, fenced on (boot, attempt) -------------------------------------------------------

    def _attempt_keys(self, job_id: str) -> list[str]:
        return [self.keys.job(job_id), self.keys.lease(job_id)]

    def claim(self, job_id: str, boot_id: str, attempt: int, lease_ms: int, executor: str, daemon_id: str,
              token: str) -> Claimed:
        reply = self.run("claim", self._attempt_keys(job_id),
                         [job_id, boot_id, attempt, lease_ms, executor, daemon_id, token])
        return Claimed(spec_json=reply[1], requests=_requests(reply[2], reply[3]))

    def adopt(self, job_id: str, old_owner: str, attempt: int, boot_id: str, lease_ms: int, evidence: str,
              daemon_id: str) -> Adopted:
        reply = self.run("adopt", self._attempt_keys(job_id),
                         [job_id, old_owner, attempt, boot_id, lease_ms, evidence, daemon_id])
        return Adopted(spec_json=reply[1], container_id=reply[2], requests=_requests(reply[3], reply[4]))

    def heartbeat(self, job_id: str, boot_id: str, attempt: int, lease_ms: int) -> Requests:
        reply = self.run("heartbeat", [*self._attempt_keys(job_id), self.keys.log_watch(job_id)],
                         [boot_id, attempt, lease_ms])
        return Requests(reply[1] == "1", reply[2] == "1", reply[3] == 1)

    def time_out(self, job_id: str, boot_id: str, attempt: int, evidence: str) -> bool:
        """Mark the attempt as stopped for its time limit before its watcher stops it (scripts/time_out.lua):
        its exit then fails it as `timeout`, or retries it. False when it was marked already."""
        reply = self.run("time_out", [self.keys.job(job_id)], [boot_id, attempt, evidence])
        return bool(reply[1] == "marked")

    def append_log(self, job_id: str, boot_id: str, attempt: int, text: str, position: str,
                   linger_ms: int = 0) -> int:
        """Append what the attempt printed to the job's live log (scripts/log_append.lua), up to `position`
        in its output; returns the log's length in bytes. `linger_ms` > 0 on the attempt's last append."""
        reply = self.run("log_append", [self.keys.job(job_id), self.keys.job_log(job_id)],
                         [boot_id, attempt, text, position, LIVE_LOG_CAP_BYTES, linger_ms])
        return int(reply[1])

    def set_container(self, job_id: str, boot_id: str, attempt: int, container_id: str, daemon_id: str,
                      identity: dict[str, Any] | None, lease_ms: int, daemon_queue: str) -> Requests:
        """Record what was launched (renewing the lease, reading the requests back); `daemon_queue` is the
        daemon's own RQ list for a handback with its checkpoint ('' for none)."""
        reply = self.run("set_container", self._attempt_keys(job_id),
                         [boot_id, attempt, container_id, daemon_id,
                          json.dumps(identity, sort_keys=True) if identity else "", lease_ms, daemon_queue])
        return _requests(reply[1], reply[2])

    def finish(self, job_id: str, boot_id: str, attempt: int, kind: str, exit_code: int | None, reason: str,
               log_tail: bytes | str, recovery_budget: int, evidence: str) -> Moved:
        """Report how an attempt ended (scripts/finish.lua, `kind`), releasing its slot; `log_tail` as the row
        stores it (jobpool/logtail.py)."""
        return moved(self.run(
            "finish", [*self._attempt_keys(job_id), *self.candidates(CANDIDATES_ON_RELEASE)],
            [job_id, boot_id, attempt, kind, "" if exit_code is None else exit_code, reason, log_tail,
             recovery_budget, evidence]))

    def give_back(self, queue_key: str, intermediate_key: str, rq_job_id: str) -> bool:
        """Put a job a worker just took back at the head of its RQ queue; False when it was not taken."""
        return bool(int(self.run("give_back", [queue_key, intermediate_key], [rq_job_id])[1]))

    # ---- the fleet: inventories, routed commands, daemons ---------------------------------------------

    def inventory_lead(self, daemon_id: str, boot_id: str, lead_ms: int) -> Lead:
        reply = self.run("inventory_lead", [self.keys.inventory_lead(daemon_id)],
                         [daemon_id, boot_id, lead_ms])
        return Lead(held=bool(int(reply[1])), holder=str(reply[2]))

    def publish_inventory(self, daemon_id: str, boot_id: str, kernel_boot_id: str, lead_ms: int,
                          ttl_ms: int, complete: bool, containers: str, forget_ms: int, listed_at: int,
                          strays: str) -> int:
        """Write a daemon's inventory whole (by the holder of its lead); returns its `at` (ms)."""
        k = self.keys
        reply = self.run("publish_inventory", [k.inventory(daemon_id), k.inventory_lead(daemon_id),
                                               k.inventories, k.gone_daemons, k.returned_daemons],
                         [daemon_id, boot_id, kernel_boot_id, lead_ms, ttl_ms, "1" if complete else "0",
                          containers, forget_ms, listed_at, strays])
        return int(reply[1])

    def push_command(self, job_id: str, attempt: int, daemon_id: str, command: str, ttl_ms: int,
                     evidence: str, actor: str) -> int:
        """Route a command to the workers on `daemon_id`; returns how many wait there."""
        reply = self.run("push_command", [self.keys.job(job_id), self.keys.commands(daemon_id)],
                         [job_id, attempt, daemon_id, command, ttl_ms, evidence, actor])
        return int(reply[1])

    def take_commands(self, daemon_id: str, boot_id: str, most: int) -> list[str]:
        """The commands routed to `daemon_id`, oldest first, taken by the holder of its lead."""
        k = self.keys
        reply = self.run("take_commands", [k.commands(daemon_id), k.inventory_lead(daemon_id)],
                         [boot_id, most])
        return [str(text) for text in reply[1:]]

    def command_done(self, job_id: str, reason: str, evidence: str, actor: str) -> str:
        """Record in a job's events what a worker did on its daemon; returns the job's state."""
        return str(self.run("command_done", [self.keys.job(job_id)], [job_id, reason, evidence, actor])[1])

    def forget_daemon(self, daemon_id: str, stale_ms: int, actor: str, note: str,
                      rows: Sequence[str]) -> int:
        """Declare a daemon gone for good; `rows` are the ids of the running jobs read as on it. Returns when
        (ms)."""
        k = self.keys
        reply = self.run("forget_daemon", [k.gone_daemons, k.inventory(daemon_id), k.commands(daemon_id),
                                           k.inventory_lead(daemon_id), k.inventories,
                                           *(k.job(job_id) for job_id in rows)],
                         [daemon_id, stale_ms, actor, note])
        return int(reply[1])

    def unforget_daemon(self, daemon_id: str, actor: str, note: str, keep_ms: int) -> int:
        reply = self.run("unforget_daemon", [self.keys.gone_daemons, self.keys.returned_daemons],
                         [daemon_id, actor, note, keep_ms])
        return int(reply[1])

    def daemon_mark(self, process_id: str, ttl_ms: int, forget_ms: int, fields: Iterable[tuple[str, str]],
                    scan_ms: int = 0) -> Marked:
        """Register (or refresh) one process that marked its Docker daemon, its record's `fields` in order
        (`daemon_id` among them: the identity's index it enters; a `collision` reported is recorded).
        `scan_ms`: the caller takes the pool's turn to index unindexed records for that long when no one
        holds it (`Marked.scan`; 0: never)."""
        k = self.keys
        args: list[Any] = [process_id, ttl_ms, forget_ms, scan_ms]
        given = dict(fields)
        for name, value in given.items():
            args += [name, value]
        keys = [k.daemon_mark(process_id), k.daemon_marks, k.daemon_marks_of(given.get("daemon_id", "")),
                k.daemon_marks_scan]
        # A report of a collision is recorded in `shared_daemons` too, by a script of its own: the period's
        # refresh, the common call, runs a script without the event's definitions (jobpool/store/luatext.py).
        if given.get("collision"):
            reply = self.run("daemon_collision", [*keys, k.shared_daemons], args)
        else:
            reply = self.run("daemon_mark", keys, args)
        return Marked(at=int(reply[1]), recorded=bool(int(reply[2])), scan=bool(int(reply[3])))

    def daemon_mark_index(self, records: Iterable[tuple[str, str]]) -> int:
        """Index records written without their identity's index entry: (process id, its `daemon_id` as read),
        each only if it still says so and still lacks one. Returns how many were indexed."""
        k = self.keys
        keys: list[str] = []
        args: list[Any] = []
        for process_id, daemon_id in records:
            keys += [k.daemon_mark(process_id), k.daemon_marks_of(daemon_id)]
            args += [process_id, daemon_id]
        if not keys:
            return 0
        return int(self.run("daemon_mark_index", keys, args)[1])

    def daemon_unmark(self, process_id: str, daemon_id: str = "") -> bool:
        """Remove a process's mark record (and its entry in `daemon_id`'s index); True when it was there."""
        k = self.keys
        keys = [k.daemon_mark(process_id), k.daemon_marks]
        if daemon_id:
            keys.append(k.daemon_marks_of(daemon_id))
        reply = self.run("daemon_unmark", keys, [process_id])
        return bool(int(reply[1]))

    def forget_collision(self, daemon_id: str, actor: str, note: str,
                         process_ids: Iterable[str]) -> CollisionCleared:
        """Clear the standing collision on `daemon_id`, and the reports in the records of `process_ids`."""
        k = self.keys
        reply = self.run("forget_collision", [k.shared_daemons, *(k.daemon_mark(i) for i in process_ids)],
                         [daemon_id, actor, note])
        return CollisionCleared(at=int(reply[1]), cleared=int(reply[2]))

    # ---- made by a process ------------------------------------------------------------------------------

    @classmethod
    def from_settings(cls, settings: Settings) -> Store:
        """The store of `settings.pool` on a new client of `settings.redis_url` (redisurl.connect: no round
        trip yet), for a process that works on a pool below the public API (a supervisor, a worker, the
        metrics server)."""
        return cls(connect(settings.redis_url), settings)
