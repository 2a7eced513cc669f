"""docker-compose.yml run for real: Redis, the supervisor and three workers in containers, jobs enqueued from
the host, a worker container killed mid-job, and `docker-compose down`.

Compose is Debian's `docker-compose` (v1.29; the v2 plugin is not packaged there). The images are made with
no registry (tests/support/images.py): jobpool's from the repo's Dockerfile, and Redis from the same Debian
base (`JOBPOOL_REDIS_IMAGE`). The fleet runs on a private dockerd of its own, started as the session's is
but on overlay2 where the kernel mounts it: vfs copies the whole image for every layer and every container
(five of them here), the slowest part of bringing the fleet up. Its `--bridge=none` only drops the default
bridge, so Compose's own network (a user bridge: service names resolve through Docker's DNS) works, and
Redis's port is published on 127.0.0.1 by the userland proxy (`--iptables=false`). The workers start their
jobs on that same daemon through its socket, mounted at /var/run/docker.sock (`JOBPOOL_DOCKER_SOCKET`):
workers in containers, their jobs beside them, as on a real host.

An override file the test writes publishes Redis's port and sets the fast timings of
tests/support/constants.py; the compose file's own drain timeout and stop grace are kept, since `down` is
checked against them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest

from jobpool import JobState, Pool, RedisUnavailable
from tests.support import images
from tests.support.constants import CHECKPOINTING, FAST_ENV, IMAGE, IN_CI
from tests.support.polling import eventually
from tests.support.servers import DockerDaemon, daemon_identity, free_port, overlay_works

#: The fleet's fixture runs in its first test's time: on a machine with no cache yet it runs debootstrap too.
pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "jpfleet"
WORKERS = 3
#: Fast timings for the fleet's processes; the drain timeout stays the compose file's (20 s, under its 30 s
#: stop grace), which `down` is checked against.
FLEET_ENV = {k: v for k, v in FAST_ENV.items() if k != "JOBPOOL_DRAIN_TIMEOUT_SECS"}
#: Waits at a gate the test opens by `docker exec` (no bind mount, so no JOBPOOL_BIND_ROOTS), then succeeds.
GATED = "echo started; until [ -f /tmp/go ]; do sleep 0.1; done; echo done"


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI is set, so this fails instead of skipping)", pytrace=False)
    pytest.skip(reason)


@dataclass
class Fleet:
    """The running fleet: its daemon (and a client of it), how to run docker-compose on it, its Redis."""

    daemon: DockerDaemon
    client: docker.DockerClient
    compose_files: tuple[Path, ...]
    env: dict[str, str]
    redis_url: str

    def compose(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        argv = ["docker-compose", "--project-name", PROJECT]
        for path in self.compose_files:
            argv += ["--file", str(path)]
        result = subprocess.run([*argv, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                                check=False)
        assert result.returncode == 0, f"docker-compose {' '.join(args)}: {result.stdout}{result.stderr}"
        return result

    def service(self, name: str) -> list[Any]:
        """The service's containers, running or not."""
        return list(self.client.containers.list(all=True, filters={
            "label": [f"com.docker.compose.project={PROJECT}", f"com.docker.compose.service={name}"]}))

    def pool(self) -> Pool:
        return Pool.from_env(env={"JOBPOOL_REDIS_URL": self.redis_url, "JOBPOOL_POOL": "default"})


