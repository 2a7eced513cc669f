"""A Redis that can lose data is refused; one that refuses writes is waited out, with nothing half-written.

At its memory limit Redis either evicts keys (`allkeys-*`: job rows vanish with no trace; `volatile-*`:
leases and boot records, whose loss makes live work look dead) or refuses writes (`noeviction`, OOM), as a
replica refuses them (READONLY). Workers, the supervisor and `jobpool up` refuse to start on an evicting
Redis with one line and write nothing; `volatile-*` and a policy that cannot be read are one warning;
`noeviction` is silent; `jobpool status` is unhealthy on an evicting Redis (jobpool/store/redispolicy.py).
Under OOM or READONLY an API call is a typed error that leaves the keyspace as it was, and a worker keeps its
job until its finish lands. Every case runs against a real redis-server of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest
import redis

from jobpool import JobState, Pool, RedisUnavailable
from jobpool.store import runner
from jobpool.store.redispolicy import FIX, ROW_LISTPACK_SETTING, ROW_LISTPACK_VALUE, SETTING
from tests.support.constants import SUB
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.servers import RedisServer, admin_of, redis_server_binary
from tests.support.snapshot import keyspace
from tests.support.upstack import Stacks, fast_env, redis_servers_in

#: What each refusal and warning names: the setting, and the command that fixes it.
NAMES = (SETTING, FIX)
#: How long a fault is held once it bites: several retries at the workers' longest backoff.
FAULT_SECS = 4.0


@contextlib.contextmanager
def raw_of(url: str) -> Iterator[redis.Redis]:
    """A client that returns bytes, for keyspace snapshots (tests/support/snapshot.py)."""
    with contextlib.closing(redis.Redis.from_url(url)) as client:
        yield client


def set_policy(server: RedisServer, policy: str) -> None:
    with admin_of(server) as admin:
        admin.config_set(SETTING, policy)


def policy_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if SETTING in line]


def seed(env: dict[str, str]) -> list[str]:
    """A pool with one job promoted (a worker would claim it, a sweep would judge it) and one queued."""
    pool = Pool.from_env(env=env)
    try:
        pool.set_slots(1)
        return [pool.enqueue("ignored", ["sh", "-c", "echo ran"]).id for _ in range(2)]
    finally:
        pool.close()


# ---- an evicting Redis: refused at every door, one line, nothing written ---------------------------------

DOORS = [
    pytest.param("jobpool.workers", (), id="python -m jobpool.workers"),
    pytest.param("jobpool.cli", ("worker",), id="jobpool worker"),
    pytest.param("jobpool.cli", ("supervisor",), id="jobpool supervisor"),
    pytest.param("jobpool.cli", ("supervisor", "--once"), id="jobpool supervisor --once"),
]


@pytest.mark.parametrize(("module", "args"), DOORS)
def test_an_evicting_redis_is_refused_in_one_line_and_nothing_is_written(
        private_redis: RedisServer, pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess],
        module: str, args: tuple[str, ...]) -> None:
    env = {**pool_env, **SUB, "JOBPOOL_REDIS_URL": private_redis.url}
    seed(env)
    set_policy(private_redis, "allkeys-lru")
    with raw_of(private_redis.url) as raw:
        before = keyspace(raw)
        process = spawn(module, args, **env)
        try:
            code = process.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"it started on an evicting Redis:\n{process.log()[-3000:]}")
        lines = process.log().strip().splitlines()
        assert code == 2 and len(lines) == 1, process.log()[-3000:]
        assert lines[0].startswith("Error: ") and "allkeys-lru" in lines[0], lines
        assert all(name in lines[0] for name in NAMES), lines
        assert keyspace(raw) == before


def run_a_job(env: dict[str, str], supervisor: JobpoolProcess) -> None:
    """A job runs to success, and the supervisor sweeps: both started, and work."""
    pool = Pool.from_env(env=env)
    try:
        job = pool.enqueue("ignored", ["sh", "-c", "echo ran"])
        assert pool.wait(job.id, timeout=30).state is JobState.SUCCEEDED, pool.logs(job.id)
    finally:
        pool.close()
    eventually(lambda: "sweep pool=" in supervisor.log(), timeout=30, message="the supervisor sweeping")


@pytest.mark.parametrize("policy", ["volatile-lru", "volatile-ttl", "noeviction"])
def test_volatile_policies_are_one_warning_and_noeviction_is_silent(
        private_redis: RedisServer, pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess],
        policy: str) -> None:
    env = {**pool_env, **SUB, "JOBPOOL_REDIS_URL": private_redis.url}
    set_policy(private_redis, policy)
    worker = spawn(**env)
    supervisor = spawn("jobpool.cli", ("supervisor",), **env)
    run_a_job(env, supervisor)
    for process in (worker, supervisor):
        said = policy_lines(process.log())
        if policy == "noeviction":
            assert said == [], said
        else:
            assert len(said) == 1 and " WARNING " in said[0] and policy in said[0], said
            assert "leases" in said[0] and all(name in said[0] for name in NAMES), said


def test_a_policy_that_cannot_be_read_is_one_warning_not_a_refusal(
        private_redis: RedisServer, pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess]) -> None:
    """A managed Redis may rename CONFIG away or deny it by ACL: jobpool then cannot tell, says so once,
    and runs (refusing would make it unusable there)."""
    with admin_of(private_redis) as admin:
        admin.acl_setuser("jp", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                          commands=["+@all", "-config"])
    url = f"redis://jp:pw@127.0.0.1:{private_redis.port}/0"
    env = {**pool_env, **SUB, "JOBPOOL_REDIS_URL": url}
    worker = spawn(**env)
    supervisor = spawn("jobpool.cli", ("supervisor",), **env)
    run_a_job(env, supervisor)
    for process in (worker, supervisor):
        said = policy_lines(process.log())
        assert len(said) == 1 and " WARNING " in said[0] and "could not be checked" in said[0], said
    pool = Pool.from_env(env=env)
    try:
        report = pool.status()
        assert report.to_dict()["redis"]["maxmemory_policy"] is None
        assert [w for w in report.health.warnings if "could not be checked" in w]
        assert not [r for r in report.health.reasons if SETTING in r]
    finally:
        pool.close()


# ---- `jobpool status` ------------------------------------------------------------------------------------

def status_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobpool.cli", "status", *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, check=False)


def test_status_reports_the_policy_and_an_evicting_one_is_unhealthy(
        private_redis: RedisServer, pool_env: dict[str, str]) -> None:
    # A pool healthy in every other respect: a sweep just recorded, no slot without a worker.
    env = {**pool_env, "JOBPOOL_REDIS_URL": private_redis.url, "JOBPOOL_SWEEP_INTERVAL_SECS": "600"}
    pool = Pool.from_env(env=env)
    try:
        pool.set_slots(0)
        swept = subprocess.run([sys.executable, "-m", "jobpool.cli", "supervisor", "--once"],
                               env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
                               check=False)
        assert swept.returncode == 0, swept.stderr
        ok = status_cli(env, "--json")
        assert ok.returncode == 0, ok.stdout
        assert json.loads(ok.stdout)["redis"]["maxmemory_policy"] == "noeviction"

        set_policy(private_redis, "volatile-lru")
        report = pool.status()
        assert report.healthy and [w for w in report.health.warnings if "volatile-lru" in w]

        set_policy(private_redis, "allkeys-lru")
        report = pool.status()
        assert not report.healthy and len(report.health.reasons) == 1, report.health
        assert "allkeys-lru" in report.health.reasons[0] and FIX in report.health.reasons[0]
        bad = status_cli(env, "--json")
        doc = json.loads(bad.stdout)
        assert bad.returncode == 1 and doc["healthy"] is False
        assert (doc["redis"]["maxmemory_policy"], doc["redis"]["maxmemory_policy_verdict"]) == (
            "allkeys-lru", "refuse")
        human = status_cli(env)
        assert human.returncode == 1 and "allkeys-lru" in human.stdout and FIX in human.stdout
    finally:
        pool.close()


# ---- `jobpool up` ----------------------------------------------------------------------------------------

def redis_server_wrapper(folder: Path, before: str = "", after: str = "") -> dict[str, str]:
    """A `redis-server` first on PATH that runs the real one with extra arguments: an operator's packaged
    Redis whose own config, or whose wrapper, sets a policy. Returns the environment `up` runs with."""
    real = redis_server_binary()
    assert real is not None
    folder.mkdir()
    wrapper = folder / "redis-server"
    wrapper.write_text(f'#!/bin/sh\ncase "$1" in --version|-v) exec {real} "$@";; esac\n'
                       f'exec {real} {before} "$@" {after}\n')
    wrapper.chmod(0o755)
    return {**fast_env(), "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture
def stacks(tmp_path: Path) -> Iterator[Stacks]:
    made = Stacks(tmp_path)
    yield made
    made.close()


def test_up_refuses_a_redis_that_evicts_and_leaves_nothing(
        tmp_path: Path, stacks: Stacks, redis_server_factory: Callable[[], RedisServer]) -> None:
    env = redis_server_wrapper(tmp_path / "bin", after="--maxmemory-policy allkeys-lru")
    up = stacks.start("--workers", "1", env=env)
    try:
        code = up.proc.wait(60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"up started on an evicting Redis:\n{up.log()}")
    err = up.stderr().strip().splitlines()
    assert code != 0 and len(err) == 1, (code, err, up.log())
    assert err[0].startswith("Error: ") and "allkeys-lru" in err[0] and all(n in err[0] for n in NAMES), err
    data = tmp_path / ".jobpool" / "redis"
    assert redis_servers_in(data) == set(), "its Redis was stopped"
    assert not (tmp_path / ".jobpool" / "up.json").exists()
    assert not list((tmp_path / ".jobpool" / "logs").glob("worker-*.log")), "no worker was started"
    # Nothing was written: the Redis it left, started again on its data, is empty.
    again = redis_server_factory()
    again.dir = data
    again.start(appendonly=True)
    with admin_of(again) as admin:
        assert admin.dbsize() == 0


def test_up_runs_its_redis_with_noeviction_whatever_that_redis_is_configured_with(
        tmp_path: Path, stacks: Stacks) -> None:
    conf = tmp_path / "evicting.conf"
    conf.write_text("maxmemory-policy allkeys-lru\n")  # a packaged config; up's arguments come after it
    env = redis_server_wrapper(tmp_path / "bin", before=str(conf))
    up = stacks.start("--workers", "1", env=env)
    state = up.ready()
    with contextlib.closing(redis.Redis.from_url(state["redis_url"], decode_responses=True)) as client:
        assert client.config_get(SETTING) == {SETTING: "noeviction"}
        # Memory, not safety: rows stay compact listpacks (bench/lifetime.py).
        assert client.config_get(ROW_LISTPACK_SETTING) == {ROW_LISTPACK_SETTING: str(ROW_LISTPACK_VALUE)}
    assert not policy_lines(up.log()) and not policy_lines(
        (tmp_path / ".jobpool" / "logs" / "worker-0.log").read_text())
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0, up.stderr()


# ---- a Redis that refuses writes: typed errors, nothing half-written, a running job kept ------------------

def indexes_agree(pool: Pool) -> list[str]:
    """Each job in the index of its row's state and in no other: what a half-written transition breaks."""
    k = pool.keys
    states = ("queued", "running", "paused", "succeeded", "failed", "cancelled")
    members = {s: set(cast("list[str]", pool.store.client.zrange(k.state_index(s), 0, -1))) for s in states}
    wrong = []
    for job_id in set().union(*members.values()):
        state = cast("str | None", pool.store.client.hget(k.job(job_id), "state"))
        where = [s for s in states if job_id in members[s]]
        if where != [state]:
            wrong.append(f"{job_id}: row {state}, indexed in {where}")
    return wrong


