"""Docker clients whose requests over the daemon's unix socket share one connection pool.

docker-py's unix-socket adapter keys its connection pools by each request's whole URL, and every request that
names a container (`/containers/<id>/start`, `/wait`, `/logs`, the removal) has a URL of its own: each opened
a new socket and built a new pool, a large part of a worker's Python per job. `shared` mounts an adapter that
keys every request on the socket instead, so a client's requests reuse its connections. Other transports (TCP,
TLS, ssh) are left as docker-py made them. """

from __future__ import annotations

from typing import Any

import docker
from docker.transport import UnixHTTPAdapter

#: The scheme docker-py mounts its unix-socket adapter on (docker/api/client.py).
_UNIX_MOUNT = "http+docker://"


class _OnePool(UnixHTTPAdapter):  # type: ignore[misc]  # docker-py ships no types: its adapter is Any
    """docker-py's unix-socket adapter with one connection pool for the socket, whatever the URL."""

    def get_connection(self, url: Any, proxies: Any = None) -> Any:
        return super().get_connection(self.socket_path, proxies)


def shared(client: docker.DockerClient) -> docker.DockerClient:
    """`client`, its unix-socket requests now sharing one pool (see the module's docstring)."""
    api = client.api
    old = api.adapters.get(_UNIX_MOUNT)
    if isinstance(old, UnixHTTPAdapter) and not isinstance(old, _OnePool):
        new = _OnePool(old.socket_path, timeout=old.timeout, pool_connections=1,
                       max_pool_size=old.max_pool_size)
        api.mount(_UNIX_MOUNT, new)
        api._custom_adapter = new  # what docker-py falls back on for its own URLs (APIClient.get_adapter)
        old.close()
    return client
