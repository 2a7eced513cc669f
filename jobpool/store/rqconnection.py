"""RQ's connection: the client a worker gives RQ's own classes, jobpool's one read on a connection RQ hands
back to it, and the one round of RQ's dequeue that jobpool sends itself.

RQ talks to Redis itself, through the connection it is given: its worker's bookkeeping, its queues' pushes
and pops, its job hashes and registries. jobpool's subclasses of RQ's worker (workers/rqworker.py,
workers/rqbookkeeping.py, workers/horses.py) call RQ's own methods on that connection, a few of them batched
in a pipeline of it; that is the one use of a Redis client outside this package (docs/architecture.md, "Only
the store talks to Redis"; tests/unit/test_store_boundary.py names those modules). Every such connection is
made in this package: a worker's here, the supervisor's (for RQ's `Queue`, to enqueue adoption requests) by
`Store.rq_client`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from . import redisurl
from .keys import PoolKeys


def worker_connection(url: str) -> redis.Redis:
    """The connection a worker gives RQ: a client of the pool's Redis made as every jobpool client is
    (`redisurl.client`: Sentinel, no command sent again), its replies left as bytes (RQ decodes what it
    reads itself)."""
    return redisurl.client(url)


def row_state(connection: redis.Redis, pool: str, job_id: str) -> str | None:
    """A job's state as its row says, read on a connection RQ handed over (its success callback's:
    jobpool/rqjob.py); None when there is no row. `ConfigError` for a name that is no pool's. redis-py's
    errors are raised as they are: this module is loaded with the scripts' text (store/luatext.py reads
    rqjob.py), before the error mapping of store/runner.py."""
    state: Any = connection.hget(PoolKeys(pool).job(job_id), "state")
    return state.decode(errors="replace") if isinstance(state, bytes) else state


def block_then_look(connection: redis.Redis, queue_key: str, intermediate_key: str, timeout: int,
                    looks: Sequence[tuple[str, str]]) -> list[Any]:
    """One round trip of a worker's dequeue (workers/routedqueue.py `RoutedQueue.lmove`): RQ's blocking move
    of `queue_key`'s head to its intermediate list, then RQ's non-blocking move of each of `looks` (a queue
    and its intermediate list), which the server runs as soon as the block ends. The replies in that order,
    each an entry taken, None, or the error the server answered (left for the caller to weigh against what was
    taken)."""
    pipe = connection.pipeline(transaction=False)
    pipe.blmove(queue_key, intermediate_key, timeout)
    for key, intermediate in looks:
        pipe.lmove(key, intermediate)
    return list(pipe.execute(raise_on_error=False))
