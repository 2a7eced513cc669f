"""Chaos soak: real redis-server (AOF), two (or three) real dockerd daemons, real workers and supervisors,
faults on a seeded schedule.

    python3 -m bench.soak [--jobs 300] [--slots 3] [--workers 4] [--seed 1] [--max-minutes 40]
                          [--daemons 2|3] [--faults kind,kind] [--rollback-quiet]
                          [--keep N [--events-maxlen M]]

Faults: SIGKILL a worker (and its forked horse), SIGTERM a worker (drain), kill and restart a supervisor,
stop and restart a dockerd, kill -9 and restart redis-server (AOF, fsync always), cancel and pause/resume
random jobs, a person's `Pool.retry` of a failed or cancelled one; and the faults that reach the holes closed
most recently:

- `shared_id_daemon`: the fleet runs on two daemons that report one Docker ID; a worker on daemon 2 is
  SIGKILLed (with its horse) while jobs run there, and restarted. Each daemon has its own supervisor.
- `slow_launch`: the held worker's next `POST /containers/create` reply (or start request) is held for longer
  than the lease.
- `redis_rollback`: Redis loses its last writes: its AOF directory is copied, the fleet runs 0.5-2 s more,
  redis-server is SIGKILLed and comes back from the copy on the same port, at any instant (a delivery a
  worker had just taken is restored into RQ's intermediate list, which the supervisor dispatches again after
  the claim grace); `--rollback-quiet` copies only while no delivery is in flight (see `Chaos._copy_aof`).
- `lost_reply`: the reply of the next call of `claim`, `set_container` or `finish` (workers reach Redis
  through a proxy) is dropped: the script ran, the worker never heard.

With `--daemons 3` the fleet runs on three daemons (one supervisor attached to daemon 1, one to none: it
judges from the daemons' inventories) and the host faults are drawn too:

- `daemon_workers_killed`: every worker of one daemon SIGKILLed while its containers run, kept down until
  its inventory is stale, then started again (they adopt what still runs there);
- `daemon_containers_removed`: every running job container of one daemon removed (`docker rm -f`) while its
  workers live;
- `host_reboot`: a daemon no supervisor asks loses its workers and containers, and its workers come back
  under another kernel boot id (bench/soak_fleet.py, `Fleet.reboot`).

and the faults at the fleet's edges (bench/soak_edges.py): `claim_lost_worker_killed` (Redis forgets a claim
whose worker was SIGKILLed, as a failover to a lagging replica does: its container becomes a stray),
`daemon_forgotten_returns` (an idle daemon's workers hang, it is declared gone, they wake and publish) and
`redis_restart_in_launch` (redis-server down past a lease while a create's reply is held),
`checkpoint_root_read_only` (the fleet then shares a `JOBPOOL_CHECKPOINT_ROOT`, remounted read-only for a
few seconds), `cloned_data_root` (a daemon's data root copied onto a new daemon of this kernel with a worker:
one identity on two daemons), `worker_without_daemon` (a worker whose DOCKER_HOST names nothing runs a few
seconds: the deliveries it took are counted, `swallowed`, a zero) and `frozen_standby` (a worker's standby or
running horse SIGSTOPped). An instant over
the limit or with a job's two containers, within the strays' bound after a Redis rollback, is counted as a
stray instant, not a broken zero (bench/soak_strays.py).

(A killed `jobpool up` is not among them: the soak runs workers and supervisors itself;
tests/integration/test_up.py kills `up` with real processes.) Layout of the fleet, the sampler and the
injectors: `bench/soak_fleet.py` and `bench/soak_faults.py`; what is read from Redis to judge (the event
stream, followed live; the keyspace): `bench/soak_watch.py`; the verdict at the end: `bench/soak_report.py`.

A worker or supervisor that exits on its own is started again, as the compose file's restart policy would, and
counted (`unexpected_exits`). It runs until every job is terminal and every fault kind has met live jobs
(bounded in time) and prints one line of figures; each fault is logged to stderr with its time, and what broke
a zero (with the jobs' events and rows) goes to findings.txt beside the processes' logs, and so does the
history of each job that failed though it was not built to (a fault charged to the job). The promises are the
zeros: lost jobs, instants over the slot limit (the running containers' job weights, every daemon sampled,
summed), instants over a named limit (a name's units summed over the running containers of the jobs using
it), jobs with two live containers at once (on one daemon or across the two), jobs stuck non-terminal, and
illegal transitions in the events stream (read live: see bench/soak_watch.py), events the stream dropped
before they were read, and rows that retention removed but no prune event accounts for; and those of time
and dependencies (bench/soak_time.py): no dependent queued or started before every job it waits for
succeeded (one whose dependency failed or was cancelled never is), no dependent cancelled for a job that did
not fail, no schedule tick that fired two jobs, no delayed job queued before its start time, no retry its
spec does not make.

The job mix has order and limits in it (docs/architecture.md, "Order and limits"; bench/soak_order.py): the
limits `gpu` = 2 and `dataset:*` = 1 are set before the first job is fed, and each job's priority, weight
(`slots=2`, never more than `--slots`), named uses (`gpu`, 1 or 2 units; one `dataset:<name>` of three) and
group are drawn from a generator of the seed's own, so a seed gives the same mix. A job passed over 3 s gets
the reservation (JOBPOOL_RESERVE_AFTER_SECS), so reservations are taken and given back under the faults too.
The line shows the mix (`mix=`) and the most each limit was seen holding at one instant (`peaks=`: the
slots by weight, each named limit's busiest name), which shows the limits were met and not only never passed.

It has time and dependencies in it too (docs/architecture.md, "Time and dependencies"; bench/soak_time.py):
about one job in four is built to time out (some with a retry), to fail and be retried (some only on one exit
code, some failing once and then passing), to fail with an exit its retries leave out, or to start a few
seconds later; about one draw in eight is a pipeline of 2 to 4 jobs in one `enqueue_many` call
(`after_index`), a third of them with a link built to fail, whose dependents must be cancelled. A schedule
fires a short job every few seconds from the first job fed until the last; its jobs are judged with the
others. The line gives
each zero, `timeouts_unenforced` (jobs built to time out that succeeded: a figure, not a zero), the draws by
kind (`time_mix=`) and what the jobs met (`time_met=`: attempts timed out, retries by a spec and by a person,
jobs released from waiting, dependents cancelled, ticks fired and skipped). A job that fails as it was built
to (its time limit, its retries' exit code) is not a fault charged to it.

`--keep N` runs it as a long-lived pool: every process keeps only the newest N finished jobs of each state
(JOBPOOL_KEEP_*) and the event stream is capped small (`--events-maxlen`, JOBPOOL_EVENTS_MAXLEN), so both
caps are reached early. Jobs are then fed in batches of N (at least slots + 1), and each time the queue is
empty the keyspace is counted and Redis's memory read (keyspace.txt beside the logs); once the caps are
reached, key count and memory must stay flat (`Keyspace.judge` in bench/soak_watch.py says what that means),
printed beside the zeros. A job whose row was pruned after it ended counts by its last event; one whose row
went before it ended is lost. Without `--keep` the default caps (10,000 jobs) are never reached.

`tests/integration/test_soak.py` runs it small in CI, with small caps, and asserts the same. The subprocess
executor has a soak of its own, with jobs that leave background children: bench/soak_subprocess.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.soak_edges import EDGE_FAULTS
from bench.soak_faults import ARMED, HOST_FAULTS, Chaos
from bench.soak_fleet import IMAGE, POOL, Fleet, Sampler, stream_id
from bench.soak_order import LIMITS, RESERVE_AFTER_SECS, JobMix, Judge, mix_counts
from bench.soak_report import tally, write_findings
from bench.soak_strays import StrayWatch, excuse_strays
from bench.soak_time import Built, TimeMix, TimeVerdict, start_schedule, stop_schedule, time_line
from bench.soak_watch import TERMINAL, EventLog, Keyspace, keyspace_line
from jobpool import JobState, Pool
from jobpool.errors import JobpoolError
from jobpool.store.keys import PoolKeys
from tests.support.mounts import bound
from tests.support.servers import DockerDaemon, RedisServer

TIMINGS = {
    "JOBPOOL_HEARTBEAT_SECS": "0.3",
    "JOBPOOL_LEASE_SECS": "1.5",
    "JOBPOOL_DRAIN_TIMEOUT_SECS": "2",
    "JOBPOOL_STOP_GRACE_SECS": "1",
    "JOBPOOL_SWEEP_INTERVAL_SECS": "0.5",
    "JOBPOOL_CLAIM_GRACE_SECS": "4",
    "JOBPOOL_PROBE_TIMEOUT_SECS": "2",
    "JOBPOOL_RECOVERY_BUDGET": "20",
}
FAULTS = ("worker_sigkill", "worker_sigterm", "supervisor_restart", "dockerd_restart", "redis_restart",
          "cancel", "pause_resume", "retry", "shared_id_daemon", "slow_launch", "redis_rollback",
          "lost_reply")
#: Inventories every 0.3 s, stale after 2 s, so the host faults are judged within seconds.
INVENTORY_TIMINGS = {"JOBPOOL_INVENTORY_SECS": "0.3", "JOBPOOL_INVENTORY_STALE_SECS": "2"}
#: The states of a job not ended yet: the soak runs until none is in any of them.
LIVE = ("queued", "waiting", "running", "paused")


def faults_for(daemons: int) -> tuple[str, ...]:
    """The fault kinds a fleet of `daemons` daemons meets: the host and edge faults need a third one (and
    its inventories, published every 0.3 s)."""
    return FAULTS + HOST_FAULTS + EDGE_FAULTS if daemons >= 3 else FAULTS


def stray_bound(env: dict[str, str]) -> float:
    """How long a stray may run beside its job's other container (docs/architecture.md, "Strays": the
    settling lease, an inventory period, the stop grace), plus 5 s for a loaded machine's listings, stops."""
    return sum(float(env.get(k, d)) for k, d in (("JOBPOOL_LEASE_SECS", 30), ("JOBPOOL_INVENTORY_SECS", 5),
                                                 ("JOBPOOL_STOP_GRACE_SECS", 10))) + 5.0


