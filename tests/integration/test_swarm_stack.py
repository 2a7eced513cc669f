"""docker-stack.yml deployed for real: `docker stack deploy` on a Swarm of two private dockerd daemons on this
machine (tests/support/swarm.py), with jobpool's image built from this repo's Dockerfile and a Debian base for
Redis (tests/support/images.py) loaded into both nodes. Redis and the supervisor run on the manager, a worker
on each node, each on its own node's daemon.

What a node's faults must come to (README, "One host or many" and "Deploying a fleet"; docs/architecture.md,
"Many hosts"): a node whose workers all died keeps its jobs' slots while its inventory is stale ("unknown
keeps the slot", the daemon named by `status`), and a worker back on it adopts the containers still running;
a node's daemon that crashes under a job stops it as it starts again (Swarm runs no daemon with live-restore)
and a job that keeps the container contract (exit 75 on SIGTERM, after its checkpoint) is handed back and
resumes on that node; a node drained before its daemon restarts hands its job back the same way. The node
whose daemon is stopped is always the second, a worker node: the manager holds Redis.

Swarm would restart a dead worker task within seconds; each fault test first pauses the node
(`--availability pause`: no new task placed there), so the time a node has no worker is the test's to end.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from jobpool import Job, JobState, Pool
from jobpool.status import Daemons, Slots, StatusReport, Sweep, Workers
from tests.support import images
from tests.support.constants import IMAGE
from tests.support.polling import eventually
from tests.support.servers import DockerDaemon, daemon_identity, free_port
from tests.support.swarm import Swarm, docker_cli

pytestmark = pytest.mark.skipif(docker_cli() is None,
                                reason="no docker command line (apt-get install docker.io)")

STACK_FILE = Path(__file__).resolve().parents[2] / "docker-stack.yml"
STACK = "jobpool"
#: Timings fast enough for faults to play out in seconds. The inventory is published more often than a lease
#: lasts, so a fresh one may say "absent"; it is stale after two periods.
FAST = {
    "JOBPOOL_HEARTBEAT_SECS": "0.5",
    "JOBPOOL_LEASE_SECS": "2",
    "JOBPOOL_DRAIN_TIMEOUT_SECS": "5",
    "JOBPOOL_STOP_GRACE_SECS": "2",
    "JOBPOOL_SWEEP_INTERVAL_SECS": "0.5",
    "JOBPOOL_CLAIM_GRACE_SECS": "5",
    "JOBPOOL_PROBE_TIMEOUT_SECS": "3",
    "JOBPOOL_INVENTORY_SECS": "0.5",
    "JOBPOOL_INVENTORY_STALE_SECS": "2",
}
#: A job that keeps the container contract: on SIGTERM it records a step in its checkpoint and exits 75; run
#: again, it finds the step and succeeds; else it runs until the file named by $GO appears in /gate.
JOB = r"""
trap 'echo step > "$JOBPOOL_CHECKPOINT_DIR/ck"; echo interrupted; exit 75' TERM
if [ -f "$JOBPOOL_CHECKPOINT_DIR/ck" ]; then
  echo "resumed with $(cat "$JOBPOOL_CHECKPOINT_DIR/ck")"; exit 0
