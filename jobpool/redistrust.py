"""Whether Redis's state may be acted on destructively just now: the one rule every actor that stops or
removes work on the strength of what Redis says applies (docs/architecture.md, "Rules the verdicts encode,
and why").

A lease lapses while Redis is away (restarted, failed over, or out of this process's reach), and a worker
then holds a write it retries until Redis answers again (an exit code, a fence). A Redis that restarted from
an older file, or a replica promoted before it had every write, may also have forgotten an acknowledged
claim. So for one lease after this process reaches Redis again, after redis-server started, or after the
server answering is another one (its `run_id` changed: a restart or a failover; or its replication id: a
failover, and one back to a server that answered before), what Redis says of a lease or a row is not yet
proof that the work it speaks of is gone or superseded. The supervisor holds its
"absent" verdicts (supervisor/evidence.py), and the workers' inventory publisher removes no created container
and stops no stray (workers/inventory.py) until the lease has passed.
"""

from __future__ import annotations

import time
from typing import Protocol

from .errors import RedisUnavailable
from .store.reads import ServerRun


class AnswersServerRun(Protocol):
    """What the rule reads of Redis: which server process answers (`store.reads.Reads.server_run`)."""

    def server_run(self) -> ServerRun: ...


class RedisTrust:
    """What one process has seen of its Redis: when it last lost and found it again, and which server it was.

    `settling()` says why Redis's state cannot be acted on yet ('' when it can). Call `lost()` whenever a
    call to Redis failed for want of Redis (an outage, a dropped connection, a refused write)."""

    def __init__(self, server: AnswersServerRun, lease_secs: float, fresh: bool = False) -> None:
        """`server`: the pool's store, which asks Redis. `fresh`: this process cannot know what came before
        it (a worker's inventory publisher, which may take a daemon's lead from one that died, right after a
        failover it never saw: a promoted replica's uptime is long, and redis-py reconnects without an
        error), so it settles for a lease from now."""
        self.server = server
        self.lease_secs = lease_secs
        self._lost = False
        self._back_at: float | None = time.monotonic() if fresh else None
        #: A fresh process's lease runs from its first look instead (`settling`).
        self._first_look = fresh
        self._run_id: str | None = None
        self._replid: str | None = None
        self._changed_at: float | None = None

    def lost(self) -> None:
        """A call found Redis unreachable: once it answers again, its state needs a lease to settle."""
        self._lost = True

    def settling(self) -> str:
        """Why Redis's state is not yet evidence to stop or remove work on, or ''."""
        lease = self.lease_secs
        now = time.monotonic()
        try:
            run = self.server.server_run()
        except RedisUnavailable as exc:
            self._lost = True
            return str(exc)
        if self._lost:
            self._lost, self._back_at = False, now
        if self._first_look:
            # A fresh process knows nothing before its first look: a change it did not see may have come
            # just before, so its lease runs from this look (a publisher looks first once its daemon is
            # trusted, which may be well after its start).
            self._first_look, self._back_at = False, now
        run_id, replid = run.run_id, run.replid
        if (self._run_id and run_id and run_id != self._run_id) or (
                self._replid and replid and replid != self._replid):
            self._changed_at = now
        self._run_id = run_id or self._run_id
        self._replid = replid or self._replid
        if self._back_at is not None and now - self._back_at < lease:
            return f"this process (re)connected to redis {now - self._back_at:.1f}s ago"
        if self._changed_at is not None and now - self._changed_at < lease:
            return (f"another redis-server answers since {now - self._changed_at:.1f}s "
                    "(restarted, or a replica promoted)")
        if run.uptime_secs is not None and run.uptime_secs < lease:
            return f"redis-server started {run.uptime_secs}s ago"
        return ""
