"""The soak of the subprocess executor: jobs that leave background children, under seeded faults.

    python3 -m bench.soak_subprocess [--jobs 60] [--slots 2] [--workers 3] [--seed 1] [--rounds 2]
                                     [--max-minutes 15] [--escape N]

A real redis-server (AOF), one supervisor and a few workers (`python -m jobpool.cli worker|supervisor`) with
`JOBPOOL_EXECUTOR=subprocess`, slots fewer than workers. Jobs of varied length, most of which leave processes
behind when their main process exits: `sleep N &` (short or long), a `setsid` child (a session of its own,
out of the job's process group), children and main processes that ignore SIGTERM; some checkpoint, some fail
on purpose (exit 3). Faults on a seeded schedule, each counted once it met a live job: a busy worker SIGKILLed
with its horses (its job runs on, orphaned), a busy worker SIGTERMed (drain), the supervisor killed and
started again, a cancel and a pause (resumed a second later) of a running job.

The promise judged is docs/architecture.md, "The subprocess executor's promise": every process a job started
is gone before its end is recorded and its slot is freed. A sampler thread reads every job's row (state and
attempt) and then scans /proc for the processes of the soak's jobs (each inherits `JOBPOOL_POOL`,
`JOBPOOL_JOB_ID` and `JOBPOOL_ATTEMPT`; a zombie has no environment and does no work). Since the rows are read
first, a process seen in the scan was alive after its row said what it said. The zeros:

- `over_limit_instants`: more jobs with live processes than slots at one instant;
- `after_end`: jobs with a process alive after their row was read terminal;
- `after_slot`: jobs with a process of an attempt whose slot was freed otherwise: its row read queued or
  paused at that attempt, or already at a later attempt;
- `lost`, `stuck`, `illegal_transitions`, `events_unseen` (the event stream followed live,
  bench/soak_watch.py; judged by bench/soak_report.py, as bench/soak.py does).

A worker SIGKILLed leaves its job's processes running, and the supervisor keeps the job's slot while any
process of its cgroup lives: it never signals a job it did not start, and its warning names the cgroup's
`cgroup.kill` for a person to end them. The soak is that person (`Person`): a few seconds after the
supervisor's log names a cgroup of the soak's jobs so, it writes 1 to that `cgroup.kill` (counted,
`leftovers_killed`). Then the supervisor finds the cgroup empty, removes it and hands the job back.

`--escape N` adds N jobs built to break the promise (a child that moves itself out of its job's cgroup, as a
job running as root can): the soak must then report `after_end` and exit non-zero.

It prints one line of figures and `{"zeros_hold": ...}` and exits non-zero when a zero broke; breaches.txt
(each instant that broke a zero with the jobs' events and rows) and findings.txt (bench/soak_report.py) go
beside the processes' logs. `tests/integration/test_soak.py` runs it small in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.soak import TIMINGS, Figures, Run, drive
from bench.soak_faults import Chaos
from bench.soak_fleet import Fleet, stamp
from bench.soak_report import rq_facts, tally, write_findings
from bench.soak_watch import TERMINAL, EventLog
from jobpool import JobState, Pool, jobcgroup
from jobpool.contract import ENV_ATTEMPT, ENV_JOB_ID, ENV_POOL
from jobpool.errors import JobpoolError
from jobpool.store.keys import PoolKeys
from tests.support.procs import children
from tests.support.servers import RedisServer

HERE = Path(__file__).resolve().parent

POOL = "subsoak"
FAULTS = ("worker_sigkill", "worker_sigterm", "supervisor_restart", "cancel", "pause_resume")
#: How long the person waits, after the supervisor's warning first names a cgroup, before killing it.
PERSON_SECS = 2.0
#: How often the sampler reads the rows and scans /proc.
SAMPLE_SECS = 0.05
#: The supervisor's warning for a job whose worker died, leaving processes in its cgroup
#: (jobpool/supervisor/apply.py, jobpool/supervisor/probes.py `probe_process`).
KEPT_FOR_LEFTOVERS = re.compile(r"job (\S+) \(attempt (\d+)\) kept: orphan_process_alive: .*?"
                                r"write 1 to (\S+/cgroup\.kill)")


def job_command(rng: random.Random) -> list[str]:
    """Jobs of varied length (0.3-3 s of main process); most leave processes behind when it exits."""
    secs = round(rng.uniform(0.3, 3.0), 1)
    kind = rng.random()
    if kind < 0.20:  # a short background child
        return ["sh", "-c", f"sleep 3 & sleep {secs}; exit 0"]
    if kind < 0.35:  # a long one: only a kill of its cgroup ends it
        return ["sh", "-c", f"sleep 60 & sleep {secs}; exit 0"]
    if kind < 0.50:  # a child in a session of its own, out of the job's process group
        return ["sh", "-c", f"setsid sh -c 'sleep 60' & sleep {secs}; exit 0"]
    if kind < 0.62:  # children and main process deaf to SIGTERM: a stop must kill them
        return ["sh", "-c", f"sh -c 'trap \"\" TERM; sleep 60' & trap '' TERM; sleep {secs}; exit 0"]
    if kind < 0.72:  # a double fork: the child's parent exits at once
        return ["sh", "-c", f"(sleep 60 &) ; sleep {secs}"]
    if kind < 0.82:  # checkpoints on SIGTERM, leaving a background child
        return ["sh", "-c",
                "sleep 60 & trap 'echo ck > \"$JOBPOOL_CHECKPOINT_DIR/ck\"; exit 75' TERM; "
                "[ -f \"$JOBPOOL_CHECKPOINT_DIR/ck\" ] && exit 0; "
                f"i=0; while [ $i -lt {int(secs * 10)} ]; do sleep 0.1; i=$((i+1)); done"]
    if kind < 0.88:  # fails on purpose, leaving a background child
        return ["sh", "-c", f"sleep 60 & sleep {secs}; exit 3"]
    return ["sh", "-c", f"sleep {secs}"]


#: A job built to break the promise, to show the soak sees it break: its child moves itself out of the job's
#: cgroup into the worker's (a job running as root can: "Not a sandbox") and outlives the job.
ESCAPER = ["sh", "-c", "sh -c 'echo $$ > \"$ESCAPE_TO\"; exec sleep 30' & sleep 1; exit 0"]


@dataclass
class SubFigures(Figures):
    """bench/soak.py's figures (what bench/soak_report.py fills in), and the processes' own zeros."""

    #: Jobs with a process alive after their row was read terminal; and after their slot was freed otherwise.
    after_end: set[str] = field(default_factory=set)
    after_slot: set[str] = field(default_factory=set)
    #: Each instant that broke a zero: when, what, and the processes seen (written to breaches.txt).
    breaches: list[dict[str, Any]] = field(default_factory=list)
    max_live_jobs: int = 0
    max_live_procs: int = 0
    #: Jobs whose slot the supervisor kept for processes left in their cgroup, and cgroups the person killed.
    kept_for_leftovers: set[str] = field(default_factory=set)
    leftovers_killed: int = 0
    #: Job cgroups of the soak's pool still there at the end (the worker or the supervisor removes them).
    cgroups_left: list[str] = field(default_factory=list)

    def line(self) -> str:
        faults = ",".join(f"{k}:{v}" for k, v in sorted(self.faults.items()))
        outcomes = ",".join(f"{k}:{v}" for k, v in sorted(self.outcomes.items()))
        if self.failure_reasons:
            outcomes += " failed_by:" + ",".join(f"{k}:{v}" for k, v in sorted(self.failure_reasons.items()))
        return (f"soak_subprocess: jobs={self.jobs} outcomes=[{outcomes}] faults=[{faults}] lost={self.lost} "
                f"over_limit_instants={self.over_limit_instants} after_end={len(self.after_end)} "
                f"after_slot={len(self.after_slot)} stuck={self.stuck} "
                f"illegal_transitions={self.illegal_transitions} events_unseen={self.events_unseen} "
                f"samples={self.samples} max_live_jobs={self.max_live_jobs} "
                f"max_live_procs={self.max_live_procs} kept_for_leftovers={len(self.kept_for_leftovers)} "
                f"leftovers_killed={self.leftovers_killed} cgroups_left={len(self.cgroups_left)} "
                f"unexpected_exits={self.unexpected_exits} wall={self.wall_secs:.0f}s")

    def zeros_hold(self) -> bool:
        return not (self.lost or self.over_limit_instants or self.after_end or self.after_slot or self.stuck
                    or self.illegal_transitions or self.events_unseen or self.pruned_unaccounted)


@dataclass
class SubRun(Run):
    def feed(self, n: int) -> None:
        self.job_ids += [self.pool.enqueue("ignored", job_command(self.rng)).id for _ in range(n)]
        self.figures.jobs = len(self.job_ids)


class SubFleet(Fleet):
    """One supervisor and `workers` workers on one host, no Docker and no proxies: bench/soak_fleet.py's
    Fleet for the rest (spawning, `kill_worker`, `revive`), every process stopped by its pid."""

    def __init__(self, root: Path, env: dict[str, str], workers: int) -> None:
        # Not Fleet.__init__: that one starts Docker daemons' proxies.
        self.root, self.env, self.daemons = root, env, []
        self.placement = [0] * workers
        self.workers = [None] * workers
        self.supervisor_hosts = [""]
        self.supervisors = [None]
        self.boots = {}
        self._n = 0
        for i in range(workers):
            self.start_worker(i)
        self.start_supervisor(0)

    def start_worker(self, i: int) -> None:
        self.workers[i] = self._spawn(f"worker{i}", {}, ("worker",))

    def start_supervisor(self, s: int) -> None:
        self.supervisors[s] = self._spawn("supervisor", {}, ("supervisor",))

    def busy(self, lasting_only: bool = False) -> list[int]:
        """Workers whose work horse runs a job: a horse with a child (a standby horse has none). Those whose
        job leaves a long-lived child (`sleep 60`) first, when there are any (only those with
        `lasting_only`): killed, theirs is a job whose leftovers only a person can end."""
        jobs = {i: [m for h in children(w.pid) for m in children(h)] for i, w in enumerate(self.workers)
                if w is not None and w.proc.poll() is None}
        busy = [i for i, mains in jobs.items() if mains]
        lasting = [i for i in busy if any(b"sleep 60" in cmdline(m) for m in jobs[i])]
        return lasting if lasting or lasting_only else busy

    def close(self) -> None:
        for p in [*self.workers, *self.supervisors]:
            if p is not None:
                p.stop(timeout=15)


class SubChaos(Chaos):
    """bench/soak_faults.py's injectors of the faults this fleet meets; a worker is killed or drained only
    while its horse runs a job, a running job is the one cancelled or paused."""

    fleet: SubFleet

    def __init__(self, rng: random.Random, fleet: SubFleet, pool: Pool, figures: SubFigures) -> None:
        # Not Chaos.__init__: that one opens a Docker client and the edge faults.
        self.rng, self.fleet, self.pool, self.figures = rng, fleet, pool, figures
        self.armed = {}

    def inject(self, kind: str, job_ids: list[str]) -> bool:
        if kind in ("cancel", "pause_resume"):
            try:
                running = [j.id for j in self.pool.list(JobState.RUNNING, limit=100)]
            except JobpoolError:
                return False
            if not running:
                return False
            self._user(kind, self.rng.choice(sorted(running)))
            return True
        return super().inject(kind, job_ids)

    def worker_sigkill(self) -> bool:
        """The first one kills a worker whose job leaves a long-lived child (it waits for one: the leftovers
        the person ends); later ones any busy worker, those first."""
        busy = self.fleet.busy(lasting_only=not self.figures.faults["worker_sigkill"])
        if not busy:
            return False
        i = self.rng.choice(busy)
        w = self.fleet.workers[i]
        mains = [m for h in children(w.pid) for m in children(h)] if w is not None else []
        job = " ".join(cmdline(m).decode(errors="replace").replace("\0", " ") for m in mains)
        self.note("worker_sigkill", f"{self._worker(i)} and its horses (its job runs on: {job})")
        self.fleet.kill_worker(i)
        return True

    def worker_sigterm(self) -> bool:
        busy = self.fleet.busy()
        if not busy:
            return False
        return self._sigterm(self.rng.choice(busy))

    def poll(self) -> list[str]:
        return []

    def disarm(self) -> None:
        pass

    def close(self) -> None:
        pass


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def job_processes(job_ids: set[str]) -> list[tuple[int, str, int]]:
    """(pid, job, attempt) of every live process of the soak's jobs, by the variables each inherits."""
    pool_var = f"{ENV_POOL}={POOL}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                data = f.read()
        except OSError:
            continue  # gone, or a kernel thread
        if pool_var not in data:
            continue
        env = dict(kv.partition(b"=")[::2] for kv in data.split(b"\0") if kv)
        if env.get(ENV_POOL.encode()) != POOL.encode():
            continue
        job = env.get(ENV_JOB_ID.encode(), b"").decode()
        if job not in job_ids:
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] == "Z":
            continue
        try:
            attempt = int(env.get(ENV_ATTEMPT.encode(), b"0"))
        except ValueError:
            attempt = 0
        found.append((int(name), job, attempt))
    return found