fi
echo started; while [ ! -e "/gate/$GO" ]; do sleep 0.1; done; echo done
"""


def local_stack(env: dict[str, str], redis_port: int) -> dict[str, object]:
    """docker-stack.yml as this machine runs it, changed only where one machine must differ from a fleet of
    hosts: the host network instead of the overlay (tests/support/swarm.py says why), so Redis listens on a
    free loopback port (its healthcheck asks there) and the others reach it there; and the test's settings.
    (A second `-c` file cannot do it: `docker stack deploy` appends list fields such as a healthcheck's test
    rather than replacing them.)"""
    stack = yaml.safe_load(STACK_FILE.read_text())
    stack["networks"]["jobpool"] = {"external": True, "name": "host"}
    redis = stack["services"]["redis"]
    redis["command"] = [*redis["command"], "--port", str(redis_port), "--bind", "127.0.0.1"]
    redis["healthcheck"] = {**redis["healthcheck"], "interval": "1s",
                            "test": ["CMD", "redis-cli", "-p", str(redis_port), "ping"]}
    for name in ("supervisor", "worker"):
        service = stack["services"][name]
        service["environment"] = {**service["environment"], **env}
    return dict(stack)


@dataclass(frozen=True)
class Report:
    slots: Slots
    daemons: Daemons
    last_sweep: Sweep
    workers: Workers
    whole: StatusReport


@dataclass
class Fleet:
    swarm: Swarm
    pool: Pool
    gate: Path
    #: Each node's daemon identity, as its workers record it: the manager's first.
    ids: list[str]

    @property
    def node(self) -> DockerDaemon:
        """The worker node every fault is played on."""
        return self.swarm.daemons[1]

    @property
    def node_id(self) -> str:
        return self.swarm.node_ids[1]

    def enqueue(self, go: str) -> Job:
        return self.pool.enqueue(IMAGE, ["sh", "-c", JOB], env={"GO": go}, mounts=[f"{self.gate}:/gate:ro"])

    def release(self, go: str) -> None:
        (self.gate / go).touch()

    def claimed(self, job: Job) -> Job:
        return eventually(lambda: (row := self.pool.get(job.id)).container_id and row, timeout=60,
                          message=f"job {job.id} claimed and launched")

    def on_node(self, go: str) -> Job:
        """A job running on the worker node, the manager's worker idle again. A worker takes one job at a
        time, so a filler job taken by one node's worker sends the next job to the other node's."""
        first = self.claimed(self.enqueue(f"{go}-1"))
        fillers = [first]
        if first.daemon_id == self.ids[1]:
            fillers.append(self.claimed(self.enqueue(f"{go}-2")))  # the manager's worker takes this one
            self.release(f"{go}-1")
            self.pool.wait(first.id, timeout=60)
        job = self.claimed(self.enqueue(go))
        assert job.daemon_id == self.ids[1]
        self.release(f"{go}-1")
        self.release(f"{go}-2")
        ended = [self.pool.wait(f.id, timeout=60).state for f in fillers]
        assert ended == [JobState.SUCCEEDED] * len(fillers)
        eventually(lambda: "started" in self.logs(job), timeout=30, message=f"job {job.id} started")
        return job

    def logs(self, job: Job) -> str:
        """What the job's attempt printed so far, read from its node's daemon."""
        with contextlib.closing(self.node.client()) as client:
            return str(client.containers.get(self.pool.get(job.id).container_id).logs().decode())

    def held_on_stale_node(self, job: Job, claimed: bool = True) -> None:
        """The job keeps its slot while its node has no live worker: `status` names the node's daemon as
        holding it on a stale inventory, and nothing ran it anywhere else. A claimed job (its worker gone) is
        kept by the sweep on unknown evidence, that inventory's age; an unclaimed one waits promoted on its
        node's queue (its checkpoint's affinity) and is kept as dispatched."""
        def held() -> bool:
            status = self.status()
            stale = {d.daemon_id: d.jobs for d in status.daemons.stale}
            unknown = {u.job: u.evidence + u.reason for u in status.last_sweep.unknown_jobs}
            return job.id in stale.get(self.ids[1], ()) and (job.id in unknown) is claimed and (
                not claimed or on_stale_inventory(unknown[job.id]))

        def on_stale_inventory(evidence: str) -> bool:
            # `status` may call the inventory stale before the next sweep does: the sweep that last kept the
            # job may have read it while it was fresh (its lease gone, its container unseen), so wait for a
            # sweep that ran after the inventory aged.
            return f"the inventory of daemon {self.ids[1]} is" in evidence and "stale after" in evidence
        eventually(held, timeout=60, message=f"job {job.id} held on its node's stale inventory")
        row = self.pool.get(job.id)
        where = row.daemon_id if claimed else row.affinity  # a job handed back is dispatched to its affinity
        assert (row.state, where, bool(row.owner_boot)) == (JobState.RUNNING, self.ids[1], claimed)
        assert self.status().slots.used == 1

    def status(self) -> Report:
        """The pool's status, every part of it read (a reachable Redis gives them all)."""
        status = self.pool.status()
        assert status.slots and status.daemons and status.last_sweep and status.workers, status
        return Report(status.slots, status.daemons, status.last_sweep, status.workers, status)

    def workers_up(self) -> None:
        """One live worker per node, each on its own daemon identity, all taking work."""
        def up() -> bool:
            boots = self.status().workers.boots
            return sorted(b.daemon_id for b in boots if not b.cannot_claim) == sorted(self.ids)
        eventually(up, timeout=120, message="one worker per node, each on its own daemon",
                   ignoring=(Exception,))


