"""The one rule for acting on Redis's word after Redis restarted or failed over (jobpool/redistrust.py;
docs/architecture.md, "Rules the verdicts encode, and why"): for a lease, nothing is removed or stopped
because of what Redis says, whoever acts (the supervisor, the workers' inventory publisher).

The fault the adversarial runs found: redis-server restarted while a launch sat between its create and its
fence. Every lease lapsed while Redis was away; the publisher on the launch's daemon took the lapsed lease as
proof that the launcher was gone and removed its created container just before the fence landed, and the job
was failed or run again with its recovery budget spent.
"""

from __future__ import annotations

import re
import time
import types
from collections.abc import Callable
from pathlib import Path

import docker
import pytest
import redis

from jobpool import JobState, Pool, Settings, redistrust
from jobpool.redistrust import RedisTrust
from jobpool.store.calls import Store
from tests.support.constants import IMAGE
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.proxies import DockerLaunchHold
from tests.support.servers import RedisServer

WAIT_FOR_GO = ["sh", "-c", "echo started; while [ ! -f /tmp/go ]; do sleep 0.1; done; echo finished"]


def boot_of(process: JobpoolProcess) -> str:
    return eventually(lambda: re.search(r"boot ([0-9a-f]{32})", process.log()), timeout=30,
                      message="the worker started").group(1)


def test_a_restart_of_redis_during_a_launch_does_not_cost_the_job_its_container(
        redis_server_factory: Callable[[], RedisServer], pool_env: dict[str, str], docker_host: str,
        proxy: DockerLaunchHold, dclient: docker.DockerClient, tmp_path: Path) -> None:
    server = redis_server_factory()
    server.start(appendonly=True)  # every write kept: only the leases' time runs out while it is down
    env = {**pool_env, "JOBPOOL_REDIS_URL": server.url, "JOBPOOL_INVENTORY_SECS": "0.2",
           "JOBPOOL_INVENTORY_STALE_SECS": "2", "JOBPOOL_LEASE_SECS": "1.5"}
    pool = Pool.from_env(env=env)
    pool.set_slots(2)
    started: list[JobpoolProcess] = []

    def spawn(name: str, host: str) -> JobpoolProcess:
        p = JobpoolProcess("jobpool.workers", {**env, "DOCKER_HOST": host}, tmp_path / f"{name}.log")
        started.append(p)
        return p

    try:
        # A worker on the daemon, busy with a job of its own: it publishes the daemon's inventory.
        publisher = spawn("publisher", docker_host)
        busy = pool.enqueue(IMAGE, WAIT_FOR_GO)
        eventually(lambda: pool.get(busy.id).container_id, timeout=30, message="the publisher runs a job")
        lead = boot_of(publisher)
        daemon = pool.get(busy.id).daemon_id
        eventually(lambda: pool.store.client.hget(pool.keys.inventory(daemon), "publisher") == lead,
                   timeout=30,
                   message="it publishes its daemon's inventory")
        # Another worker on the same daemon, whose create's reply is held: the container exists, unfenced.
        proxy.hold()
        spawn("launcher", proxy.host)
        job = pool.enqueue(IMAGE, ["echo", "ran"])
        eventually(proxy.held.is_set, timeout=30, message="the create reached the daemon and is held")
        created = eventually(lambda: dclient.containers.list(
            all=True, sparse=True, filters={"label": f"jobpool.job_id={job.id}"}), timeout=10,
            message="the daemon created the container")[0].id
        # Redis away for longer than a lease, then back with every write (AOF): the lease has lapsed.
        server.kill()
        time.sleep(pool.settings.lease_secs + 0.5)  # the fault itself: Redis down past a lease
        server.start(appendonly=True)
        assert eventually(lambda: not pool.store.client.exists(pool.keys.lease(job.id)), timeout=10,
                          ignoring=(Exception,), message="redis is back, the launch's lease lapsed")
        at = pool.store.client.hget(pool.keys.inventory(daemon), "at")
        eventually(lambda: pool.store.client.hget(pool.keys.inventory(daemon), "at") != at, timeout=10,
                   message="the publisher published again after the restart")
        assert dclient.containers.get(created).status == "created", "the created container was removed"
        proxy.release()  # the fence lands, the launch starts its container
        done = pool.wait(job.id, timeout=60)
        assert (done.state, done.attempt, done.recovery_attempts) == (JobState.SUCCEEDED, 1, 0), (
            done.state, done.error_reason, [p.log()[-2000:] for p in started])
        assert done.container_id == created
        assert "ran" in pool.logs(job.id)
    finally:
        proxy.release()
        for c in dclient.containers.list(sparse=True, filters={"label": f"jobpool.job_id={busy.id}"}):
            c.exec_run(["touch", "/tmp/go"])
        for p in started:
            p.stop()
        pool.close()