def job_command(rng: random.Random) -> list[str]:
    """Short jobs of varied length; about a third checkpoint and resume, a few fail on purpose."""
    secs = round(rng.uniform(0.2, 2.5), 1)
    kind = rng.random()
    if kind < 0.35:
        return ["sh", "-c",
                "trap 'echo ck > \"$JOBPOOL_CHECKPOINT_DIR/ck\"; exit 75' TERM; "
                "[ -f \"$JOBPOOL_CHECKPOINT_DIR/ck\" ] && exit 0; "
                f"i=0; while [ $i -lt {int(secs * 10)} ]; do sleep 0.1; i=$((i+1)); done"]
    if kind < 0.40:
        return ["sh", "-c", f"sleep {secs}; exit 3"]
    return ["sh", "-c", f"sleep {secs}"]


@dataclass
class Figures:
    jobs: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    over_limit_instants: int = 0
    #: Instants at which some name's units in use, summed over the running containers, were over its limit.
    over_named_limit_instants: int = 0
    double_container_jobs: set[str] = field(default_factory=set)
    stuck: int = 0
    illegal_transitions: int = 0
    samples: int = 0
    recovery: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    outcomes: Counter[str] = field(default_factory=Counter)
    failure_reasons: Counter[str] = field(default_factory=Counter)
    wall_secs: float = 0.0
    #: What the sampler saw when a zero broke, and the events each Redis rollback took back.
    findings: list[dict[str, Any]] = field(default_factory=list)
    rolled_back_events: int = 0
    rollbacks: list[dict[str, Any]] = field(default_factory=list)
    lost_replies: Counter[str] = field(default_factory=Counter)
    missed: Counter[str] = field(default_factory=Counter)
    held_launches: list[str] = field(default_factory=list)
    stuck_jobs: list[str] = field(default_factory=list)
    #: Workers or supervisors that exited without being asked (the soak starts them again, as compose would).
    unexpected_exits: int = 0
    #: Containers not running and checkpoint volumes left on the daemons at the end (Fleet.leftovers).
    docker_leftovers: list[str] = field(default_factory=list)
    #: Reads of the event stream that found it trimmed past the last event read (see soak_watch.EventLog).
    events_unseen: int = 0
    #: Rows retention removed, per state (by the jobs' last events), and those no prune event accounts for.
    pruned: Counter[str] = field(default_factory=Counter)
    pruned_unaccounted: int = 0
    #: With --keep: the keyspace judged at the caps (soak_watch.Keyspace.judge).
    keyspace: dict[str, Any] | None = None
    #: Containers published as strays, the sampler's instants within the strays' bound after a Redis
    #: rollback, and the latest of those after its rollback (bench/soak_strays.py).
    strays: int = 0
    #: Deliveries a worker whose Docker daemon does not answer took (bench/soak_edges.py): a zero.
    swallowed: int = 0
    stray_instants: int = 0
    stray_secs_max: float = 0.0
    #: The most each limit was seen holding at one instant: "slots" (weights summed), each named limit's
    #: busiest name (bench/soak_order.py's Judge); and how many jobs of the mix had each kind of order.
    peaks: dict[str, int] = field(default_factory=dict)
    mix: Counter[str] = field(default_factory=Counter)
    #: Time and dependencies (bench/soak_time.py): what `judge_time` found (its zeros, `timeouts_unenforced`,
    #: what the mix met), the draws of the time mix by kind, and how many jobs a schedule fired.
    time: TimeVerdict = field(default_factory=TimeVerdict)
    time_mix: Counter[str] = field(default_factory=Counter)
    #: Jobs enqueued whose rows were gone before the soak read whether a schedule fired them.
    fired_unread: int = 0

    def line(self) -> str:
        rec = " ".join(
            f"{k}={statistics.median(v):.1f}/{max(v):.1f}s" for k, v in sorted(self.recovery.items()) if v)
        faults = ",".join(f"{k}:{v}" for k, v in sorted(self.faults.items()))
        if self.lost_replies:
            faults += " lost_reply_of:" + ",".join(f"{k}:{v}" for k, v in sorted(self.lost_replies.items()))
        if self.rollbacks:
            faults += f" rolled_back_events:{self.rolled_back_events}"
        outcomes = ",".join(f"{k}:{v}" for k, v in sorted(self.outcomes.items()))
        if self.failure_reasons:
            outcomes += " failed_by:" + ",".join(f"{k}:{v}" for k, v in sorted(self.failure_reasons.items()))
        return (f"soak: jobs={self.jobs} outcomes=[{outcomes}] faults=[{faults}] lost={self.lost} "
                f"over_limit_instants={self.over_limit_instants} "
                f"over_named_limit_instants={self.over_named_limit_instants} "
                f"double_container_jobs={len(self.double_container_jobs)} stuck={self.stuck} "
                f"illegal_transitions={self.illegal_transitions} samples={self.samples} "
                f"strays={self.strays} stray_instants={self.stray_instants} swallowed={self.swallowed} "
                f"stray_secs_max={self.stray_secs_max:.1f} "
                f"unexpected_exits={self.unexpected_exits} events_unseen={self.events_unseen} "
                f"pruned={sum(self.pruned.values())} pruned_unaccounted={self.pruned_unaccounted} "
                f"left_on_daemons=[containers:{sum(' container ' in x for x in self.docker_leftovers)},"
                f"volumes:{sum(' volume ' in x for x in self.docker_leftovers)}] "
                f"mix=[{','.join(f'{k}:{v}' for k, v in sorted(self.mix.items()))}] "
                f"peaks=[{','.join(f'{k}:{v}' for k, v in sorted(self.peaks.items()))}] "
                f"{time_line(self.time, self.time_mix)} fired_unread={self.fired_unread} "
                f"recovery(median/max)=[{rec}] wall={self.wall_secs:.0f}s"
                + ("" if self.keyspace is None else " " + keyspace_line(self.keyspace)))

    def zeros_hold(self) -> bool:
        t = self.time
        return not (self.lost or self.over_limit_instants or self.over_named_limit_instants
                    or self.double_container_jobs or self.stuck or self.illegal_transitions
                    or self.events_unseen or self.pruned_unaccounted or self.swallowed
                    or t.dependents_early or t.dependency_cancels_wrong or t.ticks_twice or t.delayed_early
                    or t.retry_breaches)

    def flat_holds(self) -> bool:
        """With --keep, key count and memory stayed flat once the caps were reached (True without)."""
        return self.keyspace is None or bool(self.keyspace["keys_flat"] and self.keyspace["memory_flat"])


