"""A stray container: one the pool's rows no longer account for, left running by a worker that died after
Redis lost its claim (docs/architecture.md, "Strays").

The fault, as the adversarial runs found it with a failover to a lagging replica: a worker claims a job and
starts its container; the worker is SIGKILLed (its watcher with it); Redis comes back without the claim (here
deterministically: redis-server SIGKILLed and restarted from an RDB saved before the claim, the failure
tests/integration/test_redis_rollback.py uses); another worker claims the same attempt and runs it. The first
container has no watcher left, and its daemon's inventory lists it running. The workers on its daemon must
stop it within the bound architecture.md states (the settling lease, an inventory period and the stop grace),
record why in the job's history, and show it in `status` until it is gone.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import docker

from jobpool import JobState, Pool
from tests.support.constants import IMAGE
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.sentinels import SentinelGroup
from tests.support.servers import DockerDaemon, RedisServer

#: Inventories every 0.3 s: the bound below is dominated by the lease and the stop grace.
FLEET = {"JOBPOOL_INVENTORY_SECS": "0.3", "JOBPOOL_INVENTORY_STALE_SECS": "2"}
WAIT_FOR_GO = ["sh", "-c", "echo started; while [ ! -f /tmp/go ]; do sleep 0.1; done; echo finished"]


class Overlap(threading.Thread):
    """Samples the job's running containers on both daemons: how long two ran at once, and the peak."""

    def __init__(self, hosts: tuple[str, ...], job_id: str) -> None:
        super().__init__(daemon=True)
        self.clients = [docker.DockerClient(base_url=h, timeout=10) for h in hosts]
        self.job_id = job_id
        self.halt = threading.Event()
        self.two_since: float | None = None
        self.longest = 0.0
        self.peak = 0

    def run(self) -> None:
        while not self.halt.is_set():
            live = sum(len(c.containers.list(sparse=True, filters={"label": f"jobpool.job_id={self.job_id}",
                                                                    "status": "running"}))
                       for c in self.clients)
            now = time.monotonic()
            self.peak = max(self.peak, live)
            if live >= 2:
                self.two_since = self.two_since if self.two_since is not None else now
                self.longest = max(self.longest, now - self.two_since)
            else:
                self.two_since = None
            time.sleep(0.05)

    def close(self) -> None:
        self.halt.set()
        self.join(10)
        for c in self.clients:
            c.close()


def history(pool: Pool, job_id: str) -> list[list[str]]:
    raw = cast("str | None", pool.store.client.hget(pool.keys.job(job_id), "history")) or ""
    return [json.loads(line) for line in raw.split("\n") if line]


def test_a_container_left_running_after_redis_lost_its_claim_is_stopped_as_a_stray(
        redis_server_factory: Callable[[], RedisServer], pool_env: dict[str, str], docker_host: str,
        second_daemon: DockerDaemon, tmp_path: Path) -> None:
    """Redis restarted from an RDB saved before the claim."""
    server = redis_server_factory()
    server.start()  # no AOF, no automatic saves: only the SAVE below survives its SIGKILL
    env = {**pool_env, **FLEET, "JOBPOOL_REDIS_URL": server.url}

    def before_the_claim(pool: Pool) -> None:
        pool.store.client.save()

    def forget_the_claim() -> None:
        server.kill()
        server.start()  # back from the RDB saved before the claim

    stray_scenario(env, docker_host, second_daemon, tmp_path, before_the_claim, forget_the_claim)


def test_a_container_left_running_after_a_failover_to_a_lagging_replica_is_stopped_as_a_stray(
        redis_server: RedisServer, pool_env: dict[str, str], docker_host: str, second_daemon: DockerDaemon,
        tmp_path: Path) -> None:
    """The adversarial run's own fault: Sentinel promotes a replica cut off before the claim."""
    with SentinelGroup() as group:
        group.start()
        env = {**pool_env, **FLEET, "JOBPOOL_REDIS_URL": group.url}

        def before_the_claim(pool: Pool) -> None:
            group.cut_replica()

        stray_scenario(env, docker_host, second_daemon, tmp_path, before_the_claim, group.kill_primary)


