"""Schedules (jobpool/schedules.py, scripts/schedule_*.lua, the enqueue script's fire guard).

The ticks of a cron expression in a time zone are checked against ticks found by hand, instant by instant,
around real clock changes; the scripts through `Pool` and `fire_due` on both backends. A tick due "now" is
made due by moving a schedule's watermark back (`backdate`), so no test waits for the clock.
"""

from __future__ import annotations

import datetime
import itertools
import os
import subprocess
import sys
from typing import Any, cast
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from jobpool import errors
from jobpool.api import Pool
from jobpool.models import Job, JobState
from jobpool.schedules import (
    BROKEN_RETRY_MS,
    Definition,
    Step,
    Timing,
    check_timing,
    fire,
    fire_due,
    step,
)
from jobpool.spec import build_spec
from jobpool.submit import Prepared, send
from tests.support.polling import eventually
from tests.support.pool_helpers import Backend, row

UTC = datetime.timezone.utc
SUP = "supervisor@test"


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0,
       tz: str = "UTC") -> int:
    moment = datetime.datetime(year, month, day, hour, minute, second, tzinfo=ZoneInfo(tz))
    return round(moment.timestamp() * 1000)


# ---- ticks -------------------------------------------------------------------------------------------------

def test_every_ticks_on_multiples_since_the_epoch() -> None:
    t = Timing(every_ms=600_000)
    at = ms(2026, 5, 1, 10, 7, 30)
    assert t.next_after(at) == ms(2026, 5, 1, 10, 10)
    assert t.latest_at_or_before(at) == ms(2026, 5, 1, 10, 0)
    assert t.next_after(ms(2026, 5, 1, 10, 10)) == ms(2026, 5, 1, 10, 20)  # strictly after
    assert t.latest_at_or_before(ms(2026, 5, 1, 10, 10)) == ms(2026, 5, 1, 10, 10)  # at or before


def test_cron_in_utc() -> None:
    t = Timing(cron="*/5 * * * *")
    at = ms(2026, 5, 1, 10, 7, 30)
    assert t.next_after(at) == ms(2026, 5, 1, 10, 10)
    assert t.latest_at_or_before(at) == ms(2026, 5, 1, 10, 5)
    assert t.latest_at_or_before(ms(2026, 5, 1, 10, 5)) == ms(2026, 5, 1, 10, 5)
    assert Timing(cron="* * * * * */20").next_after(at) == ms(2026, 5, 1, 10, 7, 40)  # a 6th field: seconds


