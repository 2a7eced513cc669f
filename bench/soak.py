"""Chaos soak: real redis-server (AOF), two real dockerd daemons, real workers and supervisors, faults on a
seeded schedule.

    python3 bench/soak.py [--jobs 300] [--slots 3] [--workers 4] [--seed 1] [--max-minutes 40]
                          [--faults kind,kind] [--rollback-anywhere]

Faults: SIGKILL a worker (and its forked horse), SIGTERM a worker (drain), kill and restart a supervisor,
stop and restart a dockerd, kill -9 and restart redis-server (AOF, fsync always), cancel and pause/resume
random jobs; and the faults that reach the holes closed most recently:

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

(A killed `jobpool up` is not among them: the soak runs workers and supervisors itself;
tests/integration/test_up.py kills `up` with real processes.) Layout of the fleet, the sampler and the
injectors: `bench/soak_fleet.py` and `bench/soak_faults.py`.

A worker or supervisor that exits on its own is started again, as the compose file's restart policy would, and
counted (`unexpected_exits`). It runs until every job is terminal and every fault kind has met live jobs
(bounded in time) and prints one line of figures; each fault is logged to stderr with its time, and what broke
a zero (with the jobs' events and rows) goes to findings.txt beside the processes' logs. The promises are the
zeros: lost jobs, instants over the slot limit (both daemons sampled, summed), jobs with two live containers
at once (on one daemon or across the two), jobs stuck non-terminal, and illegal transitions in the events
stream.

`tests/integration/test_soak.py` runs it small in CI and asserts the same zeros.
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

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests"), str(HERE.parent)]

from servers import DockerDaemon, RedisServer  # noqa: E402
from soak_faults import ARMED, Chaos  # noqa: E402
from soak_fleet import IMAGE, POOL, Fleet, Sampler, all_events, finding_line  # noqa: E402

from jobpool import JobState, Pool  # noqa: E402
from jobpool.errors import JobpoolError  # noqa: E402

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
          "cancel", "pause_resume", "shared_id_daemon", "slow_launch", "redis_rollback", "lost_reply")
#: Legal (from, to) pairs in the events stream; "running"->"running" are claims, adoptions, requests.
LEGAL = {
    ("", "queued"), ("queued", "running"), ("queued", "paused"), ("queued", "cancelled"),
    ("running", "running"), ("running", "queued"), ("running", "paused"), ("running", "succeeded"),
    ("running", "failed"), ("running", "cancelled"), ("paused", "queued"), ("paused", "cancelled"),
}


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
    faults: Counter = field(default_factory=Counter)
    lost: int = 0
    over_limit_instants: int = 0
    double_container_jobs: set = field(default_factory=set)
    stuck: int = 0
    illegal_transitions: int = 0
    samples: int = 0
    recovery: dict = field(default_factory=lambda: defaultdict(list))
    outcomes: Counter = field(default_factory=Counter)
    failure_reasons: Counter = field(default_factory=Counter)
    wall_secs: float = 0.0
    #: What the sampler saw when a zero broke, and the events each Redis rollback took back.
    findings: list = field(default_factory=list)
    rolled_back_events: int = 0
    rollbacks: list = field(default_factory=list)
    lost_replies: Counter = field(default_factory=Counter)
    missed: Counter = field(default_factory=Counter)
    held_launches: list = field(default_factory=list)
    stuck_jobs: list = field(default_factory=list)
    #: Workers or supervisors that exited without being asked (the soak starts them again, as compose would).
    unexpected_exits: int = 0

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
                f"double_container_jobs={len(self.double_container_jobs)} stuck={self.stuck} "
                f"illegal_transitions={self.illegal_transitions} samples={self.samples} "
                f"unexpected_exits={self.unexpected_exits} "
                f"recovery(median/max)=[{rec}] wall={self.wall_secs:.0f}s")

    def zeros_hold(self) -> bool:
        return not (self.lost or self.over_limit_instants or self.double_container_jobs or self.stuck
                    or self.illegal_transitions)


def progress_after(pool: Pool, since_ms: int, timeout: float) -> float | None:
    """Seconds from `since_ms` to the next promotion or terminal transition (the queue moving again)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            for e in pool.events(after=f"{since_ms}-0", count=500):
                if e["reason"] in ("promoted", "adopted") or e["to"] in ("succeeded", "failed", "cancelled"):
                    return max(0.0, (int(e["at"]) - since_ms) / 1000)
        except JobpoolError:
            pass
        time.sleep(0.1)
    return None


def check_transitions(pool: Pool, job_ids: list[str]) -> int:
    """Every job's events form a legal path, each transition starting where the last one ended."""
    state: dict[str, str] = {}
    bad = 0
    wanted = set(job_ids)
    cursor = "-"
    while True:
        batch = pool.events(after=cursor, count=5000)
        if cursor != "-":
            batch = batch[1:]
        if not batch:
            break
        for e in batch:
            job = e.get("job")
            if job not in wanted:
                continue
            frm, to = e["from"], e["to"]
            if (frm, to) not in LEGAL or state.get(job, "") != frm:
                bad += 1
                print(f"soak: illegal transition for {job}: {state.get(job, '')!r} then {frm!r}->{to!r} "
                      f"({e['reason']})", file=sys.stderr)
            state[job] = to
        cursor = batch[-1]["id"]
    return bad


