"""Docker executor: each attempt is a labelled container, found again by label, never by a pid.

Containers are not auto-removed, so an exit code outlives the worker that watched it; the worker removes
the container after `finish` has recorded it. Each job has one checkpoint volume shared by its attempts.
"""

from __future__ import annotations

import logging
from typing import Any

import docker
import docker.errors
import requests.exceptions

from ... import daemonid
from .base import CONTAINER_CHECKPOINT_DIR, Launch, LaunchError, LaunchUnknown

log = logging.getLogger(__name__)

_UNREACHABLE = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError)


def checkpoint_volume(pool: str, job_id: str) -> str:
    return f"jobpool-ckpt-{pool}-{job_id}"


def container_name(pool: str, job_id: str, attempt: int) -> str:
    return f"jobpool-{pool}-{job_id}-a{attempt}"


class DockerHandle:
    def __init__(self, client: docker.DockerClient, container: Any, daemon_id: str) -> None:
        self._client = client
        self._container = container
        self.container_id: str = container.id
        self.daemon_id = daemon_id
        self.identity: dict[str, Any] | None = None

    def wait(self, timeout: float) -> int | None:
        try:
            result = self._container.wait(timeout=timeout)
        except _UNREACHABLE:
            return None  # still running, or the daemon is away: either way not an exit
        except docker.errors.NotFound:
            raise LaunchUnknown("container vanished") from None
        return int(result.get("StatusCode", -1))

    def signal_stop(self) -> None:
        try:
            self._container.kill(signal="SIGTERM")
        except (docker.errors.APIError, *_UNREACHABLE) as exc:
            log.warning("could not signal container %s: %s", self.container_id[:12], exc)

    def kill(self) -> None:
        try:
            self._container.kill(signal="SIGKILL")
        except (docker.errors.APIError, *_UNREACHABLE) as exc:
            log.warning("could not kill container %s: %s", self.container_id[:12], exc)

    def log_tail(self, max_bytes: int) -> bytes:
        try:
            out = self._container.logs(stdout=True, stderr=True, tail=4000)
        except (docker.errors.APIError, *_UNREACHABLE) as exc:
            return f"[jobpool: logs unavailable: {exc}]".encode()
        return bytes(out)[-max_bytes:]

    def remove(self) -> None:
        try:
            self._container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except (docker.errors.APIError, *_UNREACHABLE) as exc:
            log.warning("could not remove container %s: %s", self.container_id[:12], exc)


class DockerExecutor:
    name = "docker"

    def __init__(self, client: docker.DockerClient | None = None, daemon_id: str = "",
                 api_version: str | None = None) -> None:
        # A known API version skips the per-client GET /version (a fifth of a handoff); proxies from the
        # environment never apply to the daemon's socket, and reading them costs every request.
        self.client = client or docker.from_env(version=api_version or "auto")
        self.client.api.trust_env = False
        self._daemon_id: str | None = daemon_id or None

    @property
    def api_version(self) -> str:
        return str(self.client.api.api_version)

    def daemon_id(self) -> str:
        """The daemon's identity (jobpool/daemonid.py), recorded at claim; raises `IdentityUnavailable` (or
        the SDK's error) when it cannot be established, so nothing is launched without it."""
        if self._daemon_id is None:
            self._daemon_id = daemonid.establish(self.client)
        return self._daemon_id

    @staticmethod
    def _checkpoint_mount(launch: Launch) -> docker.types.Mount:
        """The job's checkpoint volume, created by the container create itself when it is not there yet."""
        return docker.types.Mount(CONTAINER_CHECKPOINT_DIR, checkpoint_volume(launch.pool, launch.job_id),
                                  type="volume", labels={"jobpool.pool": launch.pool, "jobpool.job_id": launch.job_id})

    def launch(self, launch: Launch) -> DockerHandle:
        spec = launch.spec
        env = {**spec.env, **launch.env, "JOBPOOL_CHECKPOINT_DIR": CONTAINER_CHECKPOINT_DIR}
        try:
            volumes: dict[str, dict[str, str]] = {}
            for m in spec.mounts:
                host, target, *mode = m.split(":")
                volumes[host] = {"bind": target, "mode": mode[0] if mode else "rw"}
            kwargs: dict[str, Any] = {
                "command": list(spec.command), "environment": env, "labels": {**spec.labels, **launch.labels()},
                "name": container_name(launch.pool, launch.job_id, launch.attempt), "detach": True,
                "auto_remove": False, "network_mode": spec.network, "volumes": volumes, "stop_signal": "SIGTERM",
                "mounts": [self._checkpoint_mount(launch)],
            }
            if spec.workdir:
                kwargs["working_dir"] = spec.workdir
            if spec.user:
                kwargs["user"] = spec.user
            if spec.cpus:
                kwargs["nano_cpus"] = int(spec.cpus * 1e9)
            if spec.memory:
                kwargs["mem_limit"] = spec.memory
            kwargs.pop("detach")
            # create + start, never run: `run` pulls a missing image, and jobs must not reach registries.
            container = self.client.containers.create(spec.image, **kwargs)
            container.start()
            return DockerHandle(self.client, container, self.daemon_id())
        except docker.errors.ImageNotFound as exc:
            self._remove_created(launch)
            raise LaunchError(f"image_not_found: {spec.image}: {exc.explanation or exc}") from None
        except docker.errors.APIError as exc:
            self._remove_created(launch)
            raise LaunchError(f"launch_failed: {exc.explanation or exc}") from None
        except _UNREACHABLE as exc:
            raise LaunchUnknown(f"docker daemon unreachable during launch: {exc}") from None

    def _remove_created(self, launch: Launch) -> None:
        """A failed `run` may leave a created, never-started container: remove it so no one mistakes it."""
        try:
            self.client.containers.get(container_name(launch.pool, launch.job_id, launch.attempt)).remove(force=True)
        except (docker.errors.APIError, *_UNREACHABLE):
            pass

    def attach(self, pool: str, job_id: str, attempt: int, container_id: str) -> DockerHandle | None:
        try:
            if container_id:
                container = self.client.containers.get(container_id)
            else:
                found = self.client.containers.list(all=True, filters={"label": [
                    f"jobpool.pool={pool}", f"jobpool.job_id={job_id}", f"jobpool.attempt={attempt}"]})
                if not found:
                    return None
                container = found[0]
        except docker.errors.NotFound:
            return None
        labels = container.labels or {}
        if labels.get("jobpool.job_id") != job_id or labels.get("jobpool.attempt") != str(attempt):
            return None
        return DockerHandle(self.client, container, self.daemon_id())

    def remove_checkpoint(self, pool: str, job_id: str) -> None:
        try:
            self.client.api.remove_volume(checkpoint_volume(pool, job_id), force=True)
        except docker.errors.NotFound:
            pass
        except (docker.errors.APIError, *_UNREACHABLE) as exc:
            log.warning("could not remove checkpoint volume of %s: %s", job_id, exc)

    def close(self) -> None:
        self.client.close()