def hand_ticks(expr: str, tz: str, start: int, end: int) -> list[int]:
    """The ticks in [start, end], found minute by minute: each instant whose wall-clock time matches and is
    that time's first occurrence, and each instant where the clock jumped forward over a matching time."""
    zone, minute, out = ZoneInfo(tz), 60_000, []
    for t in range(start - start % minute, end + 1, minute):
        local = datetime.datetime.fromtimestamp(t / 1000, zone)
        wall = local.replace(tzinfo=None)
        before = datetime.datetime.fromtimestamp((t - minute) / 1000, zone)
        jump = cast("datetime.timedelta", local.utcoffset()) - cast("datetime.timedelta", before.utcoffset())
        second_pass = local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()
        skipped = [wall - jump + datetime.timedelta(minutes=k)
                   for k in range(int(jump.total_seconds() // 60))]
        if (not second_pass and croniter.match(expr, wall)) or any(croniter.match(expr, w) for w in skipped):
            out.append(t)
    return out


CLOCK_CHANGES = [
    ("Europe/Berlin", (2026, 3, 29)), ("Europe/Berlin", (2026, 10, 25)),
    ("America/New_York", (2026, 3, 8)), ("America/New_York", (2026, 11, 1)),
    ("Australia/Lord_Howe", (2026, 4, 5)), ("Australia/Lord_Howe", (2026, 10, 4)),  # half-hour changes
]
EXPRESSIONS = ["30 2 * * *", "*/15 * * * *", "45 1 * * *", "15,45 1-3 * * *"]


@pytest.mark.parametrize(("tz", "day"), CLOCK_CHANGES, ids=[f"{z}-{d[1]}" for z, d in CLOCK_CHANGES])
@pytest.mark.parametrize("expr", EXPRESSIONS)
def test_cron_ticks_across_a_clock_change_are_those_counted_by_hand(
        tz: str, day: tuple[int, int, int], expr: str) -> None:
    start, end = ms(*day, tz=tz) - 43_200_000, ms(*day, tz=tz) + 129_600_000  # the day, and 12 h each side
    ticks = hand_ticks(expr, tz, start, end)
    assert len(ticks) >= 2
    t = Timing(cron=expr, tz=tz)
    for prev, tick in itertools.pairwise(ticks):
        for probe in (prev, prev + 1, (prev + tick) // 2, tick - 1):
            assert t.next_after(probe) == tick, datetime.datetime.fromtimestamp(probe / 1000, UTC)
        for probe in (prev, (prev + tick) // 2, tick - 1):
            assert t.latest_at_or_before(probe) == prev, datetime.datetime.fromtimestamp(probe / 1000, UTC)
    assert t.latest_at_or_before(ticks[-1]) == ticks[-1]


def test_a_wall_clock_time_fires_once_in_autumn_and_at_the_gap_s_end_in_spring() -> None:
    berlin = Timing(cron="30 2 * * *", tz="Europe/Berlin")
    # 25 Oct 2026: 02:30 happens twice (CEST, then CET): the first only.
    first = ms(2026, 10, 25, 0, 30)  # 02:30+02:00
    assert berlin.next_after(ms(2026, 10, 24, 12, 0)) == first
    assert berlin.next_after(first) == ms(2026, 10, 26, 1, 30)  # 02:30+01:00 the next day
    # 29 Mar 2026: 02:30 never happens: the tick is at 03:00+02:00, the gap's end.
    assert berlin.next_after(ms(2026, 3, 28, 12, 0)) == ms(2026, 3, 29, 1, 0)
    assert berlin.next_after(ms(2026, 3, 29, 1, 0)) == ms(2026, 3, 30, 0, 30)


def test_step_waits_fires_the_latest_once_or_skips() -> None:
    t = Timing(every_ms=1000)
    assert step(t, "once", 10_500, 10_900) == Step("wait", None, 11_000)
    assert step(t, "once", 10_500, 11_000) == Step("fire", 11_000, 12_000)
    assert step(t, "skip", 10_500, 11_400) == Step("fire", 11_000, 12_000)  # only one tick was due
    assert step(t, "once", 10_500, 15_400) == Step("fire", 15_000, 16_000)  # four missed: the latest, once
    assert step(t, "skip", 10_500, 15_400) == Step("skip", 15_000, 16_000)  # missed: none, the next fires


def test_a_definition_reads_back_and_starts_with_its_pause() -> None:
    d = check_timing("0 3 * * *", None, "Europe/Paris")
    assert d == Timing("0 3 * * *", None, "Europe/Paris")
    assert check_timing(None, 90, "UTC") == Timing(None, 90_000, "UTC")
    assert check_timing("0  3 *  * *", None, "UTC").cron == "0 3 * * *"


# ---- the scripts ---------------------------------------------------------------------------------------

def add(pool: Pool, name: str = "s", **kw: Any) -> None:
    timing = {} if "cron" in kw else {"every": 1}
    pool.add_schedule(name, **{**timing, "image": "busybox", "command": ["true"], **kw})


def ticks_record(pool: Pool, name: str = "s") -> list[str]:
    return str(pool.store.client.hget(pool.keys.schedule_ticks, name)).split("|")


def backdate(pool: Pool, name: str = "s", secs: float = 1.0) -> int:
    """Move schedule `name`'s watermark `secs` back from now (its last job kept), due now; returns now."""
    now = pool.now_ms()
    _, job, at = ticks_record(pool, name)
    pool.store.client.hset(pool.keys.schedule_ticks, name, f"{now - round(secs * 1000)}|{job}|{at}")
    pool.store.client.zadd(pool.keys.schedule_next, {name: 0})
    return now


def early_in_a_second(pool: Pool) -> None:
    """Wait until the server's clock is early in a second: the few round trips a test makes next then see the
    same second, and so the same due tick of an every-second schedule (a second turning between two fires
    makes the next tick due, a job the test does not expect)."""
    eventually(lambda: pool.now_ms() % 1000 < 200, timeout=5, interval=0.02, message="early in a second")


def latest_due(tick: int | None, before: int, after: int) -> bool:
    """Whether `tick` is the latest tick of an every-second schedule due at the fire's look: the fire reads
    the clock once, between `before` and `after` (ms), and a second may turn in between."""
    return tick is not None and tick % 1000 == 0 and before // 1000 * 1000 <= tick <= after // 1000 * 1000


def fire_tick(pool: Pool, tick: int, name: str = "s") -> list[Job]:
    """What a supervisor's fire of `tick` of `name` sends (scripts/enqueue.lua's guard), whatever the time:
    a later tick without waiting for it."""
    spec = next(s.spec for s in pool.schedules() if s.name == name)
    return send(pool, [Prepared(os.urandom(16).hex(), spec, "")], f"{name}|{tick}|{tick + 1000}")


def made(pool: Pool, name: str = "s") -> list[Job]:
    return sorted((j for j in pool.list(limit=1000) if j.schedule == name), key=lambda j: j.tick or 0)


def next_of(pool: Pool, name: str = "s") -> float | None:
    return pool.store.client.zscore(pool.keys.schedule_next, name)


def test_add_lists_it_and_refuses_the_same_name_again(backend: Backend) -> None:
    pool = backend.pool()
    before = pool.now_ms()
    pool.add_schedule("nightly", cron="30 2 * * *", tz="Europe/Berlin", image="busybox", command=["true"],
                      env={"TOKEN": "secret"}, priority=5, timeout=60, retries=2)
    [s] = pool.schedules()
    assert (s.name, s.cron, s.every, s.tz, s.misfire, s.overlap, s.paused) == (
        "nightly", "30 2 * * *", None, "Europe/Berlin", "once", "skip", False)
    assert s.spec.priority == 5 and s.spec.timeout == 60 and s.spec.retries == 2
    assert s.last_fire is None and s.last_job is None and s.created_at >= before
    assert s.next_fire == Timing("30 2 * * *", None, "Europe/Berlin").next_after(s.created_at)
    assert next_of(pool, "nightly") == s.next_fire
    assert s.to_dict()["spec"]["env"] == {"TOKEN": "<redacted>"}
    snap = backend.keyspace()
    with pytest.raises(errors.AlreadyExists, match="replace=True"):
        add(pool, "nightly")
    assert backend.keyspace() == snap


def test_replace_keeps_the_watermark_the_last_job_and_the_pause(backend: Backend) -> None:
    pool = backend.pool()
    add(pool, overlap="queue")
    backdate(pool)
    assert fire_due(pool.store, SUP) == 1
    mark, job, at = ticks_record(pool)
    pool.pause_schedule("s")
    pool.add_schedule("s", replace=True, every=60, image="busybox", command=["echo", "new"])
    [s] = pool.schedules()
    assert s.paused and s.every == 60 and s.spec.command == ("echo", "new") and s.next_fire is None
    assert next_of(pool) is None  # paused: nothing fires it
    new_mark, new_job, new_at = ticks_record(pool)
    assert (new_job, new_at) == (job, at) and int(new_mark) >= int(mark)
    assert s.last_job == job


@pytest.mark.parametrize(("kw", "error", "match"), [
    ({"cron": "61 * * * *"}, errors.InvalidArgument, "does not parse"),
    ({"cron": "* * * *"}, errors.InvalidArgument, "does not parse"),
    ({"cron": "0 0 30 2 *"}, errors.InvalidArgument, "never ticks"),
    ({"cron": "0 3 * * *", "tz": "Mars/Olympus"}, errors.InvalidArgument, "no time zone"),
    ({"cron": "0 3 * * *", "tz": "../../etc/passwd"}, errors.InvalidArgument, "no time zone"),
    ({"every": 0.5}, errors.InvalidArgument, "every must be"),
    ({"every": True}, errors.InvalidArgument, "every must be"),
    ({"every": 60, "tz": "Europe/Paris"}, errors.InvalidArgument, "tz applies to cron"),
    ({"every": 60, "cron": "* * * * *"}, errors.InvalidArgument, "one of them"),
    ({"cron": None, "every": None}, errors.InvalidArgument, "one of them"),
    ({"every": None}, errors.InvalidArgument, "one of them"),
    ({"misfire": "twice"}, errors.InvalidArgument, "misfire"),
    ({"overlap": "maybe"}, errors.InvalidArgument, "overlap"),
    ({"after": ["x"]}, errors.InvalidArgument, "take no after"),
    ({"not_before": 0}, errors.InvalidArgument, "take no not_before"),
    ({"coalesce": True}, errors.InvalidArgument, "take no coalesce"),
    ({"replace": "yes"}, errors.InvalidArgument, "replace"),
    ({"image": ""}, errors.InvalidSpec, "image"),
    ({"privileged": True}, errors.InvalidSpec, "unknown spec field"),
    ({"timeout": 0}, errors.InvalidSpec, "timeout"),
])
def test_bad_input_is_refused_with_nothing_written(backend: Backend, kw: dict[str, Any],
                                                   error: type[Exception], match: str) -> None:
    pool = backend.pool()
    add(pool, "other")
    snap = backend.keyspace()
    with pytest.raises(error, match=match):
        add(pool, "new", **kw)
    for name in ("", "a b", "a|b", "x" * 200, None):
        with pytest.raises(errors.InvalidArgument, match="name"):
            add(pool, name)  # type: ignore[arg-type]
    assert backend.keyspace() == snap


def test_a_tick_makes_one_job_however_many_fire_it(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    add(pool, overlap="queue")
    early_in_a_second(pool)
    now = backdate(pool, secs=5)
    assert fire_due(pool.store, SUP) == 1
    after = pool.now_ms()
    assert fire_due(pool.store, "another") == 0  # the same tick: the watermark is there
    [job] = made(pool)
    assert job.tick is not None and latest_due(job.tick, now, after) and job.state is JobState.QUEUED
    assert row(pool, job.id)["schedule"] == "s"
    mark, last, _ = ticks_record(pool)
    assert (int(mark), last) == (job.tick, job.id)
    assert next_of(pool) == job.tick + 1000
    # Two supervisors that read the same watermark: the second's fire of that tick, or of an older one, is
    # refused by the enqueue script, with nothing written.
    snap = backend.keyspace()
    for tick in (job.tick, job.tick - 1000):
        with pytest.raises(errors.AlreadyExists):
            send(pool, [Prepared("f" * 32, made(pool)[0].spec, "")], f"s|{tick}|{tick + 1000}")
    assert backend.keyspace() == snap


def test_overlap_skip_makes_no_job_while_the_last_is_not_over(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    add(pool)  # overlap 'skip' by default
    backdate(pool)
    assert fire_due(pool.store, SUP) == 1
    [first] = made(pool)
    assert first.state is JobState.RUNNING and first.tick is not None  # promoted: it holds the slot
    assert fire_tick(pool, first.tick + 1000) == []
    mark, last, _ = ticks_record(pool)
    assert int(mark) == first.tick + 1000 and last == first.id  # the tick recorded, its last job kept
    assert next_of(pool) == first.tick + 2000
    assert any(e["reason"] == "schedule_skipped" and e["job"] == first.id for e in pool.events())
    pool.pause(first.id)
    assert pool.get(first.id).state is JobState.PAUSED
    assert fire_tick(pool, first.tick + 2000) == []  # paused is not over either
    pool.cancel(first.id)  # over: the next tick makes one
    [second] = fire_tick(pool, first.tick + 3000)
    assert pool.get(second.id).tick == first.tick + 3000
    assert made(pool) == [pool.get(first.id), pool.get(second.id)]


def test_overlap_queue_makes_one_every_tick(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    add(pool, overlap="queue")
    backdate(pool)
    assert fire_due(pool.store, SUP) == 1
    [first] = made(pool)
    assert first.tick is not None
    for k in (1, 2):
        assert len(fire_tick(pool, first.tick + k * 1000)) == 1
    assert [j.tick for j in made(pool)] == [first.tick, first.tick + 1000, first.tick + 2000]
    assert all(j.state is JobState.QUEUED for j in made(pool))


def test_misfire_once_fires_the_latest_missed_tick_once(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    add(pool)
    now = backdate(pool, secs=30)
    assert fire_due(pool.store, SUP) == 1
    after = pool.now_ms()
    [job] = made(pool)
    assert latest_due(job.tick, now, after)


def test_misfire_skip_records_the_missed_ticks_and_fires_the_next(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    add(pool, misfire="skip")
    now = backdate(pool, secs=30)
    assert fire_due(pool.store, SUP) == 0
    after = pool.now_ms()
    latest = int(ticks_record(pool)[0])
    assert latest_due(latest, now, after) and next_of(pool) == latest + 1000
    skipped = [e for e in pool.events() if e["reason"] == "schedule_skipped"]
    assert skipped and "misfire 'skip'" in skipped[-1]["evidence"]
    # The next tick is due alone (none missed): it fires when it comes.
    eventually(lambda: fire_due(pool.store, SUP), timeout=5, message="the next tick fired")
    assert [j.tick for j in made(pool)] == [latest + 1000]


def test_a_paused_schedule_fires_nothing_and_its_resume_skips_the_pause(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    add(pool, overlap="queue")
    assert pool.pause_schedule("s").paused
    assert pool.pause_schedule("s").paused  # again: no change
    assert next_of(pool) is None
    backdate(pool, secs=5)  # as if it were due
    assert fire_due(pool.store, SUP) == 0
    spec = pool.schedules()[0].spec
    with pytest.raises(errors.InvalidState):
        send(pool, [Prepared("e" * 32, spec, "")], f"s|{pool.now_ms()}|{pool.now_ms() + 1000}")
    early_in_a_second(pool)  # the resume's next tick is then still to come at the fire below
    before = pool.now_ms()
    resumed = pool.resume_schedule("s")
    assert not resumed.paused and resumed.next_fire is not None and resumed.next_fire > before
    assert int(ticks_record(pool)[0]) >= before  # the pause's ticks are behind the watermark
    assert fire_due(pool.store, SUP) == 0  # due at once, to have its next tick set
    assert next_of(pool) == resumed.next_fire
    assert made(pool) == []


def test_a_removed_schedule_fires_no_more_and_its_jobs_stay(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    add(pool)
    backdate(pool)
    fire_due(pool.store, SUP)
    [job] = made(pool)
    pool.remove_schedule("s")
    assert pool.schedules() == [] and next_of(pool) is None
    with pytest.raises(errors.NotFound):
        send(pool, [Prepared("d" * 32, job.spec, "")], f"s|{pool.now_ms()}|{pool.now_ms() + 1000}")
    with pytest.raises(errors.NotFound, match="no schedule s"):
        pool.remove_schedule("s")
    for change in (pool.pause_schedule, pool.resume_schedule):
        with pytest.raises(errors.NotFound):
            change("s")
    assert pool.get(job.id).schedule == "s"
    assert fire(pool.store, "s", SUP) == 0


def test_a_job_the_pool_refuses_skips_its_tick(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=1)
    add(pool, slots=2)  # more than the pool has: refused at each tick, not at the add
    now = backdate(pool)
    assert fire_due(pool.store, SUP) == 0
    assert latest_due(int(ticks_record(pool)[0]), now, pool.now_ms())
    assert "the pool refused its job" in [e for e in pool.events() if e["reason"] == "schedule_skipped"][-1][
        "evidence"]


def test_a_broken_definition_is_set_aside_and_the_others_fire(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    add(pool, "good")
    backdate(pool, "good")
    pool.store.client.hset(pool.keys.schedules, "bad", '{"paused":false,"nonsense":1}')
    pool.store.client.zadd(pool.keys.schedule_next, {"bad": 0})
    now = pool.now_ms()
    assert fire_due(pool.store, SUP) == 1
    assert len(made(pool, "good")) == 1
    assert (next_of(pool, "bad") or 0) >= now + BROKEN_RETRY_MS
    assert [s.name for s in pool.schedules()] == ["good"]  # an unreadable one is left out of the list


def test_the_list_says_the_last_fire_its_job_and_the_next(backend: Backend) -> None:
    pool = backend.pool(max_concurrent_jobs=0)
    add(pool, "b", every=3600)
    add(pool, "a", overlap="queue")
    backdate(pool, "a")
    fire_due(pool.store, SUP)
    a, b = pool.schedules()
    [job] = made(pool, "a")
    assert (a.name, a.last_job, a.last_fire, a.next_fire) == ("a", job.id, job.tick, (job.tick or 0) + 1000)
    assert (b.name, b.last_job, b.last_fire) == ("b", None, None) and (b.next_fire or 0) % 3_600_000 == 0
    assert a.to_dict()["last_job"] == job.id


def test_the_scripts_refuse_what_does_not_read(backend: Backend) -> None:
    pool = backend.pool()
    store = pool.store
    d = Definition(Timing(None, 1000), "once", "skip", False, 1, build_spec({"image": "b", "command": ["c"]}))
    for name, text, now in (("a b", d.to_json(), 1), ("ok", "{}", 1), ("ok", d.to_json(), -1)):
        with pytest.raises(errors.InvalidArgument):
            store.schedule_set(name, text, now, 2, False, "t")
    store.schedule_set("ok", d.to_json(), 1, 2, False, "t")
    with pytest.raises(errors.AlreadyExists):
        store.schedule_skip("ok", "0", None, 3, "", "t")  # the watermark read is not the stored one
    with pytest.raises(errors.InvalidArgument):
        store.schedule_skip("ok", "1", 1, 3, "", "t")  # a tick not after the watermark
    store.schedule_skip("ok", "1", None, 3, "", "t")
    assert next_of(pool, "ok") == 3
    with pytest.raises(errors.NotFound):
        store.schedule_skip("gone", "", None, 3, "", "t")


def test_importing_jobpool_starts_no_process() -> None:
    """croniter's import runs `file -b` on the Python binary: imported at the first cron expression read, no
    worker has a child that is not a horse (tests/integration/test_standby_horse.py counts them), and no
    import of jobpool starts a process."""
    code = ("import subprocess, sys\n"
            "def refuse(*a, **k):\n"
            "    raise SystemExit(f'a process started on import: {a!r}')\n"
            "subprocess.Popen.__init__ = refuse\n"
            "import jobpool, jobpool.cli, jobpool.workers.__main__, jobpool.supervisor, jobpool.schedules\n"
            "print('croniter' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=False)
    assert (done.returncode, done.stderr, done.stdout) == (0, "", "False\n")
    assert check_timing("*/5 * * * *", None, "UTC").cron == "*/5 * * * *", "imported when read"
