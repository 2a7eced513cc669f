"""Where a job's containers run, across the private dockerd daemons of a many-daemon test: sampled on all of
them (a job must never have two live containers), checked on one, started on one. Shared by
tests/integration/test_daemon_identity.py, test_many_hosts.py and test_shared_identity.py."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable

import docker

from jobpool import Pool
from tests.support.constants import IMAGE
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess


class Sampler:
    """Lists the job containers of every daemon in `hosts` every 0.1 s; counts live containers per job per
    round."""

    def __init__(self, hosts: tuple[str, ...]) -> None:
        self.clients = [docker.DockerClient(base_url=h, timeout=10) for h in hosts]
        self.most_live: Counter[str] = Counter()
        self.attempts: dict[str, set[str]] = {}
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            live: Counter[str] = Counter()
            for client in self.clients:
                with contextlib.suppress(docker.errors.DockerException):
                    for c in client.api.containers(all=True, filters={"label": "jobpool.pool"}):
                        labels = c.get("Labels") or {}
                        job = labels.get("jobpool.job_id", "")
                        self.attempts.setdefault(job, set()).add(labels.get("jobpool.attempt", ""))
                        if c.get("State") in ("running", "paused", "restarting"):
                            live[job] += 1
            for job, n in live.items():
                self.most_live[job] = max(self.most_live[job], n)
            self.rounds += 1
            self._stop.wait(0.1)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for client in self.clients:
            client.close()


def live_on(host: str, job_id: str) -> bool:
    with contextlib.closing(docker.DockerClient(base_url=host, timeout=10)) as client:
        return bool(client.containers.list(sparse=True, filters={"label": f"jobpool.job_id={job_id}"}))


def start_on(spawn: Callable[..., JobpoolProcess], pool: Pool, host: str, command: list[str]) -> tuple[
        JobpoolProcess, str]:
    """A worker on `host` alone takes a new job; returns it once its container runs there."""
    worker = spawn(DOCKER_HOST=host)
    job = pool.enqueue(IMAGE, command)
    eventually(lambda: live_on(host, job.id), timeout=30, message=f"job {job.id} running on {host}")
    return worker, job.id


def containers(dclient: docker.DockerClient, job_id: str) -> list[docker.models.containers.Container]:
    """Every container of a job on one daemon, stopped ones included."""
    found: list[docker.models.containers.Container] = dclient.containers.list(
        all=True, sparse=True, filters={"label": f"jobpool.job_id={job_id}"})
    return found


def started(dclient: docker.DockerClient, job_id: str) -> bool:
    """Whether a container of the job printed "started" (the tests' jobs print it first)."""
    return any(b"started" in c.logs() for c in containers(dclient, job_id))