def run_soak(jobs: int = 300, slots: int = 3, workers: int = 4, seed: int = 1, max_minutes: float = 40.0,
             fault_every: tuple[float, float] = (1.0, 3.0), rounds: int = 1,
             faults: tuple[str, ...] = FAULTS, rollback_anywhere: bool = True) -> Figures:
    """Faults are drawn in seeded rounds that each hold every kind once, so even a short soak meets them all
    (`rounds` times each, at least). A fault counts once it met live jobs; one that could not (an armed one
    whose moment has not come yet, a rollback that took back no transition) is drawn again. `faults` narrows
    the kinds drawn (to hammer one while investigating it). `rollback_anywhere` (the default): a Redis
    rollback may also restore a delivery a worker had just taken from RQ's queue (see `Chaos._copy_aof`)."""
    rng = random.Random(seed)
    figures = Figures(jobs=jobs)
    root = Path(tempfile.mkdtemp(prefix="jobpool-soak-"))
    print(f"soak: logs in {root}", file=sys.stderr)
    redis_server, daemons = RedisServer(), [DockerDaemon(), DockerDaemon()]
    fleet: Fleet | None = None
    sampler: Sampler | None = None
    chaos: Chaos | None = None
    t0 = time.monotonic()
    try:
        redis_server.start(appendonly=True)
        for daemon in daemons:
            daemon.start()
            daemon.import_busybox_image(IMAGE)
        env = {**TIMINGS, "JOBPOOL_REDIS_URL": redis_server.url, "JOBPOOL_POOL": POOL,
               "JOBPOOL_EXECUTOR": "docker", "JOBPOOL_STATE_DIR": str(root)}
        pool = Pool.from_env(env=env)
        pool.set_slots(slots)
        job_ids = [pool.enqueue(IMAGE, job_command(rng)).id for _ in range(jobs)]
        fleet = Fleet(root, {**os.environ, **env}, redis_server, daemons, workers)
        sampler = Sampler([d.host for d in daemons], slots, figures)
        sampler.start()
        # Its own generator: what the armed faults pick depends on when they are met, the schedule must not.
        chaos = Chaos(random.Random(seed + 1), fleet, redis_server, pool, figures, root, rollback_anywhere)
        drive(pool, chaos, rng, figures, job_ids, t0 + max_minutes * 60, fault_every, rounds, faults)
        chaos.disarm()
        sampler.stop()
        tally(pool, figures, job_ids)
        write_findings(pool, figures, root, slots)
    finally:
        figures.wall_secs = time.monotonic() - t0
        if chaos is not None:
            chaos.disarm()
            chaos.close()
        if sampler is not None:
            sampler.stop()
        if fleet is not None:
            fleet.close()
        for n, daemon in enumerate(daemons, 1):  # its log goes with the others, the rest is deleted
            with contextlib.suppress(OSError):
                shutil.copy2(daemon.dir / "dockerd.log", root / f"dockerd-d{n}.log")
            daemon.close()
        redis_server.close()
    return figures


def drive(pool: Pool, chaos: Chaos, rng: random.Random, figures: Figures, job_ids: list[str], deadline: float,
          fault_every: tuple[float, float], rounds: int, faults: tuple[str, ...]) -> None:
    """The main loop: feed the queue until every fault kind met live jobs, inject faults on the schedule,
    resume what was paused, until nothing is left to run (or the deadline)."""
    next_fault = time.monotonic() + rng.uniform(*fault_every)
    paused_seen: dict[str, float] = {}
    schedule: list[str] = []
    while time.monotonic() < deadline:
        try:
            counts = pool.stats()["counts"]
        except JobpoolError:
            counts = None
        if counts is not None and counts["queued"] + counts["running"] + counts["paused"] == 0:
            if min(figures.faults[kind] for kind in faults) >= rounds:
                return
            # Every fault kind must meet live jobs at least once: keep the queue fed until it has.
            job_ids += [pool.enqueue(IMAGE, job_command(rng)).id for _ in range(5)]
            figures.jobs = len(job_ids)
        for gone in chaos.fleet.revive():
            figures.unexpected_exits += 1
            print(f"soak: {gone}; started again", file=sys.stderr)
        met = [(kind, int(time.time() * 1000)) for kind in chaos.poll()]
        if counts is not None and time.monotonic() >= next_fault:
            if not schedule:
                schedule = rng.sample(faults, len(faults))
            kind = schedule.pop()
            at_ms = int(time.time() * 1000)
            if chaos.inject(kind, job_ids):
                met.append((kind, at_ms))
            elif kind not in ARMED:
                figures.missed[kind] += 1
                schedule.append(kind)  # the next fault drawn
            next_fault = time.monotonic() + rng.uniform(*fault_every)
        count_met(pool, figures, met)
        if counts is not None and counts["paused"]:
            resume_paused(pool, paused_seen)
        time.sleep(0.2)


