"""The Redis of a `jobpool up` stack, as `up` and the shells that follow it ask it (jobpool/up/stack.py,
jobpool/up/follow.py): whether the redis-server `up` started serves yet, which process serves it, its
eviction policy, and the stack's id `up` writes into it (`PoolKeys.up_stack`), which another shell reads back
to tell that Redis from another one that took the port.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import redis

from . import redispolicy
from .keys import PoolKeys
from .runner import call_redis


class Serving(enum.Enum):
    """What a PING of the stack's redis-server says."""

    #: It answers.
    YES = "yes"
    #: It refuses while it loads its AOF (however long that takes).
    LOADING = "loading"
    #: Nothing answers at its address (not listening yet, or gone).
    UNREACHABLE = "unreachable"


class Refused(Exception):
    """The stack's redis-server answered with an error that waiting does not mend (redis-py's message)."""


class StackRedis:
    """A client of the redis-server `jobpool up` started, with redis-py's defaults (no timeouts: it is a
    local child of `up`; replies as bytes)."""

    def __init__(self, url: str) -> None:
        self._client = redis.Redis.from_url(url)

    def close(self) -> None:
        self._client.close()

    def serving(self) -> Serving:
        """PING, which a redis-server refuses while it loads its AOF (INFO does not: it would answer too
        soon). `Refused` for any other error."""
        try:
            self._client.ping()
        except redis.BusyLoadingError:
            return Serving.LOADING
        except redis.ConnectionError:
            return Serving.UNREACHABLE
        except redis.RedisError as exc:
            raise Refused(str(exc)) from None
        return Serving.YES

    def server_pid(self) -> Any:
        """The pid of the process that serves, as INFO server says it (None when it does not). `Refused` for
        any error."""
        try:
            return self._client.info("server").get("process_id")
        except redis.RedisError as exc:
            raise Refused(str(exc)) from None

    def check_policy(self, warn: Callable[[str], None]) -> None:
        """What every process that writes does first (store/redispolicy.py `check_at_start`): `EvictingRedis`
        for a Redis that may evict job rows, `warn` for one that may evict leases or whose policy cannot be
        read."""
        redispolicy.check_at_start(self._client, warn=warn)

    def mark(self, pool: str, stack_id: str) -> None:
        """Write the stack's id into this Redis, for `holds_stack_id`. Redis's errors typed (`call_redis`)."""
        call_redis(self._client.set, PoolKeys(pool).up_stack, stack_id, what="up")


def holds_stack_id(url: str, key: str, stack_id: str, timeout_secs: float) -> bool | None:
    """Whether the Redis at `url` holds `stack_id` at `key` (one GET, nothing written): False for another
    value, none, or an error reply; None when it cannot be asked (no answer within `timeout_secs`, a refused
    connection, or a URL no client can be made from)."""
    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout_secs, socket_connect_timeout=timeout_secs,
                                      decode_responses=True)
    except ValueError:
        return None
    try:
        return bool(client.get(key) == stack_id)
    except (redis.ConnectionError, redis.TimeoutError):
        return None
    except redis.RedisError:
        return False
    finally:
        client.close()
