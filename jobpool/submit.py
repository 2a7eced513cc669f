"""Submitting jobs: what `Pool.enqueue` and `Pool.enqueue_many` do (jobpool/api.py delegates here).

Every spec is validated in Python before anything is sent (jobpool/spec.py), and a batch is validated whole
before its first job is sent, so a refused spec, wherever it is in the input, writes nothing. Jobs then go to
the enqueue script (scripts/enqueue.lua) `BATCH_SIZE` at a time: one call, and so one round trip and one
atomic step, per batch. Batches are sent one after another, never pipelined: a batch that fails stops the
rest, so what was enqueued is always a prefix of the input, in its order, and the error says how long
(`JobpoolError.enqueued`; a batch whose reply was lost is looked for in Redis: `_settled`). The client's own
work between two batches (the Jobs of the one before, the arguments of the next) is done while the server
runs the current one (`Scripts.run`'s `meanwhile`).

The client does as little per job as it can, because enqueue is the call users make in bulk: the id is 16
random bytes in hex (uuid4's format without its version bits, which nothing reads), the time and RQ's job
hash (all but three fields the same for every job) are made by the script, and the script runs on a
single-connection client held by the calling thread (store/threadclients.py) rather than checking a connection
out of redis-py's pool for every call; jobpool/store/runner.py sends it on that connection directly. Each
job's JobSpec and Job are made without their frozen dataclass __init__ (jobpool/fastinit.py).
"""

from __future__ import annotations

import datetime
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from . import errors
from .config import Settings
from .contract import MAX_AFTER, MAX_TIME_SECS
from .fastinit import Assembler
from .models import Job, JobState
from .spec import JobSpec, build_spec, utf8_size
from .store.calls import EnqueueCall, Store
from .store.replies import Enqueued

#: Jobs per enqueue script call: large enough that a round trip costs well under a microsecond per job, small
#: enough that one call holds Redis for a few milliseconds at most (bench/enqueue.py measures the server time
#: per job).
BATCH_SIZE = 100
MAX_BATCH_SIZE = 1000
#: A caller's coalesce key is stored in rows and the coalesce hash, so bounded.
MAX_COALESCE_KEY_BYTES = 1024
#: The keys of an enqueue_many item besides the spec's own fields: `Pool.enqueue`'s other arguments, and
#: `after_index` (earlier items of the same call to wait for).
SUBMIT_OPTIONS = ("coalesce", "coalesce_key", "not_before", "after", "after_index")
#: A job id as `after` may name one: what `prepare` makes (32 hex digits), or any id a pool could hold.
JOB_ID = re.compile(r"[^\s{}:]{1,128}")
#: How `send` makes each new job's `Job`: its other fields keep their defaults (jobpool/fastinit.py: why).
_new_job = Assembler(Job)


@dataclass(frozen=True, slots=True)
class Prepared:
    """One validated job, ready to send: its new id, its spec, its coalesce key ('' for none) and what it
    waits for, as the enqueue script reads it ('' for nothing: `Holds.arg`)."""

    id: str
    spec: JobSpec
    coalesce_key: str
    holds: str = ""
    #: The ids it waits for as given in `after` (not those `after_index` names): `enqueue_many` looks for
    #: them before it sends anything.
    waits_for: tuple[str, ...] = ()

    def script_args(self) -> tuple[str, str, str, str, str, str]:
        """Its six arguments of scripts/enqueue.lua (store/calls.py `enqueue_call`)."""
        return (self.id, self.spec.to_json(), self.coalesce_key, self.spec.schedule_arg(), self.holds,
                self.spec.retry_arg())


@dataclass(frozen=True)
class Holds:
    """What a job waits for before it is queued: a start time (`not_before`, ms since the epoch; 0 for
    none) and jobs that must succeed first (`after`, ids)."""

    not_before_ms: int = 0
    after: tuple[str, ...] = ()

    def arg(self) -> str:
        """scripts/enqueue.lua's 'not before ms;id id ...', or '' for nothing."""
        if not self.not_before_ms and not self.after:
            return ""
        return f"{self.not_before_ms or ''};{' '.join(self.after)}"