def test_a_restarted_or_another_redis_server_settles_for_a_lease(
        redis_server_factory: Callable[[], RedisServer]) -> None:
    """The rule itself on real redis-servers: a fresh server, one reached again after an outage, and another
    server answering where the last one did (a failover, as a Sentinel client meets it) each settle."""
    servers = [redis_server_factory(), redis_server_factory()]
    for server in servers:
        server.start()
    clients = [redis.Redis.from_url(server.url, decode_responses=True) for server in servers]
    stores = [Store(client, Settings()) for client in clients]
    lease = 3.0  # long enough that the servers just started are younger than it, on a loaded machine too
    trust = RedisTrust(stores[0], lease)
    try:
        assert trust.settling().startswith("redis-server started")  # up for less than a lease
        eventually(lambda: trust.settling() == "", timeout=10, message="settled once up for a lease")
        servers[0].kill()
        assert trust.settling().startswith("redis does not answer")
        servers[0].start()
        assert trust.settling() != ""
        eventually(lambda: trust.settling() == "", timeout=10, message="settled a lease after it came back")
        # Another server, up for longer than a lease, answers on the same client with no outage seen.
        eventually(lambda: int(clients[1].info("server")["uptime_in_seconds"]) > lease, timeout=10,
                   message="the other server has been up for a lease")
        trust.server = stores[1]
        assert trust.settling().startswith("another redis-server answers")
        eventually(lambda: trust.settling() == "", timeout=10, message="settled a lease after the switch")
        # A process that cannot know what came before it (a worker's publisher) settles from its start.
        fresh = RedisTrust(stores[1], lease, fresh=True)
        assert fresh.settling().startswith("this process (re)connected")
        eventually(lambda: fresh.settling() == "", timeout=10, message="settled a lease after its start")
    finally:
        for client in clients:
            client.close()


def test_a_failover_and_back_to_the_same_server_settles_for_a_lease(
        redis_server_factory: Callable[[], RedisServer]) -> None:
    """A primary that failed over to a replica and back (a failback) answers with its own run id and its
    long uptime, but it resynced from the other and may have lost acknowledged writes: its replication id,
    new at its promotion, says another server answered meanwhile, however long ago the last look was."""
    servers = [redis_server_factory(), redis_server_factory()]
    for server in servers:
        server.start()
    first, other = (redis.Redis.from_url(server.url, decode_responses=True) for server in servers)
    lease = 3.0
    trust = RedisTrust(Store(first, Settings()), lease)
    try:
        eventually(lambda: trust.settling() == "", timeout=10, message="settled once up for a lease")
        run_id = first.info("server")["run_id"]
        first.replicaof("127.0.0.1", servers[1].port)
        eventually(lambda: first.info("replication").get("master_link_status") == "up", timeout=15,
                   message="the old primary follows the new one")
        first.replicaof("NO", "ONE")  # and is promoted again
        info = first.info("server")
        assert info["run_id"] == run_id and int(info["uptime_in_seconds"]) > lease
        assert trust.settling().startswith("another redis-server answers")
        eventually(lambda: trust.settling() == "", timeout=10, message="settled a lease after the failback")
    finally:
        first.close()
        other.close()


def test_a_fresh_process_settles_from_its_first_look(redis_server_factory: Callable[[], RedisServer],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that cannot know what came before it (a worker's publisher) settles for a lease from its
    first look, not from its start: it may first look long after (while its daemon's marks refuse), and a
    failover before that look is one it never saw."""
    server = redis_server_factory()
    server.start()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    clock = [1000.0]
    monkeypatch.setattr(redistrust, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    try:
        trust = RedisTrust(Store(client, Settings()), 30.0, fresh=True)
        clock[0] += 100  # no look for longer than a lease
        assert trust.settling().startswith("this process (re)connected to redis 0.0s ago")
        clock[0] += 20
        assert trust.settling().startswith("this process (re)connected to redis 20.0s ago")
    finally:
        client.close()
