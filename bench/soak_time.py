"""The soak's time and dependencies (docs/architecture.md, "Time and dependencies"): the jobs of its mix built
to meet them, the schedule that fires while it runs, and the judges of what the event stream says of them.

The mix (`TimeMix`, drawn from a generator of the seed's own, so a seed gives the same mix) makes, beside the
soak's plain jobs (bench/soak.py `job_command`):

- `timeout`: a time limit of 1 or 2 s on a job that sleeps 6 s longer, some with one retry: each attempt is
  stopped, and it ends failed with `timeout` (or cancelled by a fault). One that succeeds ran past its limit
  unstopped: counted (`timeouts_unenforced`), not a zero, since a container that exits by itself while no
  watcher is there (its worker killed, no adopter yet) ends as it exited (docs/architecture.md "Time limits").
- `retry_fail`: exits 4, with 1 or 2 retries 1 s apart (half of them only on exit 4: `retry_on`).
- `retry_flaky`: exits 4 once (a mark in its checkpoint directory), then 0, with 2 retries: retried, then it
  succeeds (or, its retry run on another daemon, fails with exit 4 again).
- `not_retried`: exits 5 with 2 retries only on exit 4: fails at once, never retried.
- `delayed`: `not_before` 2 to 6 s ahead (whole seconds, so the judge compares exact milliseconds).
- `pipeline`: 2 to 4 jobs in one `enqueue_many` call, each after the one before (a chain) or, of 3 or 4,
  the last after all the others (a fan-in), by `after_index`; about a third with a link built to fail (exit
  3), whose dependents must then be cancelled with `dependency_failed`; a quarter start `not_before` a few
  seconds ahead, a quarter wait also for one of the soak's recent jobs (`after`), which may have ended
  already.

Each job's `Built` says what it was built to do, so a failure it was built for is not a fault charged to it
(bench/soak_report.py). The schedule (`SCHEDULE`) fires a short plain job every few seconds from the start of
the feed until the soak has fed every job; its jobs are found in the event stream (bench/soak_watch.py
`EventLog.fired`) and judged with the soak's own.

`judge_time` reads every event in stream order (as `EventLog` kept them, a Redis rollback's taken-back ones
never among them) and counts the zeros:

- `dependents_early`: a job queued or promoted while one of the jobs it waits for had not succeeded yet (a
  dependent whose dependency failed or was cancelled is never queued: its dependency has no success before);
- `dependency_cancels_wrong`: a job cancelled with `dependency_failed` naming a job it does not wait for, or
  one that had not failed, been cancelled or lost its row before (a person may have retried it since);
- `ticks_twice`: two jobs fired for one tick of one schedule;
- `delayed_early`: a job queued or promoted before its `not_before` (by the server's clock in the event);
- `retry_breaches`: a retry after a failure the job's spec does not retry (a crash's, an exit outside
  `retry_on`), past its `retries` or numbered wrong; or a failure its spec retries ended with retries left.
"""

from __future__ import annotations

import contextlib
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.soak_fleet import IMAGE
from bench.soak_order import JobMix
from jobpool import Pool
from jobpool.errors import InvalidSpec, NotFound

#: The soak's schedule: a short job every `SCHEDULE_EVERY` seconds (overlap "skip", the default: no new job
#: while its last still waits or runs), at the top priority, so it does not wait behind the whole feed and
#: most ticks fire rather than skip.
SCHEDULE = "soak-tick"
SCHEDULE_EVERY = 3
SCHEDULED_COMMAND = ["sh", "-c", "sleep 0.5"]
SCHEDULE_PRIORITY = 10
#: How often each kind is drawn, per job the soak feeds (a pipeline is 2 to 4 jobs); the rest are plain.
KINDS = (("timeout", 0.07), ("retry_fail", 0.05), ("retry_flaky", 0.05), ("not_retried", 0.03),
         ("delayed", 0.08), ("pipeline", 0.12))
#: The reasons a plain job of the soak may fail with as built (bench/soak.py `job_command`: exit 3).
PLAIN_FAILS = frozenset({"exit_code_3"})
RETRY_EVIDENCE = re.compile(r"^retry (\d+) of (\d+) in -?\d+ s after (\S+?)(?:;|$)")
DEPENDENCY_EVIDENCE = re.compile(r"^job (\S+) ")


@dataclass(frozen=True)
class Built:
    """What one job was built to do: its kind, the error reasons it may fail with as built, when it may
    start (epoch ms, 0: at once), the jobs it waits for, its retries and the exit codes they are for."""

    kind: str = "plain"
    fails_as: frozenset[str] = PLAIN_FAILS
    not_before_ms: int = 0
    after: tuple[str, ...] = ()
    retries: int = 0
    retry_on: tuple[int, ...] = ()