def not_before_ms(value: Any) -> int:
    """`not_before` (a timezone-aware datetime, or seconds since the epoch) in ms; `InvalidSpec` for
    anything else (a naive datetime says no zone: refused rather than guessed)."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise errors.InvalidSpec("not_before must be timezone-aware (a naive datetime names no moment)")
        secs = value.timestamp()
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        secs = float(value)
    else:
        raise errors.InvalidSpec("not_before must be a timezone-aware datetime or epoch seconds, "
                                 f"got {value!r}")
    if not 0 <= secs <= time.time() + MAX_TIME_SECS:
        raise errors.InvalidSpec(f"not_before must be from 1970 to {MAX_TIME_SECS // 86400} days from now")
    return int(secs * 1000)


def check_after(value: Any) -> tuple[str, ...]:
    """`after`: the ids of jobs to wait for, each once, in their order."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise errors.InvalidSpec("after must be a list of job ids")
    if len(value) > MAX_AFTER:
        raise errors.InvalidSpec(f"after names {len(value)} jobs; at most {MAX_AFTER}")
    for job_id in value:
        if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
            raise errors.InvalidSpec(f"after: {job_id!r} is not a job id")
    return tuple(dict.fromkeys(value))


def check_holds(fields: Mapping[str, Any], earlier: Sequence[str] = (), index: int | None = None) -> Holds:
    """What `fields` (enqueue's arguments) says the job waits for. `after_index` names items of the same
    `enqueue_many` call before this one (`earlier`, their new ids), so a pipeline is one call."""
    nb = fields.get("not_before")
    after = check_after(fields.get("after"))
    positions = fields.get("after_index")
    if positions is not None:
        if index is None:
            raise errors.InvalidSpec("after_index refers to items of the same enqueue_many call; "
                                     "enqueue takes after=[job ids]")
        if isinstance(positions, (str, bytes)) or not isinstance(positions, Sequence):
            raise errors.InvalidSpec("after_index must be a list of earlier items' positions")
        for k in positions:
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < index:
                raise errors.InvalidSpec(f"after_index: {k!r} is not the position of an earlier item "
                                         + (f"(0 to {index - 1})" if index else "(the first item has none)"))
        after = check_after([*after, *(earlier[k] for k in positions)])
    holds = Holds(0 if nb is None else not_before_ms(nb), after)
    if holds.arg() and (fields.get("coalesce") or fields.get("coalesce_key")):
        raise errors.InvalidSpec("a job that waits (not_before, after) does not coalesce: only queued jobs "
                                 "do")
    return holds


def prepare(spec_fields: Mapping[str, Any], coalesce: Any, coalesce_key: Any, bind_roots: Sequence[str],
            index: int | None = None, holds: Mapping[str, Any] | None = None,
            earlier: Sequence[str] = ()) -> Prepared:
    """Validate one job (its spec, `coalesce` and `coalesce_key`, and `holds`: enqueue's not_before, after and
    after_index), or raise `InvalidSpec` (with `index`, its position in a batch)."""
    try:
        waits = check_holds({**(holds or {}), "coalesce": coalesce, "coalesce_key": coalesce_key},
                            earlier, index) if holds else Holds()
        spec = build_spec(spec_fields, bind_roots)
        if not isinstance(coalesce, bool):
            raise errors.InvalidSpec(f"coalesce must be true or false, got {coalesce!r}")
        if coalesce_key is not None:
            if not isinstance(coalesce_key, str) or not coalesce_key:
                raise errors.InvalidSpec("coalesce_key must be a non-empty string")
            if utf8_size("coalesce_key", coalesce_key) > MAX_COALESCE_KEY_BYTES:
                raise errors.InvalidSpec(f"coalesce_key is longer than {MAX_COALESCE_KEY_BYTES} bytes")
    except errors.InvalidSpec as exc:
        if index is None:
            raise
        raise errors.InvalidSpec(exc.reason, index=index) from None
    ck = ("key:" + coalesce_key) if coalesce_key else (spec.coalesce_key() if coalesce else "")
    explicit = check_after(holds.get("after")) if holds else ()
    return Prepared(os.urandom(16).hex(), spec, ck, waits.arg(), explicit)


def prepare_item(item: Any, bind_roots: Sequence[str], index: int, earlier: Sequence[str] = ()) -> Prepared:
    """One item of `enqueue_many`: a mapping with the keys of `Pool.enqueue`'s arguments (and `after_index`:
    positions of `earlier` items)."""
    if not isinstance(item, Mapping):
        raise errors.InvalidSpec(f"must be a mapping of enqueue's arguments, got {type(item).__name__}",
                                 index=index)
    fields = {k: v for k, v in item.items() if k not in SUBMIT_OPTIONS}
    holds = {k: item[k] for k in _HOLD_OPTIONS if k in item and item[k] is not None}
    return prepare(fields, item.get("coalesce", False), item.get("coalesce_key"), bind_roots, index, holds,
                   earlier)