class ProcSampler(threading.Thread):
    """Reads every job's row, then scans the processes, and judges each process by the row read before it."""

    def __init__(self, url: str, job_ids: list[str], slots: int, figures: SubFigures) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)
        self.keys = PoolKeys(POOL)
        self.job_ids, self.slots, self.figures = job_ids, slots, figures
        self.said: set[tuple[str, tuple[int, ...]]] = set()
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(SAMPLE_SECS)

    def sample(self) -> None:
        ids = list(self.job_ids)
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(self.keys.job(job_id), "state", "attempt")
        try:
            rows = dict(zip(ids, pipe.execute(), strict=True))
        except redis.RedisError:
            return
        procs = job_processes(set(ids))
        f = self.figures
        f.samples += 1
        jobs = {job for _, job, _ in procs}
        f.max_live_jobs = max(f.max_live_jobs, len(jobs))
        f.max_live_procs = max(f.max_live_procs, len(procs))
        if len(jobs) > self.slots:
            f.over_limit_instants += 1
            self._breach("over_limit", procs, rows)
        for pid, job, attempt in procs:
            state, row_attempt = rows[job]
            at = int(row_attempt or 0)
            if state in TERMINAL:
                f.after_end.add(job)
                self._breach("after_end", [(pid, job, attempt)], rows)
            elif attempt < at or (attempt == at and state != "running"):
                f.after_slot.add(job)
                self._breach("after_slot", [(pid, job, attempt)], rows)

    def _breach(self, kind: str, procs: list[tuple[int, str, int]],
                rows: dict[str, list[str | None]]) -> None:
        """The first instant of each breach (its kind and the processes in it) is kept and said."""
        key = (kind, tuple(sorted(pid for pid, _, _ in procs)))
        if key in self.said:
            return
        self.said.add(key)
        what = ", ".join(f"pid {pid} of {job}#{att} (row {rows[job][0]} at attempt {rows[job][1]})"
                         for pid, job, att in procs)
        jobs = sorted({j for _, j, _ in procs})
        self.figures.breaches.append({"at": time.time(), "kind": kind, "jobs": jobs, "what": what})
        print(f"soak: {stamp(time.time())} {kind}: {what}", file=sys.stderr)

    def stop(self) -> None:
        if self.halt.is_set():
            return
        self.halt.set()
        self.join(10)
        self.sample()  # once more, every job ended
        self.client.close()