@pytest.fixture(scope="module")
def fleet(docker_daemon: DockerDaemon) -> Iterator[Fleet]:
    app = images.jobpool_image(docker_daemon)
    base = images.base_image(docker_daemon)
    with Swarm(2) as swarm:
        swarm.start()
        def load(node: DockerDaemon) -> None:
            node.import_busybox_image()
            for tag in (app, base):
                images.load_into(tag, docker_daemon, node)

        with ThreadPoolExecutor(len(swarm.daemons)) as loads:  # each node unpacks on its own
            list(loads.map(load, swarm.daemons))
        gate = swarm.dir / "gate"
        gate.mkdir()
        port = free_port()
        env = {**FAST, "JOBPOOL_REDIS_URL": f"redis://127.0.0.1:{port}/0", "JOBPOOL_POOL": "swarm",
               "JOBPOOL_BIND_ROOTS": str(gate)}
        stack = swarm.dir / "docker-stack.yml"
        stack.write_text(yaml.safe_dump(local_stack(env, port)))
        swarm.deploy(STACK, [stack], {"JOBPOOL_IMAGE": app, "JOBPOOL_REDIS_IMAGE": base,
                                      "JOBPOOL_DOCKER_SOCKET": swarm.socket_template})
        with contextlib.closing(Pool.from_env(env=env)) as pool:
            fleet = Fleet(swarm, pool, gate, [daemon_identity(node.host) for node in swarm.daemons])
            fleet.workers_up()
            pool.set_slots(2)
            yield fleet


@pytest.fixture
def stack(fleet: Fleet) -> Iterator[Fleet]:
    """The fleet as a test leaves it: every node's daemon running and active, a worker on each, and no job
    left to hold a slot (a test that failed half way must not starve the next one of slots)."""
    yield fleet
    fleet.node.ensure_running()
    fleet.swarm.set_availability(fleet.node_id, "active")
    fleet.workers_up()
    left = [j for j in fleet.pool.list() if not j.state.terminal]
    for job in left:
        fleet.release(job.spec.env["GO"])
    for job in left:
        fleet.pool.wait(job.id, timeout=120)


def test_each_node_runs_jobs_on_its_own_daemon(stack: Fleet) -> None:
    """Two jobs at once: one per node's worker, each container on that worker's own daemon."""
    first, second = stack.claimed(stack.enqueue("both")), stack.claimed(stack.enqueue("both"))
    assert {first.daemon_id, second.daemon_id} == set(stack.ids)
    for job, daemon in ((first, stack.swarm.daemons[stack.ids.index(first.daemon_id)]),
                        (second, stack.swarm.daemons[stack.ids.index(second.daemon_id)])):
        with contextlib.closing(daemon.client()) as client:
            assert client.containers.get(job.container_id).labels["jobpool.job_id"] == job.id
    stack.release("both")
    assert [stack.pool.wait(j.id, timeout=60).state for j in (first, second)] == [JobState.SUCCEEDED] * 2
    status = stack.status()
    assert not status.whole.shared_daemons and not status.whole.strays
    # Swarm refuses live-restore, so every node's worker says its daemon runs without it, on a Swarm node:
    # status advises draining the node, never turning live-restore on (the daemon would not start).
    assert [(b.live_restore, b.swarm) for b in status.workers.boots] == [(False, True), (False, True)]
    warnings = status.whole.health.warnings
    assert any("Swarm nodes" in w and "drain" in w for w in warnings), warnings
    assert not any("live-restore\": true" in w for w in warnings), warnings