PLAIN = Built()


def draw_kind(rng: random.Random) -> str:
    x = rng.random()
    for kind, p in KINDS:
        if x < p:
            return kind
        x -= p
    return "plain"


def built_job(kind: str, rng: random.Random, now: float) -> tuple[list[str], dict[str, Any], Built]:
    """One job of `kind` (not a pipeline, not plain): its command, enqueue fields and what it was built to."""
    secs = round(rng.uniform(0.2, 1.0), 1)
    if kind == "timeout":
        limit = rng.choice((1, 2))
        retries = 1 if rng.random() < 0.4 else 0
        fields: dict[str, Any] = {"timeout": limit}
        if retries:
            fields.update(retries=retries, retry_delay=1)
        built = Built(kind, frozenset({"timeout"}), retries=retries)
        return ["sh", "-c", f"sleep {limit + 6}"], fields, built
    if kind == "retry_fail":
        retries = rng.choice((1, 2))
        on = (4,) if rng.random() < 0.5 else ()
        fields = {"retries": retries, "retry_delay": 1, **({"retry_on": list(on)} if on else {})}
        return (["sh", "-c", f"sleep {secs}; exit 4"], fields,
                Built(kind, frozenset({"exit_code_4"}), retries=retries, retry_on=on))
    if kind == "retry_flaky":
        command = ["sh", "-c", 'm="$JOBPOOL_CHECKPOINT_DIR/failed-once"; [ -f "$m" ] && exit 0; '
                               f'touch "$m"; sleep {secs}; exit 4']
        return command, {"retries": 2, "retry_delay": 1}, Built(kind, frozenset({"exit_code_4"}), retries=2)
    if kind == "not_retried":
        return (["sh", "-c", f"sleep {secs}; exit 5"], {"retries": 2, "retry_delay": 1, "retry_on": [4]},
                Built(kind, frozenset({"exit_code_5"}), retries=2, retry_on=(4,)))
    if kind == "delayed":
        at = int(now) + rng.randint(2, 6)
        built = Built(kind, frozenset(), not_before_ms=at * 1000)
        return ["sh", "-c", f"sleep {secs}"], {"not_before": at}, built
    raise ValueError(kind)


def pipeline_items(rng: random.Random, now: float,
                   earlier: Sequence[str]) -> list[tuple[dict[str, Any], Built]]:
    """A pipeline's items for one `enqueue_many` call, with what each was built to (its `after` filled in
    once the ids are known: `TimeMix._pipeline`)."""
    n = rng.randint(2, 4)
    fan_in = n >= 3 and rng.random() < 0.4
    failing = rng.randrange(n - 1) if rng.random() < 0.35 else -1
    start = int(now) + rng.randint(2, 5) if rng.random() < 0.25 else 0
    outside = rng.choice(earlier[-5:]) if earlier and rng.random() < 0.25 else None
    out = []
    for i in range(n):
        secs = round(rng.uniform(0.3, 1.5), 1)
        fails = "; exit 3" if i == failing else ""
        item: dict[str, Any] = {"command": ["sh", "-c", f"sleep {secs}{fails}"]}
        if i and fan_in and i == n - 1:
            item["after_index"] = list(range(n - 1))
        elif i and not fan_in:
            item["after_index"] = [i - 1]
        if i == 0 and start:
            item["not_before"] = start
        if i == 0 and outside:
            item["after"] = [outside]
        kind = "failing_link" if i == failing else "link"
        out.append((item, Built(kind, frozenset({"exit_code_3"}) if i == failing else frozenset(),
                                not_before_ms=start * 1000 if i == 0 else 0)))
    return out


@dataclass
class TimeMix:
    """What the soak feeds: each draw a plain job, a job built to meet time, or a pipeline; what each job was
    built to is kept in `built` (the soak's plain jobs too)."""

    rng: random.Random
    jobs: JobMix
    built: dict[str, Built] = field(default_factory=dict)
    kinds: Counter[str] = field(default_factory=Counter)

    def feed(self, pool: Pool, plain: Callable[[], list[str]], earlier: Sequence[str]) -> list[str]:
        """One draw, enqueued; returns the new jobs' ids (several for a pipeline)."""
        kind = draw_kind(self.rng)
        self.kinds[kind] += 1
        if kind == "pipeline":
            return self._pipeline(pool, earlier)
        if kind == "plain":
            job_id = self.jobs.enqueue(pool, plain())
            self.built[job_id] = PLAIN
            return [job_id]
        command, fields, built = built_job(kind, self.rng, time.time())
        job_id = self.jobs.enqueue(pool, command, **fields)
        self.built[job_id] = built
        return [job_id]

    def _pipeline(self, pool: Pool, earlier: Sequence[str]) -> list[str]:
        links = pipeline_items(self.rng, time.time(), earlier)
        items = [item for item, _ in links]
        try:
            ids = self.jobs.enqueue_many(pool, items)
        except InvalidSpec:
            if not any("after" in item for item in items):
                raise
            # The earlier job it was to wait for is gone already (retention pruned it): without it.
            for item in items:
                item.pop("after", None)
            ids = self.jobs.enqueue_many(pool, items)
        for job_id, (item, built) in zip(ids, links, strict=True):
            after = tuple(item.get("after", ())) + tuple(ids[k] for k in item.get("after_index", ()))
            self.built[job_id] = Built(built.kind, built.fails_as, built.not_before_ms, after)
        return ids