def stray_scenario(env: dict[str, str], docker_host: str, second_daemon: DockerDaemon, tmp_path: Path,
                   before_the_claim: Callable[[Pool], None], forget_the_claim: Callable[[], object]) -> None:
    """A job's first container runs on `docker_host` under a worker that is then SIGKILLed; Redis forgets the
    claim (`forget_the_claim`); a worker on the other daemon claims the attempt again and runs it; a worker on
    the first daemon then publishes its inventory and must stop the first container as a stray."""
    second_daemon.ensure_running()
    second_daemon.remove_containers()
    pool = Pool.from_env(env=env)
    settings = pool.settings
    # The bound architecture.md states: Redis settles for a lease after it came back, the stray is found at
    # the next listing and stopped within the stop grace (this job ignores its stop signal: sh as PID 1), plus
    # a margin for a loaded machine (the worker's start, a listing, Docker's stop).
    bound = settings.lease_secs + settings.inventory_secs + settings.stop_grace_secs + 5.0
    job = pool.enqueue(IMAGE, WAIT_FOR_GO)
    assert pool.get(job.id).owner_boot == ""  # promoted, nobody claimed yet
    before_the_claim(pool)
    started: list[JobpoolProcess] = []

    def spawn(name: str, host: str) -> JobpoolProcess:
        p = JobpoolProcess("jobpool.workers", {**env, "DOCKER_HOST": host}, tmp_path / f"{name}.log")
        started.append(p)
        return p

    overlap = Overlap((docker_host, second_daemon.host), job.id)
    client = docker.DockerClient(base_url=docker_host, timeout=30)
    try:
        first_worker = spawn("first", docker_host)
        claimed = eventually(lambda: (r := pool.get(job.id)).container_id and r, timeout=30,
                             message="the first worker claimed the job and recorded its container")
        first = claimed.container_id
        eventually(lambda: b"started" in client.containers.get(first).logs(), timeout=30,
                   message="the first container runs the job")
        overlap.start()
        first_worker.kill_with_children()  # the watcher dies with it; the container runs on
        forget_the_claim()
        back = eventually(lambda: pool.get(job.id), timeout=30, ignoring=(Exception,),
                          message="the row is readable again")
        assert back.state == JobState.RUNNING and back.attempt == claimed.attempt and back.owner_boot == ""
        # A worker on the other daemon claims the same attempt and runs it there (on the first daemon Docker
        # would refuse a second container of the attempt by its name).
        spawn("elsewhere", second_daemon.host)
        second = eventually(lambda: (r := pool.get(job.id)).container_id not in ("", first) and r, timeout=60,
                            message="a worker on the other daemon claimed the same attempt and ran it")
        assert second.attempt == claimed.attempt and second.daemon_id != claimed.daemon_id
        eventually(lambda: overlap.peak == 2, timeout=30, message="two containers of the job run at once")
        # A worker on the first daemon (started again, or one that lived all along) publishes its inventory.
        publisher = spawn("publisher", docker_host)
        boot = eventually(lambda: re.search(r"boot ([0-9a-f]{32})", publisher.log()), timeout=30,
                          message="the worker on the first daemon started").group(1)
        eventually(lambda: pool.store.client.hget(pool.keys.inventory(claimed.daemon_id),
                                                  "publisher") == boot,
                   timeout=30, message="that worker publishes the first daemon's inventory")
        up = time.monotonic()
        shown = eventually(lambda: pool.status().strays, timeout=bound,
                           message="status shows the stray while it runs")
        assert [(s.job_id, s.container_id, s.attempt) for s in shown] == [(job.id, first, claimed.attempt)]
        assert claimed.daemon_id in shown[0].daemon_id and second.daemon_id in shown[0].reason
        assert not pool.status().healthy
        eventually(lambda: client.containers.get(first).status != "running", timeout=bound,
                   message="the stray was stopped by the workers on its daemon")
        took = time.monotonic() - up
        assert took <= bound, f"the stray ran on {took:.1f}s after its daemon published (bound {bound:.1f}s)"
        events = [e for e in history(pool, job.id) if e[3] == "stray_stopped"]
        assert len(events) == 1, history(pool, job.id)
        assert first[:12] in events[0][4] and f"attempt {claimed.attempt}" in events[0][4], events[0]
        eventually(lambda: not pool.status().strays, timeout=10, message="status no longer shows the stray")
        # The attempt the row accounts for ran on throughout, and ends the job.
        with contextlib.closing(docker.DockerClient(base_url=second_daemon.host, timeout=30)) as other:
            assert other.containers.get(second.container_id).status == "running"
            other.containers.get(second.container_id).exec_run(["touch", "/tmp/go"])
        done = pool.wait(job.id, timeout=60)
        assert (done.state, done.attempt) == (JobState.SUCCEEDED, claimed.attempt), done.error_reason
    finally:
        overlap.close()
        for p in started:
            p.stop()
        client.close()
        pool.close()


def test_no_stray_is_found_among_containers_the_rows_account_for(
        pool: Pool, spawn: Callable[..., JobpoolProcess], dclient: docker.DockerClient) -> None:
    """The other side: the containers of two workers on one daemon, each its row's, are never called strays
    over several publications; nothing of theirs is stopped."""
    pool.set_slots(2)
    env = FLEET
    spawn(**env)
    spawn(**env)
    jobs = [pool.enqueue(IMAGE, WAIT_FOR_GO) for _ in range(2)]
    running = [eventually(lambda j=j: (r := pool.get(j.id)).container_id and r, timeout=30,
                          message="each job runs") for j in jobs]
    daemon = running[0].daemon_id
    eventually(lambda: pool.store.client.hget(pool.keys.inventory(daemon), "containers") and all(
        r.container_id in cast(str, pool.store.client.hget(pool.keys.inventory(daemon), "containers"))
        for r in running),
        timeout=10, message="the inventory lists both containers")
    for _ in range(5):  # five more publications: none of them finds a stray
        at = pool.store.client.hget(pool.keys.inventory(daemon), "at")
        eventually(lambda at=at: pool.store.client.hget(pool.keys.inventory(daemon), "at") != at, timeout=10,
                   message="the inventory was published again")
        assert pool.store.client.hget(pool.keys.inventory(daemon), "strays") == "[]"
    assert not pool.status().strays
    for r in running:
        assert dclient.containers.get(r.container_id).status == "running"
        dclient.containers.get(r.container_id).exec_run(["touch", "/tmp/go"])
    for j in jobs:
        assert pool.wait(j.id, timeout=60).state == JobState.SUCCEEDED
    assert not any(e[3] == "stray_stopped" for j in jobs for e in history(pool, j.id))