def progress_after(log: EventLog, since_ms: int, timeout: float) -> float | None:
    """Seconds from `since_ms` to the next promotion or terminal transition (the queue moving again)."""
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        events = log.events[seen:]
        seen += len(events)
        for e in events:
            if stream_id(e["id"]) >= (since_ms, 0) and (e["reason"] in ("promoted", "adopted")
                                                        or e["to"] in TERMINAL):
                return max(0.0, (int(e["at"]) - since_ms) / 1000)
        time.sleep(0.1)
    return None


@dataclass
class Run:
    """What the main loop works with."""

    pool: Pool
    chaos: Chaos
    log: EventLog
    rng: random.Random
    figures: Figures
    job_ids: list[str]
    #: Jobs to run at least (more if some fault kind has not met live jobs yet).
    jobs: int
    #: With --keep: the keyspace censuses, and the jobs fed at each moment the queue is empty.
    keyspace: Keyspace | None = None
    batch: int = 5
    #: Each job's priority, weight, named limits and group, drawn and recorded as it is fed (None: plain).
    mix: JobMix | None = None
    #: What each job was built to do with time and dependencies, drawn as it is fed (None: plain jobs only).
    time: TimeMix | None = None
    #: The schedule firing while the soak feeds (bench/soak_time.py), until it has fed every job.
    schedule: str | None = None

    def feed(self, n: int) -> None:
        """At least `n` jobs more (a pipeline is fed whole)."""
        start = len(self.job_ids)
        while len(self.job_ids) < start + n:
            if self.time is not None:
                self.job_ids += self.time.feed(self.pool, lambda: job_command(self.rng), self.job_ids)
                continue
            command = job_command(self.rng)
            self.job_ids.append(self.mix.enqueue(self.pool, command) if self.mix is not None
                                else self.pool.enqueue(IMAGE, command).id)
        self.figures.jobs = len(self.job_ids)

    def judged_ids(self) -> list[str]:
        """The soak's own jobs, then those its schedule fired (found in the event stream)."""
        mine = set(self.job_ids)
        return self.job_ids + [j for j in self.log.fired if j not in mine]

    def built(self) -> dict[str, Built]:
        return {} if self.time is None else self.time.built


