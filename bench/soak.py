"""Chaos soak: real redis-server (AOF), real dockerd, real workers and supervisor, faults on a seeded schedule.

    python3 bench/soak.py [--jobs 300] [--slots 3] [--workers 4] [--seed 1] [--max-minutes 40]

Faults: SIGKILL a worker (and its forked horse), SIGTERM a worker (drain), kill and restart the supervisor,
stop and restart dockerd, kill -9 and restart redis-server (AOF, fsync always), cancel and pause/resume random
jobs. It runs until every job is terminal (bounded in time) and prints one line of figures. The promises are
the zeros: lost jobs, instants over the slot limit (the daemon sampled), jobs with two live containers at
once, jobs stuck non-terminal, and illegal transitions in the events stream.

`tests/integration/test_soak.py` runs it small in CI and asserts the same zeros.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests"), str(HERE.parent)]

import docker  # noqa: E402
import redis  # noqa: E402
from procs import JobpoolProcess  # noqa: E402
from servers import DockerDaemon, RedisServer  # noqa: E402

from jobpool import JobState, Pool  # noqa: E402
from jobpool.errors import JobpoolError  # noqa: E402

IMAGE = "jobpool-test:busybox"
POOL = "soak"
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
          "cancel", "pause_resume")
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

    def line(self) -> str:
        rec = " ".join(
            f"{k}={statistics.median(v):.1f}/{max(v):.1f}s" for k, v in sorted(self.recovery.items()) if v)
        faults = ",".join(f"{k}:{v}" for k, v in sorted(self.faults.items()))
        outcomes = ",".join(f"{k}:{v}" for k, v in sorted(self.outcomes.items()))
        if self.failure_reasons:
            outcomes += " failed_by:" + ",".join(f"{k}:{v}" for k, v in sorted(self.failure_reasons.items()))
        return (f"soak: jobs={self.jobs} outcomes=[{outcomes}] faults=[{faults}] lost={self.lost} "
                f"over_limit_instants={self.over_limit_instants} "
                f"double_container_jobs={len(self.double_container_jobs)} stuck={self.stuck} "
                f"illegal_transitions={self.illegal_transitions} samples={self.samples} "
                f"recovery(median/max)=[{rec}] wall={self.wall_secs:.0f}s")

    def zeros_hold(self) -> bool:
        return not (self.lost or self.over_limit_instants or self.double_container_jobs or self.stuck
                    or self.illegal_transitions)


class Fleet:
    """The processes under test, each restartable, all stopped by pid."""

    def __init__(self, root: Path, env: dict[str, str], workers: int) -> None:
        self.root, self.env = root, env
        self.workers: list[JobpoolProcess | None] = [None] * workers
        self.supervisor: JobpoolProcess | None = None
        self._n = 0
        for i in range(workers):
            self.start_worker(i)
        self.start_supervisor()

    def _spawn(self, args: tuple[str, ...]) -> JobpoolProcess:
        self._n += 1
        return JobpoolProcess("jobpool.cli", self.env, self.root / f"{args[0]}-{self._n}.log", args)

    def start_worker(self, i: int) -> None:
        self.workers[i] = self._spawn(("worker",))

    def start_supervisor(self) -> None:
        self.supervisor = self._spawn(("supervisor",))

    def close(self) -> None:
        for p in [*self.workers, self.supervisor]:
            if p is not None:
                p.stop(timeout=15)


def sample_daemon(host: str, slots: int, figures: Figures, stop: threading.Event) -> None:
    """Count job containers running at each instant (while the daemon answers): over the limit, or two of one job."""
    client = docker.DockerClient(base_url=host, timeout=5)
    while not stop.is_set():
        try:
            running = client.containers.list(sparse=True, filters={"label": f"jobpool.pool={POOL}",
                                                                    "status": "running"})
        except Exception:  # noqa: BLE001 - the daemon is down on purpose at times: no sample then
            stop.wait(0.2)
            continue
        figures.samples += 1
        if len(running) > slots:
            figures.over_limit_instants += 1
        per_job = Counter((c.attrs.get("Labels") or {}).get("jobpool.job_id") for c in running)
        figures.double_container_jobs |= {j for j, n in per_job.items() if n > 1}
        stop.wait(0.05)
    client.close()


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


def inject(kind: str, rng: random.Random, fleet: Fleet, redis_server: RedisServer, daemon: DockerDaemon,
           pool: Pool, job_ids: list[str]) -> None:
    if kind == "worker_sigkill":
        i = rng.randrange(len(fleet.workers))
        w = fleet.workers[i]
        if w is not None:
            w.kill_with_children()
        fleet.start_worker(i)
    elif kind == "worker_sigterm":
        i = rng.randrange(len(fleet.workers))
        w = fleet.workers[i]
        if w is not None:
            w.stop(timeout=30)
        fleet.start_worker(i)
    elif kind == "supervisor_restart":
        if fleet.supervisor is not None:
            fleet.supervisor.kill_with_children()
        fleet.start_supervisor()
    elif kind == "dockerd_restart":
        daemon.stop()
        time.sleep(rng.uniform(0.5, 3.0))  # the outage itself: its length is what is being tested
        daemon.start()
    elif kind == "redis_restart":
        redis_server.kill()
        redis_server.restart()
    elif kind in ("cancel", "pause_resume"):
        job_id = rng.choice(job_ids)
        try:
            if kind == "cancel":
                pool.cancel(job_id)
            else:
                pool.pause(job_id)  # the main loop resumes it a little later
        except JobpoolError:
            pass  # finished already, or Redis is restarting: a user would see the same


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
             fault_every: tuple[float, float] = (1.0, 3.0)) -> Figures:
    """Faults are drawn in seeded rounds that each hold every kind once, so even a short soak meets them all."""
    rng = random.Random(seed)
    figures = Figures(jobs=jobs)
    root = Path(tempfile.mkdtemp(prefix="jobpool-soak-"))
    redis_server, daemon = RedisServer(), DockerDaemon()
    fleet: Fleet | None = None
    stop = threading.Event()
    t0 = time.monotonic()
    try:
        redis_server.start(appendonly=True)
        daemon.start()
        daemon.import_busybox_image(IMAGE)
        env = {**TIMINGS, "JOBPOOL_REDIS_URL": redis_server.url, "JOBPOOL_POOL": POOL,
               "JOBPOOL_EXECUTOR": "docker", "DOCKER_HOST": daemon.host, "JOBPOOL_STATE_DIR": str(root)}
        pool = Pool.from_env(env=env)
        pool.set_slots(slots)
        job_ids = [pool.enqueue(IMAGE, job_command(rng)).id for _ in range(jobs)]
        fleet = Fleet(root, {**os.environ, **env}, workers)
        sampler = threading.Thread(target=sample_daemon, args=(daemon.host, slots, figures, stop), daemon=True)
        sampler.start()
        deadline = t0 + max_minutes * 60
        next_fault = time.monotonic() + rng.uniform(*fault_every)
        paused_seen: dict[str, float] = {}
        schedule: list[str] = []
        while time.monotonic() < deadline:
            try:
                counts = pool.stats()["counts"]
            except JobpoolError:
                counts = None
            if counts is not None and counts["queued"] + counts["running"] + counts["paused"] == 0:
                if set(figures.faults) >= set(FAULTS):
                    break
                # Every fault kind must meet live jobs at least once: keep the queue fed until it has.
                job_ids += [pool.enqueue(IMAGE, job_command(rng)).id for _ in range(5)]
                figures.jobs = len(job_ids)
            if counts is not None and time.monotonic() >= next_fault:
                if not schedule:
                    schedule = rng.sample(FAULTS, len(FAULTS))
                kind = schedule.pop()
                at_ms = int(time.time() * 1000)
                inject(kind, rng, fleet, redis_server, daemon, pool, job_ids)
                figures.faults[kind] += 1
                if kind not in ("cancel", "pause_resume"):
                    took = progress_after(pool, at_ms, timeout=30)
                    if took is not None:
                        figures.recovery[kind].append(took)
                next_fault = time.monotonic() + rng.uniform(*fault_every)
            # The user who paused a job resumes it a second or so later.
            if counts is not None and counts["paused"]:
                try:
                    for job in pool.list(JobState.PAUSED, limit=100):
                        if time.monotonic() - paused_seen.setdefault(job.id, time.monotonic()) > 1.0:
                            pool.resume(job.id)
                            paused_seen.pop(job.id)
                except JobpoolError:
                    pass
            time.sleep(0.2)
        stop.set()
        sampler.join(10)
        for job_id in job_ids:
            try:
                job = pool.get(job_id)
            except JobpoolError:
                figures.lost += 1
                continue
            figures.outcomes[job.state.value] += 1
            if job.state == JobState.FAILED:
                figures.failure_reasons[job.error_reason] += 1
            if not job.state.terminal:
                figures.stuck += 1
        figures.illegal_transitions = check_transitions(pool, job_ids)
    finally:
        stop.set()
        figures.wall_secs = time.monotonic() - t0
        if fleet is not None:
            fleet.close()
        daemon.close()
        redis_server.close()
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--slots", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-minutes", type=float, default=40.0)
    args = ap.parse_args()
    figures = run_soak(args.jobs, args.slots, args.workers, args.seed, args.max_minutes)
    print(figures.line())
    print(json.dumps({"zeros_hold": figures.zeros_hold()}))
    return 0 if figures.zeros_hold() else 1


if __name__ == "__main__":
    sys.exit(main())