def start_schedule(pool: Pool) -> str:
    """Add the soak's schedule; returns its name."""
    pool.add_schedule(SCHEDULE, every=SCHEDULE_EVERY, image=IMAGE, command=SCHEDULED_COMMAND,
                      priority=SCHEDULE_PRIORITY)
    return SCHEDULE


def stop_schedule(pool: Pool, name: str) -> None:
    """Remove the schedule: no tick fires after this returns (a fire in flight landed before, or finds it
    gone). One gone already (its removal's reply lost) is removed."""
    with contextlib.suppress(NotFound):
        pool.remove_schedule(name)


@dataclass
class TimeVerdict:
    """What `judge_time` found: for each zero, a line per breach (for findings.txt); `timeouts_unenforced`,
    a figure; the jobs those lines name (`involved`); and `met`, how often the jobs met each step of time
    and dependencies."""

    dependents_early: list[str] = field(default_factory=list)
    dependency_cancels_wrong: list[str] = field(default_factory=list)
    ticks_twice: list[str] = field(default_factory=list)
    delayed_early: list[str] = field(default_factory=list)
    retry_breaches: list[str] = field(default_factory=list)
    timeouts_unenforced: list[str] = field(default_factory=list)
    involved: set[str] = field(default_factory=set)
    met: Counter[str] = field(default_factory=Counter)

    def lines(self) -> list[str]:
        return [f"{name}: {line}" for name in ("dependents_early", "dependency_cancels_wrong", "ticks_twice",
                                               "delayed_early", "retry_breaches", "timeouts_unenforced")
                for line in getattr(self, name)]


def judge_time(events: Iterable[Mapping[str, str]], built: Mapping[str, Built],
               fired: Mapping[str, tuple[str, str]]) -> TimeVerdict:
    """Judge the events (every event of the pool, in stream order) of the jobs in `built` (what each was built
    to) and `fired` (each job a schedule fired: its schedule and tick). See the module's docstring."""
    judge = _TimeJudge(built)
    for e in events:
        judge.event(e, e.get("job", "") in built or e.get("job", "") in fired)
    v = judge.verdict
    ticks: dict[tuple[str, str], list[str]] = {}
    for job, fire in fired.items():
        ticks.setdefault(fire, []).append(job)
    v.met["fired"] = len(fired)
    for (schedule, tick), jobs in ticks.items():
        if len(jobs) > 1:
            v.ticks_twice.append(f"schedule {schedule} tick {tick}: jobs {', '.join(jobs)}")
            v.involved.update(jobs)
    for job, b in built.items():
        if b.kind == "timeout" and judge.state.get(job) == "succeeded":
            v.timeouts_unenforced.append(f"{job}: built to run past its time limit, it succeeded")
            v.involved.add(job)
    return v