def retention_env(keep: int, events_maxlen: int) -> dict[str, str]:
    """Small caps for every process: the newest `keep` finished jobs of each state, a short event stream."""
    return {"JOBPOOL_KEEP_SUCCEEDED": str(keep), "JOBPOOL_KEEP_FAILED": str(keep),
            "JOBPOOL_KEEP_CANCELLED": str(keep), "JOBPOOL_EVENTS_MAXLEN": str(events_maxlen)}


def run_soak(jobs: int = 300, slots: int = 3, workers: int = 4, seed: int = 1, max_minutes: float = 40.0,
             fault_every: tuple[float, float] = (1.0, 3.0), rounds: int = 1,
             faults: tuple[str, ...] = FAULTS, rollback_anywhere: bool = True, keep: int = 0,
             events_maxlen: int = 200, daemons: int = 2) -> Figures:
    """Faults are drawn in seeded rounds that each hold every kind once, so even a short soak meets them all
    (`rounds` times each, at least). A fault counts once it met live jobs; one that could not (an armed one
    whose moment has not come yet, a rollback that took back no transition) is drawn again. `faults` narrows
    the kinds drawn (to hammer one while investigating it). `rollback_anywhere` (the default): a Redis
    rollback may also restore a delivery a worker had just taken from RQ's queue (see `Chaos._copy_aof`).
    `keep` > 0: retention caps of `keep` finished jobs per state and `events_maxlen` events, jobs fed in
    batches of `keep` (at least slots + 1), the keyspace counted each time the queue is empty. `daemons`: 2,
    or 3 for the host faults (`faults_for`)."""
    rng = random.Random(seed)
    figures = Figures(jobs=jobs)
    root = Path(tempfile.mkdtemp(prefix="jobpool-soak-"))
    print(f"soak: logs in {root}", file=sys.stderr)
    redis_server, docker_daemons = RedisServer(), [DockerDaemon() for _ in range(daemons)]
    fleet: Fleet | None = None
    sampler: Sampler | None = None
    strays: StrayWatch | None = None
    chaos: Chaos | None = None
    log: EventLog | None = None
    shared_root = None
    stack = contextlib.ExitStack()
    t0 = time.monotonic()
    try:
        redis_server.start(appendonly=True)
        for daemon in docker_daemons:
            daemon.start()
            daemon.import_busybox_image(IMAGE)
        if "checkpoint_root_read_only" in faults:
            # A shared checkpoint root (every daemon is on this host) that the fault can make read-only.
            shared_root = stack.enter_context(bound(root / "checkpoints"))
        env = {**TIMINGS, "JOBPOOL_REDIS_URL": redis_server.url, "JOBPOOL_POOL": POOL,
               "JOBPOOL_EXECUTOR": "docker", "JOBPOOL_STATE_DIR": str(root),
               "JOBPOOL_RESERVE_AFTER_SECS": RESERVE_AFTER_SECS,
               **({"JOBPOOL_CHECKPOINT_ROOT": str(shared_root.path)} if shared_root else {}),
               **(INVENTORY_TIMINGS if daemons >= 3 else {}),
               **(retention_env(keep, events_maxlen) if keep else {})}
        log = EventLog(redis_server.url, PoolKeys(POOL))
        log.start()
        pool = Pool.from_env(env=env)
        pool.set_slots(slots)
        for name, size in LIMITS.items():
            pool.set_limit(name, size)
        batch = max(keep, slots + 1) if keep else 5
        # Their own generators, so the jobs' commands and the fault schedule drawn from `rng` stay the seed's
        # whatever the mix draws.
        mix = JobMix(random.Random(seed + 2), slots)
        time_mix = TimeMix(random.Random(seed + 3), mix)
        job_ids: list[str] = []
        fleet = Fleet(root, {**os.environ, **env}, redis_server, docker_daemons, workers)
        sampler = Sampler([d.host for d in docker_daemons], Judge(slots, LIMITS, mix.book, figures))
        sampler.start()
        strays = StrayWatch(redis_server.url, PoolKeys(POOL))
        strays.start()
        # Its own generator: what the armed faults pick depends on when they are met, the schedule must not.
        chaos = Chaos(random.Random(seed + 1), fleet, redis_server, pool, figures, root, rollback_anywhere,
                      hold_events=log.hold)
        chaos.checkpoint_root = shared_root
        keyspace = Keyspace({s: keep for s in TERMINAL}, events_maxlen) if keep else None
        run = Run(pool, chaos, log, rng, figures, job_ids, jobs, keyspace, batch, mix, time_mix)
        run.feed(min(jobs, batch) if keep else jobs)
        run.schedule = start_schedule(pool)
        drive(run, t0 + max_minutes * 60, fault_every, rounds, faults)
        chaos.disarm()
        sampler.stop()
        strays.stop()
        figures.strays = len(strays.seen)
        excuse_strays(figures, strays.seen, slots, stray_bound(env))
        figures.mix = mix_counts(mix.book.orders(run.job_ids).values())
        figures.time_mix = time_mix.kinds
        figures.docker_leftovers = fleet.leftovers()
        tally(run, root)
        write_findings(run, root, slots)
    finally:
        figures.wall_secs = time.monotonic() - t0
        if chaos is not None:
            chaos.disarm()
            chaos.close()
        if sampler is not None:
            sampler.stop()
        if strays is not None:
            strays.stop()
        if log is not None:
            log.stop()
        if fleet is not None:
            fleet.close()
        stack.close()  # the shared checkpoint root's mount, if any
        for n, daemon in enumerate(docker_daemons, 1):  # its log goes with the others, the rest is deleted
            with contextlib.suppress(OSError):
                shutil.copy2(daemon.dir / "dockerd.log", root / f"dockerd-d{n}.log")
            daemon.close()
        redis_server.close()
    return figures


