"""The test bed itself: the real servers start, keep state where promised, and can be taken away and back."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import docker
import pytest
import redis
import requests

from tests.support.constants import IMAGE
from tests.support.polling import eventually
from tests.support.servers import DockerDaemon, RedisServer


@pytest.mark.parametrize("run", [1, 2])
def test_redis_url_is_empty_and_answers(redis_url: str, run: int) -> None:
    """Run twice: each run leaves a key behind, and each must still start from an empty database."""
    with contextlib.closing(redis.Redis.from_url(redis_url)) as client:
        assert client.ping()
        assert client.dbsize() == 0
        client.set("leftover", run)


def test_redis_aof_restart_keeps_key(redis_server_factory: Callable[[], RedisServer]) -> None:
    """With appendfsync always, an acknowledged write survives SIGKILL and a restart on the same port."""
    server = redis_server_factory()
    server.start(appendonly=True)
    port, old_pid = server.port, server.pid
    with contextlib.closing(redis.Redis.from_url(server.url)) as client:
        client.set("survivor", "yes")
    server.kill()
    server.restart()
    assert (server.port, server.pid != old_pid) == (port, True)
    with contextlib.closing(redis.Redis.from_url(server.url)) as client:
        assert client.get("survivor") == b"yes"


def test_busybox_container_runs_without_network_and_is_found_by_label(docker_host: str) -> None:
    with contextlib.closing(docker.from_env(timeout=10)) as client:  # via the DOCKER_HOST set by the fixture
        labelled = client.containers.run(
            IMAGE,
            ["sh", "-c", "ls /sys/class/net; sleep 300"],
            detach=True,
            network_mode="none",
            labels={"x": "y"},
        )
        client.containers.run(IMAGE, ["true"], detach=True, network_mode="none", labels={"x": "z"})
        failing = client.containers.run(IMAGE, ["false"], detach=True, network_mode="none")

        found = client.containers.list(all=True, sparse=True, filters={"label": "x=y"})
        assert [c.id for c in found] == [labelled.id]
        assert found[0].attrs["Labels"] == {"x": "y"}
        assert failing.wait(timeout=10)["StatusCode"] == 1
        # network_mode="none": only the loopback interface exists inside
        eventually(lambda: labelled.logs() == b"lo\n", message="container listing its network interfaces")


def test_stopped_daemon_fails_fast_and_running_container_survives_restart(
    docker_daemon: DockerDaemon, docker_host: str
) -> None:
    """The "daemon unreachable" fault: calls fail at once rather than hang, and with --live-restore the
    container started before the stop is still running, with the same id, once the daemon is back."""
    with contextlib.closing(docker.DockerClient(base_url=docker_host, timeout=3)) as client:
        container = client.containers.run(
            IMAGE, ["sleep", "300"], detach=True, network_mode="none", labels={"jobpool.test": "survivor"}
        )
        try:
            docker_daemon.stop()
            started = time.monotonic()
            with pytest.raises(requests.exceptions.ConnectionError):
                client.ping()
            assert time.monotonic() - started < 3
        finally:
            docker_daemon.start()
        assert client.ping()
        listed = client.containers.list(sparse=True, filters={"label": "jobpool.test=survivor"})
        assert [(c.id, c.attrs["State"]) for c in listed] == [(container.id, "running")]