def count_met(pool: Pool, figures: Figures, met: list[tuple[str, int]]) -> None:
    """Count the faults that met live jobs, and how long the queue took to move again after each crash."""
    for kind, at_ms in met:
        figures.faults[kind] += 1
        if kind not in ("cancel", "pause_resume", "slow_launch", "lost_reply"):
            took = progress_after(pool, at_ms, timeout=30)
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


def tally(pool: Pool, figures: Figures, job_ids: list[str]) -> None:
    """Every job's end: lost (no row), stuck (not terminal), or its outcome; then the transitions check."""
    for job_id in job_ids:
        try:
            job = pool.get(job_id)
        except JobpoolError:
            figures.lost += 1
            print(f"soak: lost {job_id}", file=sys.stderr)
            continue
        figures.outcomes[job.state.value] += 1
        if job.state == JobState.FAILED:
            figures.failure_reasons[job.error_reason] += 1
        if not job.state.terminal:
            figures.stuck += 1
            figures.stuck_jobs.append(job_id)
            print(f"soak: stuck {job_id} in {job.state.value}", file=sys.stderr)
    figures.illegal_transitions = check_transitions(pool, job_ids)
    for job_id in figures.held_launches:  # each must end normally, run once (the sampler judges that)
        with contextlib.suppress(JobpoolError):
            job = pool.get(job_id)
            print(f"soak: held launch of {job_id}: {job.state.value} at attempt {job.attempt}",
                  file=sys.stderr)


def write_findings(pool: Pool, figures: Figures, root: Path, slots: int) -> None:
    """For each instant that broke a zero, and each job left stuck: what ran, every event of the jobs
    involved, their rows and what RQ holds of them, and the events the Redis rollbacks took back, in
    `findings.txt` under the soak's dir (its logs are there too)."""
    if not figures.findings and not figures.stuck_jobs:
        return
    jobs = sorted({job for f in figures.findings for job, *_ in f["live"]} | set(figures.stuck_jobs))
    events = [e for e in all_events(pool) if e.get("job") in jobs]
    lines = [finding_line(f, slots) for f in figures.findings]
    for job in jobs:
        lines.append(f"job {job}{' (stuck)' if job in figures.stuck_jobs else ''}: {rq_facts(pool, job)}")
        lines += [f"  {e['id']} {e['from']}->{e['to']} {e['reason']} "
                  f"{ {k: v for k, v in e.items() if k not in ('id', 'job', 'from', 'to', 'reason')} }"
                  for e in events if e["job"] == job]
    for rb in figures.rollbacks:
        lines.append(f"rollback at {rb['at']:.3f} to {rb['restored_to']}, took back:")
        lines += [f"  {e['id']} {e.get('job')} {e.get('from')}->{e.get('to')} {e.get('reason')}"
                  for e in rb["lost"]]
    (root / "findings.txt").write_text("\n".join(lines) + "\n")
    print(f"soak: findings written to {root / 'findings.txt'}", file=sys.stderr)


def rq_facts(pool: Pool, job_id: str) -> str:
    """The job's row, lease, and where RQ holds it (queue, intermediate list, started registry, its status),
    read raw: what the supervisor's evidence is made of."""
    c, k = pool.client, pool.keys
    started = f"rq:wip:{k.rq_queue_name}"
    try:
        return str({
            "row": c.hgetall(k.job(job_id)), "lease": c.get(k.lease(job_id)),
            "lease_pttl": c.pttl(k.lease(job_id)), "rq_queue_pos": c.lpos(k.rq_queue, job_id),
            "rq_intermediate_pos": c.lpos(k.rq_intermediate, job_id),
            "rq_started": [(m, sc) for m, sc in c.zrange(started, 0, -1, withscores=True)
                           if m.startswith(job_id)],
            "rq_status": c.hget(f"rq:job:{job_id}", "status"), "redis_time": c.time()})
    except Exception as exc:  # noqa: BLE001 - a report: say what could not be read
        return f"(unreadable: {exc})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--slots", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-minutes", type=float, default=40.0)
    ap.add_argument("--faults", default=",".join(FAULTS),
                    help="comma-separated fault kinds to draw (default: all)")
    ap.add_argument("--rollback-quiet", action="store_true",
                    help="copy the AOF for a Redis rollback only while no RQ delivery is in flight")
    args = ap.parse_args()
    faults = tuple(k for k in args.faults.split(",") if k)
    if not faults or set(faults) - set(FAULTS):
        ap.error(f"--faults: choose among {','.join(FAULTS)}")
    figures = run_soak(args.jobs, args.slots, args.workers, args.seed, args.max_minutes, faults=faults,
                       rollback_anywhere=not args.rollback_quiet)
    print(figures.line())
    print(json.dumps({"zeros_hold": figures.zeros_hold()}))
    return 0 if figures.zeros_hold() else 1


if __name__ == "__main__":
    sys.exit(main())
