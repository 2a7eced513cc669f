"""Order and limits (docs/architecture.md, "Order and limits") with real processes: a real redis-server, the
session's real dockerd, real workers (and a real supervisor where a job's evidence must be judged).

What each test checks is what Docker ran, never only what Redis says: the order the daemon started the
containers in (its event log), and what it listed as running, sampled every few tens of milliseconds while
the jobs run (as bench/soak_fleet.py's Sampler does), against the priorities, weights and limits the jobs
were given. Where a limit is tested the fleet has more workers than the limit lets run at once, so a limit
the scripts did not keep would show as containers running together.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest
import redis
import requests

from jobpool import JobState, Pool
from jobpool.contract import LABEL_JOB, LABEL_POOL
from tests.support.bad_input import cli, one_line_error
from tests.support.constants import IMAGE
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.servers import DockerDaemon
from tests.support.snapshot import keyspace


def sleeping(secs: float) -> list[str]:
    """A job that runs long enough to be listed many times by the sampler."""
    return ["sh", "-c", f"sleep {secs}"]


class Running:
    """Lists the pool's running job containers on one daemon every 20 ms, in a thread: each listing is one
    sample, the set of job ids running then. A listing the daemon does not answer (it is down on purpose)
    is no sample."""

    def __init__(self, host: str, pool: Pool) -> None:
        self.client = docker.DockerClient(base_url=host, timeout=5)
        self.label = f"{LABEL_POOL}={pool.keys.pool}"
        self.samples: list[frozenset[str]] = []
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._halt.is_set():
            try:
                found = self.client.api.containers(filters={"label": self.label, "status": "running"})
            except (docker.errors.DockerException, requests.exceptions.RequestException):
                found = None
            if found is not None:
                self.samples.append(frozenset((c.get("Labels") or {}).get(LABEL_JOB, "") for c in found))
            self._halt.wait(0.02)

    def __enter__(self) -> Running:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        self._thread.join(10)
        self.client.close()


def start_order(host: str, pool: Pool, ids: list[str], since: float) -> list[str]:
    """The jobs of `ids` whose containers the daemon started since `since` (epoch seconds), in the order it
    started them (its event log, to the nanosecond)."""
    with contextlib.closing(docker.DockerClient(base_url=host, timeout=10)) as client:
        events = list(client.api.events(since=int(since), until=int(time.time()) + 1, decode=True, filters={
            "type": "container", "event": "start", "label": f"{LABEL_POOL}={pool.keys.pool}"}))
    events.sort(key=lambda e: int(e["timeNano"]))
    started = [e["Actor"]["Attributes"][LABEL_JOB] for e in events]
    return [job_id for job_id in started if job_id in ids]


def workers(spawn: Callable[..., JobpoolProcess], n: int, **env: str) -> list[JobpoolProcess]:
    return [spawn(**env) for _ in range(n)]


def all_succeed(pool: Pool, ids: list[str], timeout: float = 60) -> None:
    for job_id in ids:
        done = pool.wait(job_id, timeout=timeout)
        assert done.state is JobState.SUCCEEDED, (job_id, done.state, done.error_reason)


def enough(samples: list[frozenset[str]], n: int = 20) -> list[frozenset[str]]:
    """The samples, once there are enough of them to say anything (the sampler ran while the jobs did)."""
    assert len(samples) >= n, f"only {len(samples)} samples of the running containers"
    return samples


def stream_index(pool: Pool) -> dict[tuple[str, str], int]:
    """(job, what happened: 'promoted', or a state entered) -> its place in the pool's event stream."""
    out: dict[tuple[str, str], int] = {}
    for i, e in enumerate(pool.events(count=10_000)):
        out.setdefault((e["job"], "promoted" if e["reason"] == "promoted" else e["to"]), i)
    return out


# ---- priority ------------------------------------------------------------------------------------------


