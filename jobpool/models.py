"""What the API hands back: job states and `Job` snapshots read from a row."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .spec import JobSpec


class JobState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


def _int(v: str | None) -> int | None:
    return int(v) if v not in (None, "") else None


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

    @classmethod
    def from_row(cls, row: dict[str, str], coalesced: bool = False) -> Job:
        return cls(
            id=row["id"], state=JobState(row["state"]), spec=JobSpec.from_json(row["spec"]),
            seq=int(row["seq"]), attempt=int(row.get("attempt", 0)), created_at=int(row["created_at"]),
            recovery_attempts=int(row.get("recovery_attempts") or 0), exit_code=_int(row.get("exit_code")),
            error_reason=row.get("error_reason", ""), coalesced=coalesced,
            coalesce_key=row.get("coalesce_key", ""), owner_boot=row.get("owner_boot", ""),
            container_id=row.get("container_id", ""), daemon_id=row.get("daemon_id", ""),
            identity=row.get("identity", ""), pause_requested=row.get("pause_requested") == "1",
            cancel_requested=row.get("cancel_requested") == "1", promoted_at=_int(row.get("promoted_at")),
            claimed_at=_int(row.get("claimed_at")), heartbeat_at=_int(row.get("heartbeat_at")),
            finished_at=_int(row.get("finished_at")),
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (the CLI's --json)."""
        return {
            "id": self.id, "state": self.state.value, "attempt": self.attempt, "seq": self.seq,
            "created_at": self.created_at, "exit_code": self.exit_code, "error_reason": self.error_reason,
            "recovery_attempts": self.recovery_attempts, "coalesced": self.coalesced,
            "owner_boot": self.owner_boot, "container_id": self.container_id, "daemon_id": self.daemon_id,
            "pause_requested": self.pause_requested, "cancel_requested": self.cancel_requested,
            "promoted_at": self.promoted_at, "claimed_at": self.claimed_at, "finished_at": self.finished_at,
            "spec": {"image": self.spec.image, "command": list(self.spec.command), "env": {k: "<redacted>" for k in self.spec.env},  # values may be secrets
                     "workdir": self.spec.workdir, "user": self.spec.user, "network": self.spec.network,
                     "cpus": self.spec.cpus, "memory": self.spec.memory, "labels": dict(self.spec.labels),
                     "mounts": list(self.spec.mounts)},
        }