def drive(run: Run, deadline: float, fault_every: tuple[float, float], rounds: int,
          faults: tuple[str, ...]) -> None:
    """The main loop: feed the queue until every fault kind met live jobs (and, with --keep, until `jobs`
    were fed, a batch each time the queue is empty, after a census of the keyspace), inject faults on the
    schedule, resume what was paused, until nothing is left to run (or the deadline)."""
    pool, chaos, rng, figures = run.pool, run.chaos, run.rng, run.figures
    next_fault = time.monotonic() + rng.uniform(*fault_every)
    paused_seen: dict[str, float] = {}
    schedule: list[str] = []
    while time.monotonic() < deadline:
        try:
            counts = pool.stats()["counts"]
        except JobpoolError:
            counts = None
        if counts is not None and sum(counts[s] for s in LIVE) == 0 and at_rest(run, faults, rounds):
            return
        for gone in chaos.fleet.revive():
            figures.unexpected_exits += 1
            print(f"soak: {gone}; started again", file=sys.stderr)
        met = [(kind, int(time.time() * 1000)) for kind in chaos.poll()]
        if counts is not None and time.monotonic() >= next_fault:
            if not schedule:
                schedule = rng.sample(faults, len(faults))
            kind = schedule.pop()
            at_ms = int(time.time() * 1000)
            if chaos.inject(kind, run.job_ids):
                met.append((kind, at_ms))
            elif kind not in ARMED:
                figures.missed[kind] += 1
                schedule.append(kind)  # the next fault drawn
            next_fault = time.monotonic() + rng.uniform(*fault_every)
        count_met(run.log, figures, met)
        if counts is not None and counts["paused"]:
            resume_paused(pool, paused_seen)
        time.sleep(0.2)