class Person(threading.Thread):
    """The person the supervisor's warning asks to end what a dead worker's job left running: PERSON_SECS
    after a warning first names the `cgroup.kill` of a cgroup of this pool's jobs, 1 is written to it."""

    def __init__(self, root: Path, figures: SubFigures) -> None:
        super().__init__(daemon=True)
        self.root, self.figures = root, figures
        self.offsets: dict[Path, int] = {}
        self.named: dict[str, float] = {}
        self.done: set[str] = set()
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.read()
            now = time.monotonic()
            for path, first in list(self.named.items()):
                if path not in self.done and now - first >= PERSON_SECS:
                    self.done.add(path)
                    self.kill(path)
            self.halt.wait(0.2)

    def read(self) -> None:
        for log in sorted(self.root.glob("supervisor-*.log")):
            try:
                with open(log, "rb") as f:
                    f.seek(self.offsets.get(log, 0))
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # whole lines only
            self.offsets[log] = self.offsets.get(log, 0) + end
            for m in KEPT_FOR_LEFTOVERS.finditer(data[:end].decode(errors="replace")):
                job, path = m.group(1), m.group(3)
                if f"/jobpool-{POOL}-{job}-" in path:  # only this soak's jobs' cgroups
                    self.figures.kept_for_leftovers.add(job)
                    self.named.setdefault(path, time.monotonic())

    def kill(self, path: str) -> None:
        try:
            Path(path).write_text("1")
        except FileNotFoundError:
            return  # emptied and removed meanwhile
        self.figures.leftovers_killed += 1
        print(f"soak: {stamp(time.time())} person: wrote 1 to {path}", file=sys.stderr)

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