def test_containers_start_in_priority_order_fifo_within_a_priority(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    since = time.time()
    pool.set_slots(0)
    priorities = [0, -5, 7, 0, 7, 1000, 0, -5, 1]
    ids = [pool.enqueue(IMAGE, ["true"], priority=p).id for p in priorities]
    spawn()
    pool.set_slots(1)
    all_succeed(pool, ids)
    expected = [job_id for _, _, job_id in sorted(
        (-p, i, job_id) for i, (p, job_id) in enumerate(zip(priorities, ids, strict=True)))]
    assert start_order(docker_host, pool, ids, since) == expected


# ---- weights and limits, sampled -----------------------------------------------------------------------


def test_weighted_jobs_never_run_over_the_slots(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    """Four workers could run four of these jobs at once (up to 7 slots); the pool has 3. Two long one-slot
    jobs come first, so a two-slot job behind them fits only if its weight is not counted."""
    pool.set_slots(3)
    workers(spawn, 4)
    jobs = [(1, 2.5), (1, 2.5), *[(w, 0.8) for w in (2, 1, 2, 1, 1, 2, 1, 2)]]
    with Running(docker_host, pool) as running:
        ids = [pool.enqueue(IMAGE, sleeping(secs), slots=w).id for w, secs in jobs]
        all_succeed(pool, ids)
    weight = dict(zip(ids, [w for w, _ in jobs], strict=True))
    used = [sum(weight[j] for j in s) for s in enough(running.samples)]
    assert max(used) == 3, f"the running weights reached {max(used)} (sampled)"
    assert pool.slots() == (0, 3)


def test_two_jobs_on_one_limit_never_overlap_while_others_run(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    pool.set_slots(6)
    pool.set_limit("db", 1)
    workers(spawn, 4)
    with Running(docker_host, pool) as running:
        writers = [pool.enqueue(IMAGE, sleeping(0.8), uses={"db": 1}).id for _ in range(3)]
        others = [pool.enqueue(IMAGE, sleeping(1.5)).id for _ in range(3)]
        all_succeed(pool, writers + others)
    samples = enough(running.samples)
    most = max(len(s & set(writers)) for s in samples)
    assert most == 1, f"{most} jobs using db ran at once (sampled)"
    assert any(s & set(writers) and s & set(others) for s in samples), "unrelated jobs ran beside a db job"
    assert [(u.name, u.size, u.used) for u in pool.limits()] == [("db", 1, 0)]


def test_a_pattern_limit_holds_each_name_apart(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    pool.set_slots(4)
    pool.set_limit("dataset:*", 1)
    workers(spawn, 4)
    with Running(docker_host, pool) as running:
        on_a = [pool.enqueue(IMAGE, sleeping(1), uses={"dataset:a": 1}).id for _ in range(2)]
        on_b = [pool.enqueue(IMAGE, sleeping(1), uses={"dataset:b": 1}).id for _ in range(2)]
        all_succeed(pool, on_a + on_b)
    samples = enough(running.samples)
    assert not [s for s in samples if set(on_a) <= s or set(on_b) <= s], "two jobs of one dataset ran at once"
    assert any(s & set(on_a) and s & set(on_b) for s in samples), "the two datasets ran at once"
    assert [(u.name, u.size, u.used) for u in pool.limits()] == [("dataset:*", 1, 0)]


# ---- a typo ----------------------------------------------------------------------------------------------


def test_a_name_no_limit_covers_is_refused_by_the_cli_and_writes_nothing(
        pool: Pool, pool_env: dict[str, str], raw: redis.Redis) -> None:
    pool.set_limit("gpu", 1)
    pool.enqueue(IMAGE, ["true"], uses={"gpu": 1})
    before = keyspace(raw)
    typo = cli("enqueue", "--uses", "gpus", IMAGE, "--", "true", env=pool_env)
    assert one_line_error(typo, 2) is None, one_line_error(typo, 2)
    assert "no limit covers gpus" in typo.stderr
    assert keyspace(raw) == before
    # The same command with the name spelled right is taken: the refusal was the name's.
    right = cli("enqueue", "--uses", "gpu", IMAGE, "--", "true", env=pool_env)
    assert right.returncode == 0, right.stderr
    assert keyspace(raw) != before


# ---- a reservation ends starvation ---------------------------------------------------------------------


def test_a_heavy_job_behind_a_stream_of_light_ones_gets_a_reservation_and_runs(
        pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    """Two slots, always a light job waiting: each light job that ends frees one slot and the next light one
    takes it, so the heavy job (2 slots) never finds both free, until its reservation holds the light ones
    back and the slots drain to it."""
    env = {**pool_env, "JOBPOOL_RESERVE_AFTER_SECS": "1"}
    with contextlib.closing(Pool.from_env(env=env)) as pool:
        pool.set_slots(2)
        workers(spawn, 2, JOBPOOL_RESERVE_AFTER_SECS="1")
        lights = [pool.enqueue(IMAGE, sleeping(1)).id for _ in range(2)]
        eventually(lambda: pool.slots() == (2, 2), timeout=30, message="two light jobs running")
        with Running(docker_host, pool) as running:
            heavy = pool.enqueue(IMAGE, sleeping(0.5), slots=2).id
            held_for_it: set[str] = set()

            def fed_until_heavy_starts() -> bool:
                if pool.get(heavy).state is not JobState.QUEUED:
                    return True
                queued = [j for j in lights[-4:] if pool.get(j).state is JobState.QUEUED]
                held_for_it.update(j for j in queued if any(
                    line.startswith(f"a reservation ahead of it: {heavy} ") for line in pool.why_waiting(j)))
                if len(queued) < 2:
                    lights.append(pool.enqueue(IMAGE, sleeping(1)).id)
                return False

            eventually(fed_until_heavy_starts, timeout=30, message="the heavy job starting")
            assert pool.wait(heavy, timeout=30).state is JobState.SUCCEEDED
            all_succeed(pool, lights)
        at = stream_index(pool)
        passed_it = [j for j in lights if at[(heavy, "queued")] < at[(j, "queued")] < at[(heavy, "promoted")]
                     and at[(j, "promoted")] < at[(heavy, "promoted")]]
        assert passed_it, "light jobs queued after the heavy one started before it: it was passed over"
        waiting = [j for j in lights if at[(j, "queued")] < at[(heavy, "promoted")] < at[(j, "promoted")]]
        assert waiting, "light jobs were still waiting when the heavy one started: the queue never ran dry"
        assert held_for_it, "a light job said the reservation held it back"
        samples = enough(running.samples)
        assert max(len(s) for s in samples if heavy in s) == 1, "the heavy job ran alone"
        assert max(len(s) for s in samples) == 2


# ---- groups take turns ---------------------------------------------------------------------------------


def test_a_groups_single_job_starts_within_the_first_two_after_a_burst(
        pool: Pool, spawn: Callable[..., JobpoolProcess], docker_host: str) -> None:
    since = time.time()
    pool.set_slots(0)
    burst = [pool.enqueue(IMAGE, ["true"], group="tenant-a").id for _ in range(6)]
    single = pool.enqueue(IMAGE, ["true"], group="tenant-b").id
    spawn()
    pool.set_slots(1)
    all_succeed(pool, [*burst, single])
    order = start_order(docker_host, pool, [*burst, single], since)
    assert sorted(order) == sorted([*burst, single]), "each job started once"
    assert single in order[:2], order
    assert [j for j in order if j != single] == burst, "a group's jobs keep their order"


# ---- a limit unit kept on unknown evidence -------------------------------------------------------------


#: Says it started, then waits until the test opens its gate (a file in a bind-mounted directory), so the test
#: decides when it ends, even while its daemon is down.
GATED = ["sh", "-c", "echo started; while [ ! -f /gate/open ]; do sleep 0.05; done"]


def started(host: str, job_id: str) -> bool:
    with contextlib.closing(docker.DockerClient(base_url=host, timeout=10)) as client:
        found = client.containers.list(filters={"label": f"{LABEL_JOB}={job_id}"})
        return any(b"started" in c.logs() for c in found)


@pytest.fixture
def daemon_back(docker_daemon: DockerDaemon) -> Iterator[DockerDaemon]:
    """The session's daemon, running again after the test whatever it did to it."""
    yield docker_daemon
    docker_daemon.ensure_running()


def test_a_limit_unit_is_kept_while_its_jobs_evidence_is_unknown(
        pool_env: dict[str, str], gate: Path, spawn: Callable[..., JobpoolProcess], docker_host: str,
        daemon_back: DockerDaemon) -> None:
    """The job holding `gpu` loses its worker and then its daemon: the supervisor cannot tell whether it
    runs, so it keeps the job's slot and its unit, sweep after sweep, and the second `gpu` job waits. Once the
    daemon is back the job is adopted and finishes; only then does the second start."""
    roots = {"JOBPOOL_BIND_ROOTS": str(gate)}
    with contextlib.closing(Pool.from_env(env={**pool_env, **roots})) as pool:
        pool.set_slots(2)
        pool.set_limit("gpu", 1)
        first_worker = spawn(**roots)
        with Running(docker_host, pool) as running:
            holder = pool.enqueue(IMAGE, GATED, mounts=[f"{gate}:/gate"], uses={"gpu": 1}).id
            eventually(lambda: started(docker_host, holder), timeout=30, message="the gpu job started")
            second = pool.enqueue(IMAGE, ["true"], uses={"gpu": 1}).id
            held = [f"gpu 1/1, needs 1, held by {holder}"]
            assert pool.why_waiting(second) == held

            first_owner = pool.get(holder).owner_boot
            first_worker.kill_with_children()  # its container runs on, nobody watching it
            eventually(lambda: not pool.store.client.exists(pool.keys.lease(holder)), timeout=10,
                       message="its lease lapsed")
            daemon_back.stop(signal.SIGKILL)  # live-restore: the container runs on
            sup = spawn(module="jobpool.cli", args=("supervisor",))
            kept = f"job {holder} (attempt 1) kept: "

            def kept_on_unknown(n: int) -> bool:
                assert pool.get(second).state is JobState.QUEUED, "the second gpu job started"
                assert pool.why_waiting(second) == held
                assert [(u.name, u.used) for u in pool.limits()] == [("gpu", 1)] and pool.slots() == (1, 2)
                return sup.log().count(kept) >= n

            eventually(lambda: kept_on_unknown(4), timeout=30, message="four sweeps keeping the gpu job")
            assert "probe_unknown" in next(line for line in sup.log().splitlines() if kept in line)
            assert pool.get(holder).state is JobState.RUNNING

            daemon_back.start()
            workers(spawn, 2, **roots)  # either could run the second job if its unit were free
            eventually(lambda: pool.get(holder).owner_boot not in ("", first_owner),
                       timeout=40, message="the gpu job adopted")
            assert pool.get(second).state is JobState.QUEUED and pool.why_waiting(second) == held
            (gate / "open").touch()
            assert pool.wait(holder, timeout=30).state is JobState.SUCCEEDED
            assert pool.wait(second, timeout=30).state is JobState.SUCCEEDED
        at = stream_index(pool)
        assert at[(holder, "succeeded")] < at[(second, "promoted")], "the second started after the first"
        assert not [s for s in enough(running.samples) if {holder, second} <= s], "never both running"
        assert "adopted" in [e["reason"] for e in pool.events(holder)]