def at_rest(run: Run, faults: tuple[str, ...], rounds: int) -> bool:
    """Nothing is left to run: with --keep, count the keyspace; feed more while some fault kind has not met
    live jobs `rounds` times or fewer than `jobs` were fed; once all were, remove the schedule (no tick fires
    after that; a job its last tick fired meanwhile is left to end). Returns whether the soak ends now."""
    if run.keyspace is not None:
        run.keyspace.take(run.pool, run.log)
    if min(run.figures.faults[kind] for kind in faults) < rounds or len(run.job_ids) < run.jobs:
        run.feed(run.batch)
        return False
    if run.schedule is None:
        return True
    with contextlib.suppress(JobpoolError):  # Redis away: removed next time
        stop_schedule(run.pool, run.schedule)
        run.schedule = None
    return False


def count_met(log: EventLog, figures: Figures, met: list[tuple[str, int]]) -> None:
    """Count the faults that met live jobs, and how long the queue took to move again after each crash."""
    for kind, at_ms in met:
        figures.faults[kind] += 1
        if kind not in ("cancel", "pause_resume", "retry", "slow_launch", "lost_reply"):
            took = progress_after(log, at_ms, timeout=30)
            if took is not None:
                figures.recovery[kind].append(took)


def resume_paused(pool: Pool, paused_seen: dict[str, float]) -> None:
    """The user who paused a job resumes it a second or so later."""
    try:
        for job in pool.list(JobState.PAUSED, limit=100):
            if time.monotonic() - paused_seen.setdefault(job.id, time.monotonic()) > 1.0:
                pool.resume(job.id)
                paused_seen.pop(job.id)
    except JobpoolError:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--slots", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-minutes", type=float, default=40.0)
    ap.add_argument("--daemons", type=int, default=2, choices=(2, 3),
                    help="dockerd daemons in the fleet; 3 adds the host faults")
    ap.add_argument("--faults", default="",
                    help="comma-separated fault kinds to draw (default: all the fleet can meet)")
    ap.add_argument("--rollback-quiet", action="store_true",
                    help="copy the AOF for a Redis rollback only while no RQ delivery is in flight")
    ap.add_argument("--keep", type=int, default=0,
                    help="retention caps of N finished jobs per state; judge keys and memory at the caps")
    ap.add_argument("--events-maxlen", type=int, default=200,
                    help="with --keep: the event stream's cap (JOBPOOL_EVENTS_MAXLEN, at least 100)")
    args = ap.parse_args()
    if args.keep < 0 or args.events_maxlen < 100:
        ap.error("--keep must be 0 or more and --events-maxlen at least 100")
    known = faults_for(args.daemons)
    faults = tuple(k for k in args.faults.split(",") if k) or known
    if set(faults) - set(known):
        ap.error(f"--faults: choose among {','.join(known)}")
    figures = run_soak(args.jobs, args.slots, args.workers, args.seed, args.max_minutes, faults=faults,
                       rollback_anywhere=not args.rollback_quiet, keep=args.keep,
                       events_maxlen=args.events_maxlen, daemons=args.daemons)
    print(figures.line())
    print(json.dumps({"zeros_hold": figures.zeros_hold(), "flat_holds": figures.flat_holds()}))
    return 0 if figures.zeros_hold() and figures.flat_holds() else 1


if __name__ == "__main__":
    sys.exit(main())