class _TimeJudge:
    """`judge_time`'s walk through the stream: each job's state and whether it succeeded, as of each event."""

    def __init__(self, built: Mapping[str, Built]) -> None:
        self.built = built
        self.verdict = TimeVerdict()
        self.state: dict[str, str] = {}
        self.succeeded: set[str] = set()
        #: Jobs that ended failed or cancelled, or whose row was dropped, at some time before (a person may
        #: have retried them since).
        self.ended_badly: set[str] = set()
        #: Retries by its spec since the job was enqueued or a person retried it.
        self.retries: Counter[str] = Counter()
        self.user_retried: set[str] = set()

    def breach(self, zero: list[str], job: str, line: str) -> None:
        zero.append(line)
        self.verdict.involved.add(job)

    def event(self, e: Mapping[str, str], judged: bool) -> None:
        job, to = e.get("job", ""), e.get("to", "")
        if judged:
            self.judge(e, job, self.built.get(job, PLAIN))
        if to == "succeeded":
            self.succeeded.add(job)
        if to in ("failed", "cancelled") or (e.get("from") and not to):
            self.ended_badly.add(job)
        if to:
            self.state[job] = to

    def judge(self, e: Mapping[str, str], job: str, b: Built) -> None:
        v, frm, to, reason = self.verdict, e.get("from", ""), e.get("to", ""), e.get("reason", "")
        where = f"{e.get('id')} {job} {frm or '-'}->{to or '-'} ({reason})"
        if to in ("queued", "waiting") and reason == "retried":
            # A person's retry: its retries are whole again, and it runs as soon as nothing it waits for
            # holds it (its start time is not kept: scripts/retry_job.lua).
            self.retries[job] = 0
            self.user_retried.add(job)
        if frm != to and to in ("queued", "running"):
            for dep in b.after:
                if dep not in self.succeeded:
                    self.breach(v.dependents_early, job,
                                f"{where}: it waits for {dep}, {self.state.get(dep) or 'unseen'}")
            if b.not_before_ms and job not in self.user_retried and int(e.get("at") or 0) < b.not_before_ms:
                self.breach(v.delayed_early, job,
                            f"{where} at {e.get('at')} ms, before its not_before {b.not_before_ms} ms")
        if to == "cancelled" and reason == "dependency_failed":
            m = DEPENDENCY_EVIDENCE.match(e.get("evidence", ""))
            dep = m.group(1) if m else ""
            if dep not in b.after or dep not in self.ended_badly:
                self.breach(v.dependency_cancels_wrong, job,
                            f"{where}: {e.get('evidence')!r}, that job {self.state.get(dep) or 'unseen'}; "
                            f"it waits for {list(b.after)}")
        if frm == "running" and to == "waiting":
            self.retry(e, job, b, where)
        elif frm == "running" and to == "failed" and retried_for(reason, b.retry_on) \
                and self.retries[job] < b.retries:
            self.breach(v.retry_breaches, job,
                        f"{where}: failed with {self.retries[job]} of its {b.retries} retries used")
        self.count(frm, to, reason)

    def count(self, frm: str, to: str, reason: str) -> None:
        """What the jobs met of time and dependencies (`TimeVerdict.met`)."""
        met = self.verdict.met
        met["retried_by_a_person"] += to in ("queued", "waiting") and reason == "retried"
        met["released"] += frm == "waiting" and to == "queued"
        met["timed_out"] += frm == to == "running" and reason == "timeout"
        met["ticks_skipped"] += reason == "schedule_skipped"
        met["dependency_cancelled"] += to == "cancelled" and reason == "dependency_failed"

    def retry(self, e: Mapping[str, str], job: str, b: Built, where: str) -> None:
        """A retry by the job's spec must follow a failure of its own that its spec retries, within its
        retries, numbered in order."""
        v = self.verdict
        self.retries[job] += 1
        v.met["retried_by_policy"] += 1
        m = RETRY_EVIDENCE.match(e.get("evidence", ""))
        if not m:
            self.breach(v.retry_breaches, job, f"{where}: evidence {e.get('evidence')!r} names no retry")
            return
        n, of, after = int(m.group(1)), int(m.group(2)), m.group(3)
        if not retried_for(after, b.retry_on):
            self.breach(v.retry_breaches, job, f"{where}: retried after {after}, which its spec does not "
                                               f"retry (retry_on {list(b.retry_on)})")
        if self.retries[job] > b.retries or of != b.retries or n != self.retries[job]:
            self.breach(v.retry_breaches, job, f"{where}: retry {n} of {of}, its retry number "
                                               f"{self.retries[job]}; built with {b.retries} retries")


def retried_for(reason: str, retry_on: Sequence[int]) -> bool:
    """Whether a spec with `retry_on` retries a failure for `reason`: a timeout, or an exit code (one of
    `retry_on` when given); never a crash, a launch failure or an OOM kill."""
    if reason == "timeout":
        return True
    m = re.fullmatch(r"exit_code_(-?\d+)", reason)
    return m is not None and (not retry_on or int(m.group(1)) in retry_on)


def fails_as(built: Mapping[str, Built], job: str) -> frozenset[str]:
    """The error reasons `job` may fail with as built (a plain job's, for a job not in `built`)."""
    return built.get(job, PLAIN).fails_as


def time_line(v: TimeVerdict, kinds: Counter[str]) -> str:
    return (f"dependents_early={len(v.dependents_early)} "
            f"dependency_cancels_wrong={len(v.dependency_cancels_wrong)} ticks_twice={len(v.ticks_twice)} "
            f"delayed_early={len(v.delayed_early)} retry_breaches={len(v.retry_breaches)} "
            f"timeouts_unenforced={len(v.timeouts_unenforced)} "
            f"time_mix=[{','.join(f'{k}:{n}' for k, n in sorted(kinds.items()) if k != 'plain')}] "
            f"time_met=[{','.join(f'{k}:{n}' for k, n in sorted(v.met.items()))}]")