def test_a_job_whose_nodes_worker_died_keeps_its_slot_until_a_worker_there_adopts_it(stack: Fleet) -> None:
    job = stack.on_node("adopt")
    stack.swarm.set_availability(stack.node_id, "pause")
    worker = stack.swarm.running_tasks(f"{STACK}_worker")[stack.node_id]
    with contextlib.closing(stack.node.client()) as client:
        os.kill(client.containers.get(worker).attrs["State"]["Pid"], signal.SIGKILL)  # its init, and so all
        stack.held_on_stale_node(job)
        assert client.containers.get(job.container_id).status == "running"

    stack.swarm.set_availability(stack.node_id, "active")  # Swarm starts a worker there again
    eventually(lambda: any(e["reason"] == "adopted" for e in stack.pool.events(job.id)), timeout=120,
               message="the node's new worker adopted the job")
    stack.release("adopt")
    done = stack.pool.wait(job.id, timeout=60)
    assert (done.state, done.attempt, done.recovery_attempts, done.container_id) == (
        JobState.SUCCEEDED, 1, 0, job.container_id)


def test_a_nodes_daemon_that_crashes_under_a_job_hands_it_back_to_resume_there(stack: Fleet) -> None:
    job = stack.on_node("crash")
    stack.swarm.set_availability(stack.node_id, "pause")
    stack.node.stop(signal.SIGKILL)  # the job and the node's worker run on, the worker keeping the lease
    assert stack.pool.get(job.id).owner_boot == job.owner_boot
    stack.node.start()  # without live-restore it stops what it finds running: the job (75) and the worker
    stack.held_on_stale_node(job)

    stack.swarm.set_availability(stack.node_id, "active")
    done = stack.pool.wait(job.id, timeout=120)
    assert (done.state, done.attempt, done.recovery_attempts, done.daemon_id) == (
        JobState.SUCCEEDED, 2, 0, stack.ids[1])
    handback = [e for e in stack.pool.events(job.id) if e["to"] == "queued" and e["from"] == "running"]
    assert [e["reason"] for e in handback] == ["shutdown_handback"]
    assert "exited with 75" in handback[0]["evidence"]
    assert "resumed with step" in stack.pool.logs(job.id)


def test_a_node_drained_before_its_daemon_restarts_hands_its_job_back_to_resume_there(stack: Fleet) -> None:
    """The operator's way to restart a node's daemon under Swarm (README, "Deploying a fleet")."""
    job = stack.on_node("drain")
    stack.swarm.set_availability(stack.node_id, "drain")  # its worker drains: the job's stop signal, 75
    eventually(lambda: stack.pool.get(job.id).affinity == stack.ids[1], timeout=60,
               message="the job handed back with an affinity to its node")
    stack.held_on_stale_node(job, claimed=False)  # promoted on its node's queue: no worker serves it
    stack.node.stop()
    stack.node.start()

    stack.swarm.set_availability(stack.node_id, "active")
    done = stack.pool.wait(job.id, timeout=120)
    assert (done.state, done.attempt, done.recovery_attempts, done.daemon_id) == (
        JobState.SUCCEEDED, 2, 0, stack.ids[1])
    assert "resumed with step" in stack.pool.logs(job.id)
