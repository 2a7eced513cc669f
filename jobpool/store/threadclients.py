"""`ThreadClients`: the single-connection client each thread runs the enqueue script on
(jobpool/store/calls.py `Store.enqueue`; jobpool/store/runner.py sends the call on its connection directly).
"""

from __future__ import annotations

import os
import threading

import redis

from .runner import reopen


class ThreadClients:
    """One single-connection client per thread (and process), made with redis-py's public `Redis.client()`
    over the pool's own connection pool: a script call on it skips the pool's checkout and release (a lock,
    a health check and a pid check each way), about a third of an enqueue's client time. A thread's client
    holds one connection for as long as the thread lives (it goes back to the pool when the client is
    collected) and is made again after a fork or when the pool's client is replaced."""

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self, base: redis.Redis) -> redis.Redis:
        held = getattr(self._local, "held", None)
        if held is None or held[0] is not base or held[1] != os.getpid():
            held = (base, os.getpid(), base.client())
            self._local.held = held
        client: redis.Redis = held[2]
        conn = client.connection
        # What the pool checks at each checkout, kept: a connection with something to read before anything
        # was sent was closed by the server (a restart; Sentinel drops every client at a failover), so it
        # is reopened now, rather than failing the next call with a reply that cannot be told from a lost one.
        if conn is not None:
            try:
                stale = conn.can_read(timeout=0)
            except redis.ConnectionError:  # it read the end of the connection
                stale = True
            if stale:
                reopen(conn)
        return client

    def close(self) -> None:
        """Give this thread's connection back (`Store.close`); a later call makes a new client."""
        held = getattr(self._local, "held", None)
        self._local.held = None
        if held is not None and held[1] == os.getpid():
            held[2].close()