def fill_memory(admin: redis.Redis) -> None:
    """A memory limit below what Redis holds, with noeviction: every command that may grow it is OOM."""
    admin.config_set(SETTING, "noeviction")
    admin.config_set("maxmemory", str(int(admin.info("memory")["used_memory"]) // 2))


def seeded_pool(env: dict[str, str]) -> tuple[Pool, dict[str, str]]:
    pool = Pool.from_env(env=env)
    pool.set_slots(2)
    jobs = {name: pool.enqueue("ignored", ["true"]).id
            for name in ("running", "running too", "queued", "paused", "more")}
    pool.pause(jobs["paused"])
    return pool, jobs


def api_calls(pool: Pool, jobs: dict[str, str]) -> list[tuple[str, Callable[[], object]]]:
    return [
        ("enqueue", lambda: pool.enqueue("ignored", ["true"])),
        ("set_slots", lambda: pool.set_slots(3)),
        ("pause the queue", pool.pause),
        ("pause a job", lambda: pool.pause(jobs["queued"])),
        ("resume a job", lambda: pool.resume(jobs["paused"])),
        ("cancel a queued job", lambda: pool.cancel(jobs["more"])),
        ("evict", lambda: pool.evict(jobs["running"], 1)),
        ("cancel a running job", lambda: pool.cancel(jobs["running too"])),
    ]


def test_under_oom_an_api_call_is_refused_whole_or_done_whole(
        private_redis: RedisServer, pool_env: dict[str, str]) -> None:
    """Redis refuses a script at its first write that may grow memory, and lets one that has already
    written (a removal first) finish: a call is either a `RedisUnavailable` with the keyspace untouched or
    a whole transition, never half of one. What grows the pool (enqueue, more slots) is always refused."""
    pool, jobs = seeded_pool({**pool_env, "JOBPOOL_REDIS_URL": private_redis.url})
    try:
        with admin_of(private_redis) as admin, raw_of(private_redis.url) as raw:
            fill_memory(admin)
            for name, call in api_calls(pool, jobs):
                before = keyspace(raw)
                try:
                    call()
                except RedisUnavailable as exc:
                    assert "OOM" in str(exc) or "maxmemory" in str(exc), (name, exc)  # noqa: PT017 - may, not must, refuse
                    assert keyspace(raw) == before, f"{name}: refused, yet something was written"
                else:
                    assert name not in ("enqueue", "set_slots", "pause the queue"), f"{name} grew memory"
                assert indexes_agree(pool) == [], name
            admin.config_set("maxmemory", "0")
        assert pool.get(pool.enqueue("ignored", ["true"]).id), "writes are taken again"
    finally:
        pool.close()


def test_on_a_replica_every_api_call_is_refused_and_nothing_is_written(
        private_redis: RedisServer, redis_server_factory: Callable[[], RedisServer],
        pool_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A primary demoted to a replica (a failover) answers READONLY to every write. Each refusal is sent
    again while a failover may be under way (jobpool/store/runner.py): here one second of it, not fifteen,
    since no new primary comes."""
    monkeypatch.setattr(runner, "FAILOVER_RETRY_SECS", 1.0)
    primary, jobs = seeded_pool({**pool_env, "JOBPOOL_REDIS_URL": private_redis.url})
    primary.close()
    replica_server = redis_server_factory()
    replica_server.start()
    with admin_of(replica_server) as admin:
        admin.replicaof("127.0.0.1", str(private_redis.port))
        eventually(lambda: admin.info("replication").get("master_link_status") == "up", timeout=15,
                   message="the replica in sync")
    pool = Pool.from_env(env={**pool_env, "JOBPOOL_REDIS_URL": replica_server.url})
    try:
        with raw_of(replica_server.url) as raw, raw_of(private_redis.url) as on_primary:
            before = keyspace(raw)
            assert before == keyspace(on_primary) and before
            for name, call in api_calls(pool, jobs):
                with pytest.raises(RedisUnavailable, match=r"READONLY|read only"):
                    call()
                assert keyspace(raw) == before, f"{name}: refused, yet something was written"
    finally:
        pool.close()


def test_a_job_that_ends_under_oom_is_kept_by_its_worker_until_its_finish_lands(
        private_redis: RedisServer, pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess],
        tmp_path: Path) -> None:
    """The job ends while every write is refused: its lease cannot be renewed and its finish cannot be
    recorded. The worker keeps the exit code and retries; the supervisor, sweeping all along, must not take
    the lapsed lease and the gone process for a crash. Once memory is freed the finish lands: succeeded,
    attempt 1, run once."""
    env = {**pool_env, **SUB, "JOBPOOL_REDIS_URL": private_redis.url, "JOBPOOL_RECOVERY_BUDGET": "3"}
    pool = Pool.from_env(env=env)
    runs, go, ended = tmp_path / "runs", tmp_path / "go", tmp_path / "ended"
    try:
        script = f'echo "$JOBPOOL_ATTEMPT" >> {runs}; while [ ! -f {go} ]; do sleep 0.05; done; touch {ended}'
        job = pool.enqueue("ignored", ["sh", "-c", script])
        worker = spawn(**env)
        supervisor = spawn("jobpool.cli", ("supervisor",), **env)
        eventually(lambda: runs.exists() and pool.get(job.id).identity, timeout=30, message="job launched")
        with admin_of(private_redis) as admin:
            fill_memory(admin)
            go.touch()
            eventually(ended.exists, timeout=10, message="job ended")
            ends = time.monotonic() + FAULT_SECS  # several leases (1 s) and sweeps (0.5 s) long
            while time.monotonic() < ends:
                row = pool.get(job.id)
                assert (row.state, row.attempt) == (JobState.RUNNING, 1), (row, supervisor.log()[-3000:])
                assert worker.proc.poll() is None and supervisor.proc.poll() is None
                time.sleep(0.2)
            admin.config_set("maxmemory", "0")
        done = pool.wait(job.id, timeout=20)
        assert (done.state, done.attempt, done.exit_code) == (JobState.SUCCEEDED, 1, 0), (
            worker.log()[-3000:], supervisor.log()[-3000:])
        assert runs.read_text().split() == ["1"], "the job ran once"
        assert pool.slots()[0] == 0
        assert "recording exit 0: redis did not answer (redis refused finish" in worker.log(), "refused"
        assert worker.proc.poll() is None and supervisor.proc.poll() is None
    finally:
        go.touch()
        pool.close()

