"""`Attempt`: the worker side of one job attempt, every write fenced on (boot id, attempt).

A worker that lost the row (evicted by an operator, reconciled by the supervisor, adopted by another
boot) gets `NotOwner` from its next write and must stop without writing anything else (docs/architecture.md,
'Every state change is one Lua script' and 'Workers').
"""

from __future__ import annotations

import uuid
from typing import Any

from .. import logtail
from ..errors import CorruptRow, InvalidSpec
from ..spec import JobSpec
from ..store.calls import Store
from ..store.replies import Requests

#: Log tails kept with the job row, so logs outlive the container.
LOG_TAIL_BYTES = logtail.LOG_TAIL_BYTES
#: Who the promotions a finish leaves to its caller are recorded as (`Store.finish_promotion`); the finish
#: itself, and what it promotes, names the boot.
ACTOR = "worker"


class Attempt:
    """One (job, attempt) as owned by one worker boot.

    Every write may be sent again when its reply was lost (`RedisUnavailable`): the fenced writes are
    idempotent, and `claim` called again on the same `Attempt` is the same claim (its token is this object's),
    so it succeeds again. A new `Attempt` for an owned attempt is a new claim, and is refused."""

    def __init__(self, store: Store, job_id: str, boot_id: str, attempt: int) -> None:
        self.store, self.job_id, self.boot_id, self.attempt = store, job_id, boot_id, int(attempt)
        self._lease_ms = int(store.settings.lease_secs * 1000)
        self._claim_token = uuid.uuid4().hex
        #: Whether the job keeps a checkpoint (`JobSpec.checkpoint`), known once claimed or adopted: without
        #: one, no daemon holds anything of it, so a handback gets no affinity and nothing is removed.
        self.checkpoint = True
        #: Its time limit per attempt in seconds (`JobSpec.timeout`; None: none), known once claimed or
        #: adopted: its watcher enforces it (workers/timelimit.py).
        self.timeout: int | None = None

    def claim(self, executor: str = "", daemon_id: str = "") -> tuple[JobSpec, Requests]:
        """Take the promoted row for this boot; first claim of an attempt wins (`NotOwner`/`Conflict`/
        `InvalidState` otherwise). The executor and daemon are recorded before anything is launched.
        Called again after a lost reply, it succeeds again (renewing the lease) if the lost call took the row.

        A spec that cannot be read (edited in Redis) can never be launched: the attempt is finished at once
        (failed, reason ``bad_spec: ...``, slot freed) and `CorruptRow` raised, rather than leaving a
        claimed row with nothing running to hold its slot for ever."""
        claimed = self.store.claim(self.job_id, self.boot_id, self.attempt, self._lease_ms, executor,
                                   daemon_id, self._claim_token)
        try:
            spec = JobSpec.from_json(claimed.spec_json)
        except InvalidSpec as exc:
            self.finish("error", reason=f"bad_spec: {exc}")
            raise CorruptRow(f"job {self.job_id}: its spec cannot be read ({exc}); the attempt ended failed",
                             self.job_id, "spec") from None
        self.checkpoint, self.timeout = spec.checkpoint, spec.timeout
        return spec, claimed.requests

    @classmethod
    def adopt(cls, store: Store, job_id: str, old_owner: str, attempt: int, boot_id: str,
              evidence: str, daemon_id: str) -> tuple[Attempt, JobSpec, str, Requests]:
        """Take over a running job whose owner's lease is gone and whose container still runs; refused
        (`Conflict`) unless the row's recorded daemon identity is `daemon_id`, the adopter's own."""
        me = cls(store, job_id, boot_id, attempt)
        adopted = store.adopt(job_id, old_owner, attempt, boot_id, me._lease_ms, evidence, daemon_id)
        spec = JobSpec.from_json(adopted.spec_json)
        me.checkpoint, me.timeout = spec.checkpoint, spec.timeout
        return me, spec, adopted.container_id, adopted.requests

    def heartbeat(self) -> Requests:
        return self.store.heartbeat(self.job_id, self.boot_id, self.attempt, self._lease_ms)

    def time_out(self, evidence: str) -> bool:
        """Mark this attempt as stopped for its time limit, before its watcher stops it
        (scripts/time_out.lua): its exit then fails it as `timeout`, or retries it. False when it was
        marked already (a mark sent again after a lost reply, or the one of the watcher it was adopted
        from)."""
        return self.store.time_out(self.job_id, self.boot_id, self.attempt, evidence)

    def append_log(self, text: str, position: str, linger_ms: int = 0) -> int:
        """Append to the job's live log what the attempt printed, up to `position` in its output
        (scripts/log_append.lua); `linger_ms` > 0 on its last append."""
        return self.store.append_log(self.job_id, self.boot_id, self.attempt, text, position, linger_ms)

    def set_container(self, container_id: str = "", daemon_id: str = "",
                      identity: dict[str, Any] | None = None) -> Requests:
        """Record what was launched. Fenced, and it renews the lease and reads the requests back as
        `heartbeat` does, so a Docker launch makes it its fence between create and start (one round trip
        where a heartbeat and then this would be two: workers/watch.py, `launch_and_watch`)."""
        return self.store.set_container(self.job_id, self.boot_id, self.attempt, container_id, daemon_id,
                                        identity, self._lease_ms, self._affinity_queue(daemon_id))

    def _affinity_queue(self, daemon_id: str) -> str:
        """The daemon's queue, where a handback of this job goes next (its checkpoint is on that daemon);
        none when checkpoints are on storage every host shares (Settings.checkpoint_root), or when the job
        keeps none."""
        if not daemon_id or self.store.settings.checkpoint_root or not self.checkpoint:
            return ""
        return self.store.keys.daemon_queue(daemon_id)

    def finish(self, kind: str, exit_code: int | None = None, reason: str = "",
               log_tail: bytes | str = b"", evidence: str = "") -> str:
        """Report the end of the attempt; returns the job's new state. `kind` (scripts/finish.lua): 'exit',
        'interrupted', 'oom', 'crashed' (with `reason`; it spends the pool's recovery budget), 'error'
        (never ran, with `reason`) or 'handback' (never ran because this worker's host failed, with `reason`:
        back to the queue at its place, no budget spent); `evidence` says how the end was seen, for the job's
        history."""
        if isinstance(log_tail, str):
            log_tail = log_tail.encode(errors="replace")
        tail = logtail.encode(log_tail)  # the last LOG_TAIL_BYTES, compressed when that pays
        done = self.store.finish(self.job_id, self.boot_id, self.attempt, kind, exit_code, reason, tail,
                                 self.store.settings.recovery_budget, evidence)
        self.store.finish_promotion(done, ACTOR)
        return done.state
