"""`jobpool.dockerclient.shared`: a client's requests over the daemon's unix socket reuse one connection
pool, whatever container their URLs name (docker-py's own adapter keys a pool, and opens a socket, per URL),
and still get the daemon's answers, errors included."""

from __future__ import annotations

from typing import Any

import docker
import pytest

from jobpool.dockerclient import shared
from tests.support.constants import IMAGE


def requests_naming_containers(client: docker.DockerClient, n: int) -> list[str]:
    """Create `n` containers, inspect and remove each: 3n requests, 2n of them to URLs of their own."""
    ids = []
    for i in range(n):
        c = client.api.create_container(IMAGE, ["true"], labels={"jobpool-test": "dockerclient", "i": str(i)})
        ids.append(c["Id"])
        assert client.api.inspect_container(c["Id"])["Id"] == c["Id"]
        client.api.remove_container(c["Id"], force=True)
    return ids


def unix_adapter(client: docker.DockerClient) -> Any:  # docker-py ships no types
    return client.api.adapters["http+docker://"]


def test_one_pool_and_one_connection_for_every_url(docker_host: str) -> None:
    client = shared(docker.DockerClient(base_url=docker_host))
    try:
        requests_naming_containers(client, 5)
        adapter = unix_adapter(client)
        assert len(adapter.pools) == 1
        pool = adapter.pools[adapter.socket_path]
        assert pool.pool.qsize() == pool.pool.maxsize, "the pool is a full queue: its slots, idle or empty"
        idle = [c for c in list(pool.pool.queue) if c is not None]
        assert len(idle) == 1, "the requests, one after another, went over one connection"
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_container("no-such-container")
        assert shared(client) is client and len(unix_adapter(client).pools) == 1, "made shared once"
    finally:
        client.close()


def test_docker_pys_own_adapter_opens_a_pool_per_url(docker_host: str) -> None:
    """What `shared` is for: without it, every container's URL gets a pool of its own."""
    client = docker.DockerClient(base_url=docker_host)
    try:
        requests_naming_containers(client, 5)
        assert len(unix_adapter(client).pools) > 5
    finally:
        client.close()
