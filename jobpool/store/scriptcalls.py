"""`ScriptCalls`: what every part of `store.calls.Store` that runs scripts shares: running a script by name
with the pool keys its header names (`run`), and reading the promotion candidates just before a call that may
free a slot (`candidates`); with the readers of the replies several parts share (`moved`, `requests_of`).

The typed methods are split by who calls them: the API's changes of jobs and of the pool (store/calls.py), a
worker's fenced writes of one attempt (store/workercalls.py), the supervisor's verdicts (store/sweepcalls.py)
and the fleet's records of daemons (store/fleetcalls.py). Each builds its script's KEYS and ARGV, as that
script's header in jobpool/scripts/ declares them, and reads its reply into a value of store/replies.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from .keys import PoolKeys
from .replies import Moved, Requests
from .runner import Scripts, call_redis

#: How many head-of-queue candidates a slot-freeing call carries (scripts/_lib.lua caps a batch at 64).
CANDIDATES_ON_RELEASE = 4
CANDIDATES_ON_PROMOTE = 32
#: A promotion finished by `promote_all` is bounded: each round promotes or stops.
PROMOTE_ROUNDS = 1000

#: A script's own KEYS and ARGV, as both stores (this one and store/asyncstore.py) send them: (keys, args).
Call = tuple[list[str], list[Any]]


def candidate_keys(keys: Any, ids: Sequence[str], routes: Sequence[Any]) -> list[str]:
    """The promotion candidates' keys for queued `ids` and the RQ list each row routes it to (`routes`: its
    `affinity_queue` as read, else the pool's queue): what `Store.candidates` and the asyncio store pass."""
    return [key for job_id, route in zip(ids, routes, strict=True)  # a row not a hash: the script drops
            for key in (keys.job(job_id), keys.rq_job(job_id),
                        route if isinstance(route, str) and route else keys.rq_queue)]


def requests_of(pause: Any, cancel: Any) -> Requests:
    """The persisted requests a fenced write reads back (claim.lua, set_container.lua, ...)."""
    return Requests(pause == "1", cancel == "1")


def moved(reply: list[Any]) -> Moved:
    """The reply of a script that moves a job and may promote (pause_job.lua, resume_job.lua, ...)."""
    return Moved(state=str(reply[1]), promoted=int(reply[2]), why_stopped=reply[3])


class ScriptCalls:
    """The scripts of one pool on one client (a part of `store.calls.Store`, which sets these)."""

    client: redis.Redis
    keys: PoolKeys
    scripts: Scripts
    #: Each script's pool keys, in the order its header names them (luatext.shape): after its own KEYS.
    _pool_keys: dict[str, list[str]]

    def pool_keys(self, op: str) -> list[str]:
        """The pool keys script `op` takes after its own (its header's `Pool keys:`; a fresh list)."""
        return list(self._pool_keys[op])

    def run(self, op: str, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
        """Script `op` with its own `keys`, then the pool keys it names (scripts/_lib.lua), its reply as a
        list: what the typed methods below use, and what the scripts' own tests call to reach a script's raw
        contract."""
        return self.scripts.run(op, [*keys, *self._pool_keys[op]], args)

    def candidates(self, n: int) -> list[str]:
        """Keys of the first `n` jobs of `ready` (the queued less the parked), what a slot-freeing script may
        promote (checked there): row, RQ
        job hash, and the RQ list the row routes it to (`affinity_queue`, else the pool's queue)."""
        ids = call_redis(self.client.zrange, self.keys.ready, 0, n - 1)
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(self.keys.job(job_id), "affinity_queue")
        routes = call_redis(pipe.execute, raise_on_error=False, what="candidates") if ids else []
        return candidate_keys(self.keys, ids, routes)
