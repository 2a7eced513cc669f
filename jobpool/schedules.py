"""Schedules: a pool makes a job by itself at each tick of a cron expression or of a fixed interval, fired by
its supervisors (docs/architecture.md, "Schedules").

A schedule is three entries under its name (store/keys.py): its definition (`schedules`: `Definition`, JSON),
its watermark (`schedule_ticks`: 'tick|job|at', the last tick handled, the last job a tick made and when)
and when it is next due (`schedule_next`, the sorted set the supervisors read). Adding or replacing,
removing, pausing and resuming are one script each (scripts/schedule_*.lua).

Ticks. A cron schedule's ticks are the wall-clock times its expression names in its time zone (croniter; a
sixth field is seconds, croniter's order), each taken as the instant it is there. Daylight saving time moves
the clock, and a wall-clock time is a tick at most once: one that occurs twice (the hour repeated in autumn)
is the first of the two, and ones that do not occur (the hour skipped in spring) are one tick, at the end of
the gap. A schedule that must tick at even intervals through those hours uses `every` or UTC (the default).
An `every` schedule's ticks are the multiples of its interval since the Unix epoch: `every=3600` ticks on the
hour, whenever it was added and whichever supervisor looks, so its ticks never drift.

Firing. Each supervisor's timer thread (jobpool/supervisor/timers.py) runs `fire_due` a few times a second:
the schedules due by `schedule_next` are each read with the server's time in one step, the tick to fire is
computed from the definition and the watermark (`step`), and the job is enqueued by the enqueue script with
the fire's guard (scripts/enqueue.lua, ARGV[2]): it makes a job only for a tick after the watermark and
moves the watermark to that tick in the same step. So each tick makes one job however many supervisors try
it at once, and a supervisor killed anywhere in this leaves either nothing done (the next one does it) or
the tick done (the next one finds it fired). A tick is computed from the server's time read with the
watermark, never from a supervisor's own clock.

Misfire: after downtime (every supervisor gone, Redis away, the pool's supervisors behind), 'once' (the
default) fires the latest tick due, once, for all the ticks missed; 'skip' fires nothing for them: the latest
is recorded as skipped (scripts/schedule_skip.lua) and the next tick fires. Overlap: 'skip' (the default)
makes no job while the schedule's last job still waits, is queued, runs or is paused (the tick is recorded
as skipped by the enqueue script); 'queue' makes one every tick. A job the pool refuses at a tick (it needs
more slots than the pool has, or a name no limit covers) is recorded as skipped, with the reason.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import math
import os
import zoneinfo
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from croniter import croniter

from . import errors
from .config import Settings
from .contract import LIMIT_NAME_MAX_CHARS, MAX_TIME_SECS
from .models import Job
from .spec import LIMIT_NAME, JobSpec, build_spec
from .store.calls import Store
from .store.schedulereads import ScheduleSnapshot
from .submit import SUBMIT_OPTIONS, Prepared, Submitter, send

log = logging.getLogger("jobpool.schedules")

MISFIRES = ("once", "skip")
OVERLAPS = ("skip", "queue")
MAX_CRON_CHARS = 256
MAX_TZ_CHARS = 64
#: Schedules fired per look: a look is bounded, the rest are due at the next.
FIRE_BATCH = 64
#: How long a schedule whose definition cannot be read or whose ticks cannot be computed waits before it is
#: looked at again (each look logs it).
BROKEN_RETRY_MS = 60_000
#: Wall-clock times croniter is asked for in one search: one past the first is a time the clock skipped, whose
#: tick (the skip's end) is not after where the search started; a search that runs out says the expression
#: is broken.
MAX_CANDIDATES = 10_000
_UTC = datetime.timezone.utc
#: What the definition's JSON starts with: the scripts pause and resume it by this prefix
#: (scripts/schedule_pause.lua), so `paused` is its first key.
_PAUSED_PREFIX = {False: '{"paused":false,', True: '{"paused":true,'}


def _ms(moment: datetime.datetime) -> int:
    return round(moment.timestamp() * 1000)


def _at(ms: int, zone: datetime.tzinfo) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, zone)


def _offset_ms(moment: datetime.datetime) -> int:
    offset = moment.utcoffset()
    return 0 if offset is None else int(offset.total_seconds() * 1000)


@dataclass(frozen=True)
class Timing:
    """When a schedule ticks: a cron expression in time zone `tz`, or every `every_ms` since the epoch."""

    cron: str | None = None
    every_ms: int | None = None
    tz: str = "UTC"

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.tz)

    def next_after(self, ms: int) -> int:
        """The first tick after `ms` (ms since the epoch)."""
        if self.every_ms is not None:
            return (ms // self.every_ms + 1) * self.every_ms
        assert self.cron is not None
        zone = self.zone
        start = _wall(ms, zone)
        search = _croniter(self.cron, start)
        for _ in range(MAX_CANDIDATES):
            tick = _instant(search.get_next(datetime.datetime), zone)
            if tick > ms:
                return tick
        raise ValueError(f"no tick after {_at(ms, _UTC).isoformat()} within {MAX_CANDIDATES} times")

    def latest_at_or_before(self, ms: int) -> int:
        """The last tick at or before `ms`."""
        if self.every_ms is not None:
            return ms // self.every_ms * self.every_ms
        assert self.cron is not None
        zone = self.zone
        # croniter's previous time is strictly before its start: a millisecond on, `ms` itself is a candidate.
        search = _croniter(self.cron, _wall(ms, zone, 1))
        for _ in range(MAX_CANDIDATES):
            tick = _instant(search.get_prev(datetime.datetime), zone)
            if tick <= ms:
                return tick
        raise ValueError(f"no tick before {_at(ms, _UTC).isoformat()} within {MAX_CANDIDATES} times")

    def describe(self) -> str:
        if self.every_ms is not None:
            return f"every {self.every_ms / 1000:g}s"
        return f"cron {self.cron}" + ("" if self.tz == "UTC" else f" ({self.tz})")


def _switch(zone: datetime.tzinfo, low: int, high: int) -> int:
    """The first instant (ms) in (`low`, `high`] at the UTC offset `high` has (the clock changed between)."""
    target = _offset_ms(_at(high, zone))
    while high - low > 1:
        mid = (low + high) // 2
        if _offset_ms(_at(mid, zone)) == target:
            high = mid
        else:
            low = mid
    return high


def _croniter(expression: str, start: datetime.datetime) -> croniter:
    """croniter, imported where a cron expression is first read: importing it runs `file -b` on the Python
    binary (its 32-bit check, platform.architecture), a child process no worker, CLI command or import of
    jobpool should start (a worker's children are its horses: jobpool/workers/horses.py)."""
    from croniter import croniter

    return croniter(expression, start)


def _wall(ms: int, zone: datetime.tzinfo, plus_ms: int = 0) -> datetime.datetime:
    """The wall-clock time (naive) the search for ticks starts from at instant `ms` (+ `plus_ms`). An instant
    in the second pass of a repeated hour starts from the end of that hour: every wall-clock time before it
    was a tick (if at all) on the first pass."""
    local = _at(ms, zone)
    repeat = _offset_ms(local.replace(fold=0)) - _offset_ms(local)
    if local.fold and repeat > 0:
        end = _switch(zone, ms - repeat, ms) + repeat  # the repeated hour's end, as an instant
        # Just before its wall-clock time: the search is strictly after (or, with plus_ms, before) it.
        return _at(end, zone).replace(tzinfo=None) - datetime.timedelta(milliseconds=1 - plus_ms)
    return (local + datetime.timedelta(milliseconds=plus_ms)).replace(tzinfo=None)


def _instant(wall: datetime.datetime, zone: datetime.tzinfo) -> int:
    """The instant (ms) of wall-clock time `wall` in `zone`: its first occurrence, or for a time the clock
    skips, the end of the gap."""
    first = wall.replace(tzinfo=zone)
    ms = _ms(first)
    if _at(ms, zone).replace(tzinfo=None) == wall:
        return ms
    # In a gap: before it the clock read `wall` at the earlier offset's instant, after it at the later's.
    later = _ms(wall.replace(tzinfo=zone, fold=1))
    low, high = min(ms, later), max(ms, later)
    return _switch(zone, low, high)


@dataclass(frozen=True)
class Definition:
    """A schedule as stored: when it ticks, what a missed tick and an overlap do, whether it is paused, when
    it was defined (ms, Redis time) and the job each tick makes."""

    timing: Timing
    misfire: str
    overlap: str
    paused: bool
    created_at: int
    job: JobSpec

    def to_json(self) -> str:
        """Its JSON, `paused` first (the scripts flip it by prefix); the job's spec as a string, its canonical
        JSON, so no script's JSON codec ever rewrites it."""
        body = json.dumps({"cron": self.timing.cron, "every_ms": self.timing.every_ms, "tz": self.timing.tz,
                           "misfire": self.misfire, "overlap": self.overlap, "created_at": self.created_at,
                           "job": self.job.to_json()}, separators=(",", ":"), sort_keys=True)
        return _PAUSED_PREFIX[self.paused] + body[1:]

    @classmethod
    def from_json(cls, text: str) -> Definition:
        """A stored definition read back; `CorruptRow` for one that does not read."""
        try:
            d = json.loads(text)
            cron, every, tz = d["cron"], d["every_ms"], d["tz"]
            timing = Timing(cron, every, tz)
            if (cron is None) == (every is None) or not isinstance(tz, str) or d["misfire"] not in MISFIRES \
                    or d["overlap"] not in OVERLAPS or not isinstance(d["paused"], bool) \
                    or not isinstance(d["created_at"], int) or not isinstance(d["job"], str):
                raise ValueError("a field is missing or of the wrong kind")
            return cls(timing, d["misfire"], d["overlap"], d["paused"], d["created_at"],
                       JobSpec.from_json(d["job"]))
        except (ValueError, TypeError, KeyError, errors.InvalidSpec) as exc:
            raise errors.CorruptRow(f"a schedule's definition does not read ({exc})") from None


@dataclass(frozen=True)
class Schedule:
    """A schedule as `Pool.schedules()` reads it: its definition, the last tick that made a job (ms, None for
    none yet) and that job's id, and the next tick it fires (None while paused). Times are ms since the
    epoch, on Redis's clock, like a `Job`'s."""

    name: str
    cron: str | None
    every: float | None
    tz: str
    misfire: str
    overlap: str
    paused: bool
    created_at: int
    spec: JobSpec
    last_fire: int | None
    last_job: str | None
    next_fire: int | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (the CLI's --json): the job's env values redacted, as `Job.to_dict` does."""
        spec = json.loads(self.spec.to_json())
        spec["env"] = {k: "<redacted>" for k in self.spec.env}  # values may be secrets
        return {"name": self.name, "cron": self.cron, "every": self.every, "tz": self.tz,
                "misfire": self.misfire, "overlap": self.overlap, "paused": self.paused,
                "created_at": self.created_at, "last_fire": self.last_fire, "last_job": self.last_job,
                "next_fire": self.next_fire, "spec": spec}


# ---- defining ---------------------------------------------------------------------------------------------

def check_name(name: Any) -> str:
    if not isinstance(name, str) or not LIMIT_NAME.fullmatch(name):
        raise errors.InvalidArgument(
            f"a schedule's name is 1-{LIMIT_NAME_MAX_CHARS} of letters, digits and '_ . : / @ -', "
            f"got {name!r}")
    return name


def check_timing(cron: Any, every: Any, tz: Any) -> Timing:
    """`cron` or `every` (seconds), and `tz`, checked: `InvalidArgument` naming what is wrong."""
    if (cron is None) == (every is None):
        raise errors.InvalidArgument("a schedule takes cron=EXPRESSION or every=SECONDS (one of them)")
    if not isinstance(tz, str) or not tz or len(tz) > MAX_TZ_CHARS:
        raise errors.InvalidArgument(f"tz must be a time zone name such as 'UTC' or 'Europe/Paris', "
                                     f"got {tz!r}")
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise errors.InvalidArgument(f"tz: no time zone {tz!r} (names as in the IANA database: "
                                     "'UTC', 'Europe/Paris', 'America/New_York')") from None
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not math.isfinite(every) \
                or not 1 <= every <= MAX_TIME_SECS:
            raise errors.InvalidArgument(f"every must be a number of seconds from 1 to {MAX_TIME_SECS}, "
                                         f"got {every!r}")
        if tz != "UTC":
            raise errors.InvalidArgument("tz applies to cron schedules: an `every` schedule ticks on "
                                         "multiples of its interval since the epoch, whatever the zone")
        return Timing(None, round(every * 1000), tz)
    if not isinstance(cron, str) or not cron.strip() or len(cron) > MAX_CRON_CHARS:
        raise errors.InvalidArgument(f"cron must be a cron expression of at most {MAX_CRON_CHARS} "
                                     f"characters, got {cron!r}")
    expression = " ".join(cron.split())
    try:
        _croniter(expression, datetime.datetime(2000, 1, 1))
    except (ValueError, KeyError, TypeError) as exc:
        raise errors.InvalidArgument(f"cron {cron!r} does not parse: {exc}") from None
    return Timing(expression, None, tz)


def define(fields: Mapping[str, Any], cron: Any, every: Any, tz: Any, misfire: Any, overlap: Any,
           bind_roots: Sequence[str], now_ms: int) -> Definition:
    """A new schedule's definition from `add_schedule`'s arguments, every one checked as a job's are
    (`InvalidSpec` for the job, `InvalidArgument` for the rest); nothing is written."""
    timing = check_timing(cron, every, tz)
    if misfire not in MISFIRES:
        raise errors.InvalidArgument(f"misfire must be one of {', '.join(MISFIRES)}, got {misfire!r}")
    if overlap not in OVERLAPS:
        raise errors.InvalidArgument(f"overlap must be one of {', '.join(OVERLAPS)}, got {overlap!r}")
    refused = sorted(k for k in fields if k in SUBMIT_OPTIONS)
    if refused:
        raise errors.InvalidArgument(f"a schedule's jobs take no {', '.join(refused)}: each tick makes one "
                                     "new job, queued at once (overlap says what a tick does while one runs)")
    spec = build_spec(fields, bind_roots)
    try:
        timing.next_after(now_ms)
    except ValueError as exc:
        raise errors.InvalidArgument(f"{timing.describe()} never ticks after now ({exc})") from None
    return Definition(timing, str(misfire), str(overlap), False, now_ms, spec)


def add(pool: Submitter, name: str, fields: Mapping[str, Any], cron: Any, every: Any, tz: Any, misfire: Any,
        overlap: Any, replace: bool) -> Schedule:
    """`Pool.add_schedule`: checked, then written by one script (scripts/schedule_set.lua)."""
    check_name(name)
    if not isinstance(replace, bool):
        raise errors.InvalidArgument(f"replace must be True or False, got {replace!r}")
    now = pool.store.now_ms()
    definition = define(fields, cron, every, tz, misfire, overlap, tuple(pool.settings.bind_roots), now)
    try:
        pool.store.schedule_set(name, definition.to_json(), now, definition.timing.next_after(now), replace,
                                pool.actor)
    except errors.AlreadyExists:
        raise errors.AlreadyExists(f"a schedule {name} exists already (replace=True replaces it)") from None
    return get(pool.store, name)


def _not_found(name: str) -> errors.NotFound:
    return errors.NotFound(f"no schedule {name} in this pool (jobpool schedule lists them)")


def remove(store: Store, name: str, actor: str) -> None:
    """`Pool.remove_schedule`."""
    check_name(name)
    try:
        store.schedule_remove(name, actor)
    except errors.NotFound:
        raise _not_found(name) from None


def set_paused(store: Store, name: str, paused: bool, actor: str) -> Schedule:
    """`Pool.pause_schedule` and `resume_schedule`; a resumed schedule's next tick is the first after now."""
    check_name(name)
    try:
        store.schedule_pause(name, paused, actor)
    except errors.NotFound:
        raise _not_found(name) from None
    return get(store, name)


# ---- reading ----------------------------------------------------------------------------------------------

def _watermark(record: str | None) -> tuple[str, str]:
    """A watermark record's tick ('' for none) and last job ('' for none)."""
    tick, _, rest = (record or "").partition("|")
    return (tick if tick.isascii() and tick.isdigit() else ""), rest.partition("|")[0]


def list_schedules(store: Store) -> list[Schedule]:
    """Every schedule of the pool, by name; one whose definition does not read is logged and left out."""
    table = store.schedule_table()
    found: list[tuple[str, Definition, str, str]] = []
    for name in sorted(table.definitions):
        try:
            definition = Definition.from_json(table.definitions[name])
        except errors.CorruptRow as exc:
            log.warning("pool %s: schedule %s: %s", store.settings.pool, name, exc)
            continue
        found.append((name, definition, *_watermark(table.ticks.get(name))))
    ticks = store.fired_ticks([job for *_, job in found if job])
    fired = dict(zip([job for *_, job in found if job], ticks, strict=True))
    out = []
    for name, d, mark, job in found:
        tick = fired.get(job) if job else None
        nxt = None
        if not d.paused:
            try:
                nxt = d.timing.next_after(int(mark) if mark else d.created_at)
            except ValueError:
                nxt = None
        every_ms = d.timing.every_ms
        every = None if every_ms is None else every_ms // 1000 if every_ms % 1000 == 0 else every_ms / 1000
        last = int(tick) if isinstance(tick, str) and tick.isascii() and tick.isdigit() else None
        out.append(Schedule(name, d.timing.cron, every, d.timing.tz, d.misfire, d.overlap, d.paused,
                            d.created_at, d.job, last, job or None, nxt))
    return out


def get(store: Store, name: str) -> Schedule:
    """Schedule `name` as `list_schedules` reads it; `NotFound` for none."""
    for schedule in list_schedules(store):
        if schedule.name == name:
            return schedule
    raise _not_found(name)


# ---- firing -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """What is due of a schedule at a moment: 'fire' `tick` (a job), 'skip' it (record it, no job), or 'wait'
    (nothing is due: only its next tick is set); then `next` is its next tick."""

    kind: str
    tick: int | None
    next: int


def step(timing: Timing, misfire: str, watermark: int, now_ms: int) -> Step:
    """What is due at `now_ms` of a schedule whose ticks up to `watermark` were handled."""
    first = timing.next_after(watermark)
    if first > now_ms:
        return Step("wait", None, first)
    latest = max(first, timing.latest_at_or_before(now_ms))
    following = timing.next_after(latest)
    if misfire == "skip" and latest != first:
        return Step("skip", latest, following)
    return Step("fire", latest, following)


@dataclass
class _Firer:
    """The pool a fire enqueues through (jobpool/submit.py `Submitter`), made of a supervisor's store."""

    settings: Settings
    actor: str
    store: Store

    def get(self, job_id: str, coalesced: bool = False) -> Job:
        return self.store.job(job_id, coalesced)


def fire_due(store: Store, actor: str) -> int:
    """The supervisors' timer job: every schedule due now fires (or skips) its tick; returns the jobs made.
    Run by every supervisor at once: the scripts make each tick's job once (`fire`)."""
    made = 0
    for name in store.due_schedules(store.now_ms(), FIRE_BATCH):
        try:
            made += fire(store, name, actor)
        except errors.RedisUnavailable:
            raise  # the round ends; the timer logs it and looks again
        except errors.JobpoolError as exc:  # this schedule's trouble, not the others'
            log.warning("pool %s: schedule %s: %s", store.settings.pool, name, exc)
    return made


def fire(store: Store, name: str, actor: str) -> int:
    """One look at schedule `name`: its due tick fired or skipped, or its next tick set; returns 1 when a job
    was made. Whatever another supervisor did meanwhile is refused by the scripts and left as it did it."""
    snap = store.schedule_snapshot(name)
    if snap.definition is None:
        return 0  # removed since `schedule_next` was read
    mark, _ = _watermark(snap.ticks)
    try:
        definition = Definition.from_json(snap.definition)
        if definition.paused:
            return 0  # paused since it was read (a pause takes it out of `schedule_next`)
        due = step(definition.timing, definition.misfire, int(mark) if mark else definition.created_at,
                   snap.now_ms)
    except (errors.CorruptRow, ValueError) as exc:
        log.error("pool %s: schedule %s cannot fire (%s); looked at again in %d s", store.settings.pool, name,
                  exc, BROKEN_RETRY_MS // 1000)
        return _settle(store, name, mark, None, snap.now_ms + BROKEN_RETRY_MS, "", actor)
    if due.kind != "fire":
        why = "ticks were missed (misfire 'skip')" if due.kind == "skip" else ""
        return _settle(store, name, mark, due.tick, due.next, why, actor)
    return _enqueue(store, name, definition, snap, mark, due, actor)


def _enqueue(store: Store, name: str, definition: Definition, snap: ScheduleSnapshot, mark: str, due: Step,
             actor: str) -> int:
    job = Prepared(os.urandom(16).hex(), definition.job, "")
    try:
        made = send(_Firer(store.settings, actor, store), [job], f"{name}|{due.tick}|{due.next}")
    except (errors.AlreadyExists, errors.NotFound, errors.InvalidState):
        return 0  # fired by another supervisor, removed, or paused meanwhile
    except errors.InvalidSpec as exc:  # the pool cannot take the job as it is now: the tick is skipped
        log.warning("pool %s: schedule %s: tick %s skipped: %s", store.settings.pool, name,
                    _at(due.tick or 0, _UTC).isoformat(), exc)
        return _settle(store, name, mark, due.tick, due.next, f"the pool refused its job: {exc}", actor)
    if made:
        log.debug("pool %s: schedule %s fired tick %s: job %s", store.settings.pool, name,
                 _at(due.tick or 0, _UTC).isoformat(), made[0].id)
    return len(made)


def _settle(store: Store, name: str, mark: str, tick: int | None, next_ms: int, why: str, actor: str) -> int:
    """A look that makes no job: `tick` recorded as skipped (None: none) and the next tick set, unless another
    supervisor moved the watermark first."""
    # AlreadyExists, NotFound, InvalidState: handled by another supervisor, removed, or paused meanwhile.
    with contextlib.suppress(errors.AlreadyExists, errors.NotFound, errors.InvalidState):
        store.schedule_skip(name, mark, tick, next_ms, why, actor)
    return 0
