"""Redis errors that pass by themselves, and reporting one outage once rather than once per retry.

A failover demotes the primary (READONLY, and UNBLOCKED for a client blocked in BLMOVE), a full memory under
`noeviction` refuses writes (OOM), a restart drops connections and then answers LOADING. Each ends without
anyone touching the worker, so a worker waits it out: a worker that exited would leave the pool without
workers just when Redis is back. Anything else (a password or ACL the worker cannot pass, an error about the
data) is a fault that waiting does not fix, and still ends the work loop.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from ..errors import RedisUnavailable
from ..store.runner import wrap_redis_error

log = logging.getLogger("jobpool.worker")

#: Retry delays while Redis cannot serve: short at first (a failover or restart often ends within a
#: second), doubling, and bounded so the worker resumes within a few seconds of Redis.
BACKOFF_FIRST_SECS = 0.1
BACKOFF_MAX_SECS = 5.0

#: Replies that mean "not now" beyond those `wrap_redis_error` knows: a client blocked in BLMOVE when its
#: server is made a replica is released with UNBLOCKED (the same outage as the READONLY that follows).
_MORE_TRANSIENT_CODES = ("UNBLOCKED",)
#: A refused password or ACL does not pass by waiting (redis-py's AuthenticationError is a ConnectionError).
_NOT_TRANSIENT = (redis.exceptions.AuthenticationError, redis.exceptions.NoPermissionError)


class OutageError(Exception):
    """A transient Redis error carried out of RQ's dequeue loop, which would otherwise retry a dropped
    connection on its own schedule (up to a minute apart, each retry logged as an error)."""

    def __init__(self, error: redis.RedisError) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` says Redis cannot serve right now (see the module docstring), not that it never will."""
    if isinstance(exc, OutageError):
        return True
    if not isinstance(exc, redis.RedisError) or isinstance(exc, _NOT_TRANSIENT):
        return False
    if str(exc).startswith(_MORE_TRANSIENT_CODES):
        return True
    return isinstance(wrap_redis_error(exc, "worker"), RedisUnavailable)


class Backoff:
    """The delay before the next retry: BACKOFF_FIRST_SECS doubling up to BACKOFF_MAX_SECS."""

    def __init__(self) -> None:
        self.delay = BACKOFF_FIRST_SECS

    def sleep(self) -> None:
        time.sleep(self.delay)
        self.delay = min(2 * self.delay, BACKOFF_MAX_SECS)


class Outage:
    """Whether this worker process currently finds Redis unable to serve it.

    Shared by everything in the process that talks to Redis (the work loop, the boot heartbeat thread), so an
    outage is logged once when the first of them meets it and once when Redis takes a write again, however
    many retries happen in between.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._since: float | None = None
        self._failures = 0

    def failed(self, what: str, exc: BaseException) -> None:
        exc = exc.error if isinstance(exc, OutageError) else exc
        with self._lock:
            self._failures += 1
            if self._since is not None:
                return
            self._since = time.monotonic()
        log.warning("%s: Redis cannot serve %s (%s: %s); retrying until it can (logged once per outage)",
                    self.name, what, type(exc).__name__, exc)

    def recovered(self) -> None:
        """Called after a write succeeded (a read can succeed on a replica or under OOM)."""
        with self._lock:
            if self._since is None:
                return
            lasted, failures = time.monotonic() - self._since, self._failures
            self._since, self._failures = None, 0
        log.info("%s: Redis serves again after %.1fs (%d failed attempts)", self.name, lasted, failures)
