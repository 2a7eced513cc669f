"""What a sweep decided and did: per-row decisions and the summary written to `last_sweep`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .verdicts import Brief, Kind, Verdict, attempt_number, held_verdict

#: How many of a sweep's unknown-held jobs its summary names (status and the dashboard show them).
UNKNOWN_NAMED = 50


@dataclass
class Decision:
    """One row's verdict in a sweep, and what applying it did."""

    job_id: str
    attempt: int
    owner_boot: str
    verdict: Verdict
    expected: str
    #: After applying: the row's new state; "kept"; "conflict" (the row moved on); "adoption requested" /
    #: "adoption pending"; "not applied (dry run)"; or "error: ...".
    outcome: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt, "owner_boot": self.owner_boot,
                "verdict": self.verdict.to_dict(), "expected": self.expected, "outcome": self.outcome}


@dataclass
class SweepReport:
    """What one sweep decided. The rows kept on a held lease alone (the bulk of a large fleet) are counted
    and listed compactly (`held`); their `Decision`s are made only when someone reads `decisions`."""

    pool: str
    at_ms: int = 0
    rows: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    unknown: int = 0
    conflicts: int = 0
    promoted: int = 0
    #: Finished jobs removed past retention in this sweep (jobpool/retention.py).
    pruned: int = 0
    duration_ms: float = 0.0
    #: Where the time went: read (rows, leases, RQ facts), probe, decide+apply, promote.
    phases_ms: dict[str, float] = field(default_factory=dict)
    dry_run: bool = False
    #: The decisions about the rows judged one by one (every row but the held ones).
    judged: list[Decision] = field(default_factory=list)
    #: The first UNKNOWN_NAMED jobs whose probe was unknown, with why (their slots were kept).
    unknown_jobs: list[dict[str, Any]] = field(default_factory=list)
    #: The rows kept because their owner holds its lease, as the sweep's first pass read them.
    held: list[Brief] = field(default_factory=list)
    #: The sweep interval this sweep ran under (ms), and whether the sweep took longer than it: the next one
    #: then starts as soon as this one ended (supervisor/loop.py), never beside it and never more than one.
    interval_ms: float = 0.0
    overran: bool = False

    @property
    def decisions(self) -> list[Decision]:
        """Every row's decision: the judged rows', then the held rows' (keep, made on demand)."""
        outcome = "not applied (dry run)" if self.dry_run else "kept"
        made = []
        for job_id, owner, attempt_read, _, _ in self.held:
            attempt = attempt_number(attempt_read)
            made.append(Decision(job_id, attempt, owner or "", held_verdict(owner or "", attempt), "running",
                                 outcome))
        return self.judged + made

    def keep_held(self, held: list[Brief]) -> None:
        """Count the rows kept on their held lease (no `Decision` is made for them here)."""
        self.held = held
        if held:
            self.verdicts[Kind.KEEP.value] += len(held)

    def record(self, decision: Decision, unknown: bool) -> None:
        """Count one row's verdict (and whether its probe was unknown) before it is applied."""
        self.judged.append(decision)
        self.verdicts[decision.verdict.kind.value] += 1
        self.unknown += unknown
        if unknown and len(self.unknown_jobs) < UNKNOWN_NAMED:
            v = decision.verdict
            self.unknown_jobs.append({"job": decision.job_id, "attempt": decision.attempt, "reason": v.reason,
                                      "evidence": v.evidence})

    def summary(self) -> dict[str, Any]:
        """What `pool.keys.last_sweep` holds (the CLI's `status` reads it)."""
        return {"at": self.at_ms, "rows": self.rows, "verdicts": dict(sorted(self.verdicts.items())),
                "unknown": self.unknown, "unknown_jobs": list(self.unknown_jobs), "conflicts": self.conflicts,
                "promoted": self.promoted,
                "pruned": self.pruned, "duration_ms": round(self.duration_ms, 1),
                "phases_ms": {k: round(v, 1) for k, v in self.phases_ms.items()},
                "interval_ms": round(self.interval_ms, 1), "overran": self.overran}

    def to_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "dry_run": self.dry_run, **self.summary(),
                "decisions": [d.to_dict() for d in self.decisions]}

    def line(self) -> str:
        kinds = " ".join(f"{k}={n}" for k, n in sorted(self.verdicts.items())) or "none"
        return (f"sweep pool={self.pool}{' (dry run)' if self.dry_run else ''}: rows={self.rows} "
                f"verdicts[{kinds}] unknown={self.unknown} conflicts={self.conflicts} "
                f"promoted={self.promoted} pruned={self.pruned} in {self.duration_ms:.1f} ms"
                + (f", longer than the sweep interval of {self.interval_ms / 1000:g} s" if self.overran
                   else ""))