#: The options of what a job waits for (`check_holds`).
_HOLD_OPTIONS = ("not_before", "after", "after_index")


class Submitter(Protocol):
    """What submitting needs of the pool it submits to (`Pool`): its settings, its store, who it acts as,
    and a job's row read back."""

    settings: Settings
    actor: str
    store: Store

    def get(self, job_id: str, coalesced: bool = False) -> Job: ...


def enqueue(pool: Submitter, spec_fields: Mapping[str, Any], coalesce: Any, coalesce_key: Any,
            holds: Mapping[str, Any] | None = None, fire: str = "") -> Job:
    """`Pool.enqueue`: one job, a batch of one. `holds` its not_before and after; `fire` a schedule's tick
    (jobpool/schedules.py: the script fires it once)."""
    job = prepare(spec_fields, coalesce, coalesce_key, pool.settings.bind_roots, holds=holds)
    return send(pool, [job], fire)[0]


def enqueue_many(pool: Submitter, specs: Iterable[Mapping[str, Any]],
                 batch_size: int = BATCH_SIZE) -> list[Job]:
    """`Pool.enqueue_many`: every item validated, then `batch_size` jobs per script call, in order
    (`batch_size` checked by the caller: 1 to MAX_BATCH_SIZE)."""
    if isinstance(specs, (str, bytes, Mapping)) or not isinstance(specs, Iterable):
        raise errors.InvalidArgument("specs must be an iterable of mappings (one per job)")
    roots = tuple(pool.settings.bind_roots)
    jobs = prepare_all(specs, roots)
    _check_dependencies_exist(pool, jobs)
    batches = [jobs[start:start + batch_size] for start in range(0, len(jobs), batch_size)]
    made: list[Job] = []
    replied: list[tuple[list[Prepared], Enqueued]] = []  # batches sent whose Jobs are not made yet
    failed: list[errors.JobpoolError] = []  # making them failed (a coalesced job's row unreadable)

    def catch_up() -> None:
        while replied:
            made.extend(_resolved(pool, jobs_made(*replied.pop(0))))
    call = _call_args(pool, batches[0]) if batches else None
    for k, batch in enumerate(batches):
        following: list[EnqueueCall] = []
        sent: list[bool] = []  # set once the batch is sent (see `_settled`)

        def meanwhile(k: int = k, following: list[EnqueueCall] = following,
                      sent: list[bool] = sent) -> None:
            # While the server runs batch k: the Jobs of the batch before, and the arguments of the next.
            # Batch k + 1 is still sent only once batch k succeeded, so what was enqueued is a prefix. A
            # failure here is raised once batch k's reply is read, so the connection stays in step and the
            # message can say what was enqueued.
            sent.append(True)
            try:
                catch_up()
            except errors.JobpoolError as exc:
                failed.append(exc)
                return
            if k + 1 < len(batches):
                following.append(_call_args(pool, batches[k + 1]))
        start, end = k * batch_size, min((k + 1) * batch_size, len(jobs))
        try:
            assert call is not None
            reply = _run(pool, call, meanwhile)
        except errors.JobpoolError as exc:
            raise _settled(pool, exc, batch, start, len(jobs), bool(sent)) from None
        replied.append((batch, reply))
        try:
            if failed:
                raise failed[0]
            # A promotion the script left undone; batch k stands either way.
            pool.store.finish_promotion(reply, pool.actor)
        except errors.JobpoolError as exc:
            raise counted(exc, end, len(jobs)) from None
        call = following[0] if following else None
    try:
        catch_up()
    except errors.JobpoolError as exc:
        raise counted(exc, len(jobs), len(jobs)) from None
    return made