def _live_workers(pool: Pool) -> int:
    workers = pool.status().workers
    return workers.live - workers.draining if workers else 0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The compose fleet on a private dockerd of its own, up with three workers."""
    for tool in ("docker-compose", "dockerd"):
        if shutil.which(tool) is None:
            _unavailable(f"{tool} is not on PATH (apt-get install docker-compose docker.io)")
    daemon = DockerDaemon(storage_driver="overlay2" if overlay_works() else "vfs")
    client: docker.DockerClient | None = None
    try:
        daemon.start()
        daemon.import_busybox_image()
        app, base = images.jobpool_image(daemon), images.base_image(daemon)
        port = free_port()
        override = tmp_path_factory.mktemp("compose") / "override.yml"
        # JSON is YAML: no YAML writer needed.
        override.write_text(json.dumps({"services": {
            "redis": {"ports": [f"127.0.0.1:{port}:6379"], "healthcheck": {"interval": "1s"}},
            "supervisor": {"environment": FLEET_ENV},
            "worker": {"environment": FLEET_ENV},
        }}))
        env = {**os.environ, "DOCKER_HOST": daemon.host, "JOBPOOL_IMAGE": app, "JOBPOOL_REDIS_IMAGE": base,
               "JOBPOOL_DOCKER_SOCKET": f"{daemon.dir}/docker.sock"}
        client = daemon.client()
        fleet = Fleet(daemon, client, (ROOT / "docker-compose.yml", override), env,
                      f"redis://127.0.0.1:{port}/0")
        fleet.compose("up", "--detach", "--no-build")
        with contextlib.closing(fleet.pool()) as pool:
            eventually(lambda: _live_workers(pool) == WORKERS, timeout=60, message="three workers live")
        yield fleet
    finally:
        # No `down`: the daemon is thrown away whole (its containers, network and volumes with it).
        if client is not None:
            client.close()
        daemon.close()


def test_jobs_enqueued_from_the_host_run_on_the_fleet(fleet: Fleet) -> None:
    with contextlib.closing(fleet.pool()) as pool:
        pool.set_slots(WORKERS)
        jobs = [pool.enqueue(IMAGE, ["sh", "-c", f"echo hello {n}"]) for n in range(4)]
        for n, job in enumerate(jobs):
            done = pool.wait(job.id, timeout=60)
            assert (done.state, done.exit_code) == (JobState.SUCCEEDED, 0)
            assert f"hello {n}" in pool.logs(job.id)
            # The workers, in containers, named the daemon they reach through the mounted socket as it is:
            # its identity volume there and the host kernel's boot id.
            assert done.daemon_id == daemon_identity(fleet.daemon.host)
        status = pool.status()
        assert status.workers is not None
        hosts = {c.attrs["Config"]["Hostname"] for c in fleet.service("worker")}
        assert {b.host for b in status.workers.boots} == hosts and len(hosts) == WORKERS
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        assert {b.kernel_boot_id for b in status.workers.boots} == {boot_id}
        assert status.healthy, status.health


def test_a_worker_container_killed_mid_job_has_its_job_adopted(fleet: Fleet) -> None:
    with contextlib.closing(fleet.pool()) as pool:
        job = pool.enqueue(IMAGE, ["sh", "-c", GATED])
        job_container = eventually(lambda: [c for c in fleet.client.containers.list(
            filters={"label": f"jobpool.job_id={job.id}"}) if b"started" in c.logs()], timeout=60,
            message="job started")[0]
        first = pool.get(job.id)
        workers = pool.status().workers
        assert workers is not None
        host = next(b.host for b in workers.boots if b.id == first.owner_boot)
        (worker,) = [c for c in fleet.service("worker") if c.attrs["Config"]["Hostname"] == host]

        worker.kill()  # SIGKILL: compose v1 kills whole services only; this is one container of three

        adopted = eventually(lambda: pool.get(job.id).owner_boot not in ("", first.owner_boot), timeout=30,
                             message="adopted by another worker")
        assert adopted
        job_container.reload()
        assert job_container.status == "running"
        job_container.exec_run(["touch", "/tmp/go"])
        done = pool.wait(job.id, timeout=30)
        assert (done.state, done.exit_code, done.attempt) == (JobState.SUCCEEDED, 0, first.attempt)
        assert done.recovery_attempts == 0
        assert "adopted" in [e["reason"] for e in pool.events(job.id)]
        assert pool.logs(job.id).count("started") == 1, "run once, not again"


def test_down_drains_the_workers_before_the_stop_grace(fleet: Fleet) -> None:
    with contextlib.closing(fleet.pool()) as pool:
        job = pool.enqueue(IMAGE, ["sh", "-c", CHECKPOINTING])
        (job_container,) = eventually(lambda: [c for c in fleet.client.containers.list(
            filters={"label": f"jobpool.job_id={job.id}"}) if b"started" in c.logs()], timeout=60,
            message="job started")
    # What is running now (the worker killed by the test before stays dead: Docker does not restart a
    # container it was told to kill) and how each of them exits.
    workers = {c.id for c in fleet.service("worker") if c.status == "running"}
    assert workers
    since = int(time.time()) - 1
    fleet.compose("down")  # the compose file's stop grace (30 s), its SIGTERM, its volumes kept
    exits: dict[str, list[str]] = {}
    events = fleet.client.events(since=since, until=int(time.time()) + 1, decode=True,
                                 filters={"event": "die"})
    with contextlib.closing(events):
        for event in events:
            exits.setdefault(event["id"], []).append(event["Actor"]["Attributes"].get("exitCode", ""))
    # Each worker drained and exited on its own (0), none killed at the stop grace (137); the job got its
    # stop signal from the drain and exited 75 ("hand me back").
    assert {w: exits.get(w) for w in workers} == {w: ["0"] for w in workers}, exits
    assert exits.get(job_container.id) == ["75"], exits

    fleet.compose("up", "--detach", "--no-build", "redis")  # its AOF on the kept volume
    with contextlib.closing(fleet.pool()) as pool:
        handed = eventually(lambda: pool.get(job.id), timeout=30, ignoring=(RedisUnavailable,))
        # Handed back, then promoted again at once (its slot was free) for a worker of the daemon that keeps
        # its checkpoint: no worker is left to claim it.
        assert (handed.state, handed.attempt, handed.owner_boot) == (JobState.RUNNING, 2, "")
        assert handed.affinity == daemon_identity(fleet.daemon.host)
        back = [e for e in pool.events(job.id) if e["from"] == "running" and e["to"] == "queued"]
        assert back and back[0]["reason"] == "shutdown_handback"

        fleet.compose("up", "--detach", "--no-build")  # the fleet again: its workers take the job back
        done = pool.wait(job.id, timeout=60)
        assert (done.state, done.attempt, done.recovery_attempts) == (JobState.SUCCEEDED, 2, 0)
        assert "resumed with step" in pool.logs(job.id)