def cgroups_left() -> list[str]:
    """Job cgroups of this pool left under this process's cgroup (where its workers make them)."""
    try:
        where = jobcgroup.directory(jobcgroup.own_path())
        return sorted(p.name for p in where.glob(f"jobpool-{POOL}-*"))
    except (jobcgroup.Unavailable, OSError):
        return []


def write_breaches(run: Run, root: Path) -> None:
    """Each instant that broke a process zero, then the events and rows of the jobs involved."""
    figures: SubFigures = run.figures  # type: ignore[assignment]
    if not figures.breaches and not figures.cgroups_left:
        return
    lines = [f"{stamp(b['at'])} {b['kind']}: {b['what']}" for b in figures.breaches]
    lines += [f"cgroup left: {name}" for name in figures.cgroups_left]
    for job in sorted({j for b in figures.breaches for j in b["jobs"]}):
        lines.append(f"job {job}: {rq_facts(run.pool, job)}")
        lines += [f"  {e['id']} {e['from']}->{e['to']} {e['reason']} {e.get('evidence', '')}"
                  for e in run.log.events if e.get("job") == job]
    (root / "breaches.txt").write_text("\n".join(lines) + "\n")
    print(f"soak: breaches written to {root / 'breaches.txt'}", file=sys.stderr)


