"""What the API hands back: `Job` snapshots read from a row. `JobState` is defined with the rest of the
cross-layer contract (jobpool/contract.py) and re-exported here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .contract import TERMINAL as TERMINAL  # re-exported: the API's default wait states
from .contract import JobState as JobState  # re-exported with the Job it describes
from .errors import CorruptRow, InvalidSpec
from .spec import JobSpec


class _Row:
    """Reads one stored row field by field; whatever cannot be read is a `CorruptRow` naming the field."""

    def __init__(self, row: Mapping[str, str], job_id: str) -> None:
        self.row, self.job_id = row, job_id

    def bad(self, name: str, why: str) -> CorruptRow:
        value = self.row.get(name)
        shown = "missing" if value is None else f"{value[:60]!r}"
        message = f"job {self.job_id}: field {name} is unreadable ({shown}): {why}"
        return CorruptRow(message, self.job_id, name)

    def whole(self, name: str, default: int | None = None) -> int:
        value = self.row.get(name)
        if value is None or value == "":
            if default is None:
                raise self.bad(name, "a whole number is required")
            return default
        try:
            return int(value, 10)
        except (TypeError, ValueError):
            raise self.bad(name, "not a whole number") from None

    def optional_whole(self, name: str) -> int | None:
        return None if self.row.get(name) in (None, "") else self.whole(name)

    def text(self, name: str) -> str:
        value = self.row.get(name, "")
        if not isinstance(value, str):
            raise self.bad(name, "not text")
        return value


@dataclass(frozen=True)
class Job:
    """A snapshot of one job row. Times are milliseconds since the epoch (Redis server clock)."""

    id: str
    state: JobState
    spec: JobSpec
    seq: int
    attempt: int
    created_at: int
    recovery_attempts: int = 0
    exit_code: int | None = None
    error_reason: str = ""
    coalesced: bool = False
    coalesce_key: str = ""
    owner_boot: str = ""
    container_id: str = ""
    daemon_id: str = ""
    identity: str = ""
    pause_requested: bool = False
    cancel_requested: bool = False
    promoted_at: int | None = None
    claimed_at: int | None = None
    heartbeat_at: int | None = None
    finished_at: int | None = None
    #: The daemon holding the job's checkpoint (scripts/finish.lua), where its next attempt belongs; '' = any.
    affinity: str = ""
    #: The jobs it waits for (`after`), and for a waiting job until when (ms) and why: 'not_before' (a delayed
    #: start), 'retry' (a retry's delay) or 'after' (only jobs hold it).
    after: tuple[str, ...] = ()
    wait_until: int | None = None
    wait_reason: str = ""
    #: How many of its spec's retries it has used.
    retries_used: int = 0
    #: The schedule that fired it, and the tick (ms), for a job a schedule made.
    schedule: str = ""
    tick: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, str], coalesced: bool = False, job_id: str | None = None) -> Job:
        """The one place a stored row is parsed. Anything unreadable (a field edited by hand, a spec that
        no longer parses, a row that names another job than `job_id`) raises `CorruptRow`."""
        ident = row.get("id")
        r = _Row(row, str(ident if ident else job_id))
        if not ident or not isinstance(ident, str) or (job_id is not None and ident != job_id):
            raise r.bad("id", f"expected {job_id!r}" if job_id else "the row names no job")
        try:
            state = JobState(row.get("state"))
        except ValueError:
            raise r.bad("state", "not a job state") from None
        try:
            spec = JobSpec.from_json(r.text("spec"))
        except InvalidSpec as exc:
            raise r.bad("spec", str(exc)) from None
        return cls(
            id=ident, state=state, spec=spec,
            seq=r.whole("seq"), attempt=r.whole("attempt", 0), created_at=r.whole("created_at"),
            recovery_attempts=r.whole("recovery_attempts", 0), exit_code=r.optional_whole("exit_code"),
            error_reason=r.text("error_reason"), coalesced=coalesced,
            coalesce_key=r.text("coalesce_key"), owner_boot=r.text("owner_boot"),
            container_id=r.text("container_id"), daemon_id=r.text("daemon_id"),
            identity=r.text("identity"), pause_requested=row.get("pause_requested") == "1",
            cancel_requested=row.get("cancel_requested") == "1", promoted_at=r.optional_whole("promoted_at"),
            claimed_at=r.optional_whole("claimed_at"), heartbeat_at=r.optional_whole("heartbeat_at"),
            finished_at=r.optional_whole("finished_at"), affinity=r.text("affinity"),
            after=tuple(r.text("after").split()), wait_until=r.optional_whole("wait_until"),
            wait_reason=r.text("wait_reason"), retries_used=r.whole("retries_used", 0),
            schedule=r.text("schedule"), tick=r.optional_whole("tick"),
        )

    def notes(self, exit_code: bool = True) -> list[str]:
        """What a reader of a job list most needs beyond the state (the CLI's `ls`, the dashboard's lists):
        its exit code (unless asked not to), an error reason, a request not yet acted on."""
        notes = [f"exit {self.exit_code}"] if exit_code and self.exit_code is not None else []
        if self.error_reason and self.error_reason != "cancelled":
            notes.append(self.error_reason)
        if self.cancel_requested and not self.state.terminal:
            notes.append("cancel requested")
        if self.pause_requested and self.state is JobState.RUNNING:
            notes.append("pause requested")
        return notes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (the CLI's --json)."""
        return {
            "id": self.id, "state": self.state.value, "attempt": self.attempt, "seq": self.seq,
            "created_at": self.created_at, "exit_code": self.exit_code, "error_reason": self.error_reason,
            "recovery_attempts": self.recovery_attempts, "coalesced": self.coalesced,
            "owner_boot": self.owner_boot, "container_id": self.container_id, "daemon_id": self.daemon_id,
            "pause_requested": self.pause_requested, "cancel_requested": self.cancel_requested,
            "promoted_at": self.promoted_at, "claimed_at": self.claimed_at, "finished_at": self.finished_at,
            "affinity": self.affinity, "after": list(self.after), "wait_until": self.wait_until,
            "wait_reason": self.wait_reason, "retries_used": self.retries_used, "schedule": self.schedule,
            "tick": self.tick,
            "spec": {"image": self.spec.image, "command": list(self.spec.command),
                     "env": {k: "<redacted>" for k in self.spec.env},  # values may be secrets
                     "workdir": self.spec.workdir, "user": self.spec.user, "network": self.spec.network,
                     "cpus": self.spec.cpus, "memory": self.spec.memory, "labels": dict(self.spec.labels),
                     "mounts": list(self.spec.mounts), "init": self.spec.init,
                     "checkpoint": self.spec.checkpoint, "priority": self.spec.priority,
                     "slots": self.spec.slots, "uses": dict(self.spec.uses), "group": self.spec.group,
                     "timeout": self.spec.timeout, "retries": self.spec.retries,
                     "retry_delay": self.spec.retry_delay, "retry_on": list(self.spec.retry_on)},
        }