def _settled(pool: Submitter, exc: errors.JobpoolError, batch: list[Prepared], start: int, total: int,
             sent: bool) -> errors.JobpoolError:
    """`exc`, raised by the script call of `batch` (the input's jobs from `start`), counted by what Redis
    holds. The script applies a batch whole or not at all. A refusal (a status reply: scripts/enqueue.lua
    checks everything before it writes) or a failure before the call was sent whole (on the thread's
    single-connection client `meanwhile` runs once it is sent, store/runner.py `_held_call`; on a pooled one
    before, so there `sent` is always true) wrote nothing. A `RedisUnavailable` after it was sent (a lost
    reply, a dropped connection, a timeout, `NotReplicated`) may have been applied: Redis is asked, in one
    round trip, whether any of the batch's rows exists. Every id is looked for, not only the first, because
    a job that coalesced into a queued job makes no row of its own: any row found means the batch was
    applied (the ids are new random ones), none means it was not, unless every job of it has a coalesce key
    (then it made no row either way). When Redis cannot be asked, or the rows are there but not acknowledged
    by the replicas asked for (`NotReplicated`: a failover may still lose them), the batch's ids are the
    error's `unknown`; so is a batch found after a lost reply when JOBPOOL_REDIS_WAIT_REPLICAS asks for
    replicas (the reply lost was the WAIT's, or came before it: nothing says the replicas have it)."""
    if not needs_lookup(exc, sent):
        return counted(exc, start, total)
    try:
        found: int | errors.JobpoolError = pool.store.rows_found(
            [p.id for p in batch], what="enqueue_many's look for its last batch")
    except errors.JobpoolError as why:
        found = why
    return settled_by(exc, batch, start, total, found, pool.settings.redis_wait_replicas)


def needs_lookup(exc: errors.JobpoolError, sent: bool) -> bool:
    """Whether a batch's failure `exc` may have been applied, so Redis must be asked (`_settled`)."""
    return sent and isinstance(exc, errors.RedisUnavailable)


def settled_by(exc: errors.JobpoolError, batch: list[Prepared], start: int, total: int,
               found: int | errors.JobpoolError, wait_replicas: int) -> errors.JobpoolError:
    """`_settled`'s verdict once Redis was asked how many of the batch's rows exist (`found`; the error met
    when it could not be asked): shared with the asyncio API (jobpool/aio.py)."""
    probe = next((p.id for p in batch if not p.coalesce_key), None)  # a job that makes a row if applied
    look = (f"if job {probe} exists (`jobpool show {probe}`)" if probe else
            "if any of its ids (the error's `unknown`) exists") + \
        f", the first {start + len(batch)} were enqueued, else the first {start}"
    if isinstance(found, errors.JobpoolError):
        return counted(exc, start, total, batch, f"Redis could not be asked ({found}). That batch was "
                        f"applied whole or not at all: {look}")
    if found and (isinstance(exc, errors.NotReplicated) or wait_replicas):
        # On the primary now, but a failover could still lose it: counting it would be a guess either way.
        return counted(exc, start, total, batch, "its jobs are on the primary but on too few replicas, so a "
                        f"failover could still lose them. Once the primary is settled: {look}")
    if found:
        return counted(exc, start + len(batch), total, lost=len(batch))
    if any(not p.coalesce_key for p in batch):
        return counted(exc, start, total)
    return counted(exc, start, total, batch, "every job of that batch has a coalesce key and none made a "
                    "row, so it was not applied or each of its jobs coalesced into a queued job; sent again, "
                    "they coalesce the same way while those stay queued")


def counted(exc: errors.JobpoolError, enqueued: int, total: int, unknown: Sequence[Prepared] = (),
             why: str = "", lost: int = 0) -> errors.JobpoolError:
    """`exc` with what stands in its message and attributes (`JobpoolError.enqueued`, `.unknown`): the same
    exception, so callers handle it as ever. `unknown` is the batch after the first `enqueued` jobs whose
    outcome could not be learned, and `why` says why; `lost` counts the last of the `enqueued` jobs, those
    of a batch found in Redis after its reply was lost."""
    exc.enqueued, exc.unknown = enqueued, tuple(p.id for p in unknown)
    said = f"the first {enqueued} of the {total} jobs were enqueued" if enqueued else ""
    if lost:
        said += f", the last {lost} by the call that failed (its jobs were found in Redis)"
    elif enqueued:
        said += " before it"
    if unknown:
        said = (f"{said or f'none of the {total} jobs were enqueued before it'}; whether the next "
                f"{len(unknown)} were is unknown: {why}")
    if said:
        exc.args = (f"{exc.args[0] if exc.args else exc} ({said})", *exc.args[1:])
    return exc


def _check_dependencies_exist(pool: Submitter, jobs: list[Prepared]) -> None:
    """Every job the items name in `after` exists, read before the first batch is sent (one EXISTS): the
    script checks each batch's again, but a later batch's refusal would come after the earlier ones were
    queued. Ids of this call's own items (`after_index`) are not looked for."""
    named = dependencies_named(jobs)
    if not named or pool.store.rows_found(list(named), what="the jobs waited for") == len(named):
        return
    for dep, i in sorted(named.items(), key=lambda kv: kv[1]):
        if not pool.store.rows_found([dep], what="a job waited for"):
            raise errors.InvalidSpec(f"it waits for job {dep}, which does not exist", index=i)