def run_soak(jobs: int = 60, slots: int = 2, workers: int = 3, seed: int = 1, max_minutes: float = 15.0,
             fault_every: tuple[float, float] = (1.5, 3.0), rounds: int = 1,
             faults: tuple[str, ...] = FAULTS, escape: int = 0) -> SubFigures:
    """Faults are drawn in seeded rounds that each hold every kind once; one that met no live job (no busy
    worker, no running job) is drawn again. Runs until `jobs` were fed and every kind met live jobs `rounds`
    times, and every job ended (or `max_minutes`). `escape` > 0: that many jobs more built to break the
    promise (`ESCAPER`), to check that the soak sees it broken."""
    if slots >= workers:
        raise ValueError("slots must be fewer than workers")
    why = jobcgroup.unavailable()
    if why:
        raise RuntimeError(f"no job cgroup here ({why}): the subprocess executor cannot keep its promise")
    rng = random.Random(seed)
    figures = SubFigures(jobs=jobs)
    root = Path(tempfile.mkdtemp(prefix="jobpool-subsoak-"))
    print(f"soak: logs in {root}", file=sys.stderr)
    redis_server = RedisServer()
    fleet: SubFleet | None = None
    sampler: ProcSampler | None = None
    person: Person | None = None
    log: EventLog | None = None
    job_ids: list[str] = []
    t0 = time.monotonic()
    try:
        redis_server.start(appendonly=True)
        env = {**TIMINGS, "JOBPOOL_REDIS_URL": redis_server.url, "JOBPOOL_POOL": POOL,
               "JOBPOOL_EXECUTOR": "subprocess", "JOBPOOL_STATE_DIR": str(root)}
        log = EventLog(redis_server.url, PoolKeys(POOL))
        log.start()
        pool = Pool.from_env(env=env)
        pool.set_slots(slots)
        job_ids += [pool.enqueue("ignored", job_command(rng)).id for _ in range(jobs)]
        escape_to = str(jobcgroup.directory(jobcgroup.own_path()) / "cgroup.procs")
        job_ids += [pool.enqueue("ignored", ESCAPER, env={"ESCAPE_TO": escape_to}).id for _ in range(escape)]
        figures.jobs = len(job_ids)
        path = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
        fleet = SubFleet(root, {**os.environ, **env, "PYTHONPATH": path}, workers)
        sampler = ProcSampler(redis_server.url, job_ids, slots, figures)
        sampler.start()
        person = Person(root, figures)
        person.start()
        chaos = SubChaos(random.Random(seed + 1), fleet, pool, figures)
        run = SubRun(pool, chaos, log, rng, figures, job_ids, jobs)
        drive(run, t0 + max_minutes * 60, fault_every, rounds, faults)
        sampler.stop()
        person.stop()
        tally(run, root)
        write_findings(run, root, slots)
        fleet.close()
        figures.cgroups_left = cgroups_left()
        write_breaches(run, root)
    finally:
        figures.wall_secs = time.monotonic() - t0
        for thread in (sampler, person):
            if thread is not None:
                thread.stop()
        if fleet is not None:
            fleet.close()
        if log is not None:
            log.stop()
        redis_server.close()
        # Whatever of the soak's jobs still runs (a broken zero, or a soak stopped early) is killed by pid.
        for pid, _, _ in job_processes(set(job_ids)):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-minutes", type=float, default=15.0)
    ap.add_argument("--escape", type=int, default=0,
                    help="jobs more whose child leaves the job's cgroup: the zeros must then break")
    args = ap.parse_args()
    if args.slots >= args.workers:
        ap.error("--slots must be fewer than --workers")
    figures = run_soak(args.jobs, args.slots, args.workers, args.seed, args.max_minutes, rounds=args.rounds,
                       escape=args.escape)
    print(figures.line())
    print(json.dumps({"zeros_hold": figures.zeros_hold()}))
    return 0 if figures.zeros_hold() else 1


if __name__ == "__main__":
    sys.exit(main())
