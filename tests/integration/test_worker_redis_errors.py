"""A worker outlives Redis errors that pass by themselves, and a stopped idle worker exits 0.

RQ's work loop ends on any error but a dropped connection in its dequeue: a primary demoted to a replica
(READONLY), a full memory under `noeviction` (OOM) or a restart that hits the worker outside that one call
used to leave the pool without workers at the moment Redis came back. Each test puts a real redis-server into
that state while a real worker is idle, lifts it, and checks that the same process then runs a job.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import redis

from jobpool import JobState, Pool
from tests.support.constants import SUB
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.servers import RedisServer, admin_of

#: What the worker logs once when an outage starts (jobpool/workers/outage.py).
OUTAGE_WARNING = "Redis cannot serve"
#: How long each fault is held once the worker has met it: several retries at the longest backoff.
FAULT_SECS = 4.0


def idle_worker(server: RedisServer, pool_env: dict[str, str],
                spawn: Callable[..., JobpoolProcess]) -> tuple[dict[str, str], JobpoolProcess]:
    """A real subprocess-executor worker on `server`, once it is blocked in its dequeue (idle)."""
    env = {**pool_env, **SUB, "JOBPOOL_REDIS_URL": server.url}
    worker = spawn(**env)
    with admin_of(server) as admin:
        eventually(lambda: blocked_in_dequeue(admin), timeout=15, message="worker idle in its dequeue")
    return env, worker


def fill_memory(admin: redis.Redis) -> None:
    """A memory limit below what Redis holds, with noeviction: every write is refused with OOM."""
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", str(int(admin.info("memory")["used_memory"]) // 2))


def blocked_in_dequeue(admin: redis.Redis) -> bool:
    """Whether some client is blocked in BLMOVE: the worker waiting for a job on its (empty) queue."""
    return any(c["cmd"] == "blmove" and "b" in c["flags"] for c in admin.client_list())


def refused_dequeues(admin: redis.Redis) -> int:
    """How many BLMOVE calls the server refused before running them (READONLY, OOM)."""
    return int(admin.info("commandstats").get("cmdstat_blmove", {}).get("rejected_calls", 0))


def hold_fault(worker: JobpoolProcess, admin: redis.Redis, at_least: int) -> None:
    """The worker must retry its dequeue `at_least` times and stay alive for FAULT_SECS while refused."""
    def retried() -> bool:
        assert worker.proc.poll() is None, f"the worker exited on the fault:\n{worker.log()[-3000:]}"
        return refused_dequeues(admin) >= at_least
    eventually(retried, timeout=10, message="the worker retried its dequeue")
    ends = time.monotonic() + FAULT_SECS
    while time.monotonic() < ends:  # the fault lasts this long; the worker must live through it
        assert worker.proc.poll() is None, f"the worker exited on the fault:\n{worker.log()[-3000:]}"
        time.sleep(0.2)


def runs_a_job_then(env: dict[str, str], worker: JobpoolProcess) -> None:
    """A job enqueued now succeeds, run by `worker` (still the same process), and the outage was logged
    once, not once per retry."""
    pool = Pool.from_env(env=env)
    try:
        job = pool.enqueue("ignored", ["sh", "-c", "echo ran"])
        done = pool.wait(job.id, timeout=20)
        assert done.state == JobState.SUCCEEDED, worker.log()[-3000:]
        assert worker.proc.poll() is None
        claimed_by = [e["actor"] for e in pool.events(job.id) if e["reason"] == "claimed"]
        assert claimed_by
        # The boot record may have expired during the fault; the boot's next heartbeat writes it again.
        boot_pid = cast(str, eventually(lambda: pool.store.client.hget(pool.keys.boot(claimed_by[0]), "pid"),
                                        timeout=5, message="the claiming boot's record"))
        assert int(boot_pid) == worker.pid, "run by the worker that met the fault"
    finally:
        pool.store.client.close()
    assert worker.log().count(OUTAGE_WARNING) == 1, worker.log()[-3000:]


def test_worker_outlives_its_primary_turned_replica(
        private_redis: RedisServer, redis_server_factory: Callable[[], RedisServer],
        pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess]) -> None:
    other = redis_server_factory()
    other.start()
    env, worker = idle_worker(private_redis, pool_env, spawn)
    with admin_of(private_redis) as admin:
        # A demoted primary: the blocked BLMOVE is released with UNBLOCKED, every write then gets READONLY.
        admin.replicaof("127.0.0.1", str(other.port))
        hold_fault(worker, admin, at_least=3)
        # Promoted again. The sync from `other` emptied it, so the pool is set up only now.
        admin.replicaof("NO", "ONE")
    runs_a_job_then(env, worker)


def test_worker_outlives_redis_out_of_memory(
        private_redis: RedisServer, pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess]) -> None:
    env, worker = idle_worker(private_redis, pool_env, spawn)
    with admin_of(private_redis) as admin:
        fill_memory(admin)  # every write: OOM
        # Full memory does not wake a blocked client; its dequeue timing out (every few minutes) does.
        blocked = [c["id"] for c in admin.client_list() if c["cmd"] == "blmove" and "b" in c["flags"]]
        assert blocked and admin.client_unblock(int(blocked[0]), error=False)
        hold_fault(worker, admin, at_least=3)
        admin.config_set("maxmemory", "0")
    runs_a_job_then(env, worker)


def test_worker_outlives_a_redis_restart(private_redis: RedisServer, pool_env: dict[str, str],
                                         spawn: Callable[..., JobpoolProcess]) -> None:
    """RQ retried a dropped connection on its own, but logged every retry at ERROR and waited up to a
    minute between them; the worker now logs the outage once and resumes within seconds."""
    env, worker = idle_worker(private_redis, pool_env, spawn)
    private_redis.stop()
    eventually(lambda: OUTAGE_WARNING in worker.log(), timeout=10, message="the worker saw the outage")
    ends = time.monotonic() + FAULT_SECS
    while time.monotonic() < ends:
        assert worker.proc.poll() is None, f"the worker exited on the outage:\n{worker.log()[-3000:]}"
        time.sleep(0.2)
    private_redis.start()
    runs_a_job_then(env, worker)
    assert " ERROR " not in worker.log(), worker.log()[-3000:]


def test_idle_worker_stopped_exits_0(spawn: Callable[..., JobpoolProcess], redis_url: str) -> None:
    worker = spawn(**SUB)
    with contextlib.closing(redis.Redis.from_url(redis_url, decode_responses=True)) as admin:
        eventually(lambda: blocked_in_dequeue(admin), timeout=15, message="worker idle in its dequeue")
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0, worker.log()[-3000:]
    assert "logged above" not in worker.log()


def test_worker_still_dies_of_an_error_that_waiting_does_not_fix(
        private_redis: RedisServer, pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess]) -> None:
    """The queue key holding a string (WRONGTYPE on every dequeue) is not an outage: the loop ends, and the
    worker says so and exits 1 rather than retrying for ever."""
    env = {**pool_env, **SUB, "JOBPOOL_REDIS_URL": private_redis.url}
    worker = spawn(**env)
    pool = Pool.from_env(env=env)
    try:
        with admin_of(private_redis) as admin:
            eventually(lambda: blocked_in_dequeue(admin), timeout=15, message="worker idle in its dequeue")
            admin.set(pool.keys.rq_queue, "not a list")
            blocked = [c["id"] for c in admin.client_list() if c["cmd"] == "blmove" and "b" in c["flags"]]
            assert blocked and admin.client_unblock(int(blocked[0]), error=False)  # its dequeue timing out
    finally:
        pool.store.client.close()
    assert worker.wait(15) == 1
    assert "WRONGTYPE" in worker.log() and "logged above" in worker.log()
    assert OUTAGE_WARNING not in worker.log()


def test_worker_stopped_during_an_outage_exits_0(
        private_redis: RedisServer, pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess]) -> None:
    _env, worker = idle_worker(private_redis, pool_env, spawn)
    private_redis.stop()
    eventually(lambda: OUTAGE_WARNING in worker.log(), timeout=10, message="the worker saw the outage")
    worker.signal(signal.SIGTERM)
    assert worker.wait(20) == 0, worker.log()[-3000:]
    assert "logged above" not in worker.log() and "Traceback" not in worker.log()


def test_worker_outlives_redis_out_of_memory_during_a_job(
        private_redis: RedisServer, pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess],
        tmp_path: Path) -> None:
    """RQ's job heartbeats (every second while a job runs) met OOM and ended the work loop mid-job."""
    env = {**pool_env, **SUB, "JOBPOOL_REDIS_URL": private_redis.url}
    worker = spawn(**env)
    go = tmp_path / "go"
    pool = Pool.from_env(env=env)
    try:
        job = pool.enqueue("ignored", ["sh", "-c", f"while [ ! -f {go} ]; do sleep 0.05; done; echo ran"])
        eventually(lambda: pool.get(job.id).identity, timeout=20, message="job launched")
        with admin_of(private_redis) as admin:
            fill_memory(admin)
            ends = time.monotonic() + FAULT_SECS  # RQ's job heartbeats, one a second, are refused meanwhile
            while time.monotonic() < ends:
                assert worker.proc.poll() is None, f"the worker exited on the fault:\n{worker.log()[-3000:]}"
                time.sleep(0.2)
            admin.config_set("maxmemory", "0")
        go.touch()
        done = pool.wait(job.id, timeout=20)
        assert done.state == JobState.SUCCEEDED, worker.log()[-3000:]
    finally:
        go.touch()  # a failed run must not leave the job's loop running
        pool.store.client.close()
    runs_a_job_then(env, worker)