def dependencies_named(jobs: list[Prepared]) -> dict[str, int]:
    """The jobs the items name in `after`, each with the first item naming it; this call's own items
    (`after_index`) left out."""
    own = {p.id for p in jobs}
    return {dep: i for i, p in reversed(list(enumerate(jobs))) for dep in p.waits_for if dep not in own}


def prepare_all(specs: Iterable[Any], roots: Sequence[str]) -> list[Prepared]:
    """Every item of an `enqueue_many` call validated, in order; an item's `after_index` names the new ids of
    the items before it."""
    jobs: list[Prepared] = []
    for i, item in enumerate(specs):
        refers_back = isinstance(item, Mapping) and item.get("after_index") is not None
        jobs.append(prepare_item(item, roots, i, [p.id for p in jobs] if refers_back else ()))
    return jobs


def send(pool: Submitter, batch: list[Prepared], fire: str = "") -> list[Job]:
    """One enqueue script call for `batch`; its Jobs as the script left them, in order. A schedule's fire
    that made no job (its last still runs: overlap 'skip') returns none."""
    reply = _run(pool, _call_args(pool, batch, fire))
    if reply.why_stopped == "skipped":
        return []
    pool.store.finish_promotion(reply, pool.actor)
    return _resolved(pool, jobs_made(batch, reply))


def _call_args(pool: Submitter, batch: list[Prepared], fire: str = "") -> EnqueueCall:
    """The enqueue script's inputs for `batch` (scripts/enqueue.lua)."""
    return pool.store.enqueue_call(pool.actor, [p.script_args() for p in batch], fire)


def _run(pool: Submitter, call: EnqueueCall, meanwhile: Callable[[], None] | None = None) -> Enqueued:
    """The enqueue script, on this thread's single-connection client (`Store.enqueue`; its caller then
    finishes the promotion the script left undone, `Store.finish_promotion`)."""
    return pool.store.enqueue(call, meanwhile=meanwhile)


def jobs_made(batch: list[Prepared], reply: Enqueued) -> list[Job | str]:
    """The Jobs of `batch` as the enqueue script left them (`reply`), in order; a job that coalesced is the
    id of the queued job it coalesced into (`_resolved` reads those)."""
    now = reply.now
    jobs: list[Job | str] = []
    for p, (coalesced, job_id, seq, state) in zip(batch, reply.jobs(), strict=True):
        if coalesced:
            jobs.append(job_id)
            continue
        running = state == JobState.RUNNING.value
        # Built from what the script set and the spec in hand: reading the row back would cost a third
        # of an enqueue (the spec re-parsed and re-validated).
        jobs.append(_new_job({"id": job_id, "state": JobState(state), "spec": p.spec, "seq": int(seq),
                              "attempt": 1 if running else 0, "created_at": now,
                              "coalesce_key": p.coalesce_key, "promoted_at": now if running else None}))
    return jobs


def _resolved(pool: Submitter, made: list[Job | str]) -> list[Job]:
    """`made` with each coalesced job's id replaced by that queued job, read back in one round trip."""
    twin_ids = sorted({j for j in made if isinstance(j, str)})
    if not twin_ids:
        return made  # type: ignore[return-value]  # no str left in it
    found = _twins(pool, twin_ids)
    return [found[j] if isinstance(j, str) else j for j in made]


def _twins(pool: Submitter, ids: list[str]) -> dict[str, Job]:
    """The queued jobs that new jobs coalesced into, read back (one round trip), as `coalesced`."""
    if len(ids) == 1:
        return {ids[0]: pool.get(ids[0], coalesced=True)}
    return twins_from_rows(ids, pool.store.rows(ids))


def twins_from_rows(ids: list[str], rows: list[Any]) -> dict[str, Job]:
    """The queued jobs that new jobs coalesced into, from their rows as read (`Store.rows`)."""
    out = {}
    for job_id, row in zip(ids, rows, strict=True):
        if isinstance(row, Exception):
            raise errors.CorruptRow(f"job {job_id}: its row is unreadable ({row})", job_id)
        if not row:
            raise errors.NotFound(errors.no_job(job_id))
        out[job_id] = Job.from_row(row, coalesced=True, job_id=job_id)
    return out
