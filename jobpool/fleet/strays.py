"""Stray containers: running jobpool containers that the pool's current rows do not account for
(docs/architecture.md, "Strays").

A container runs for its row's current attempt on the daemon and as the container the row names. One that
does not is a copy nobody watches, typically left behind when Redis lost an acknowledged claim (a failover
to a lagging replica, a restart from an older file) and the attempt was claimed again, or when a daemon
declared gone came back: it runs outside any slot, beside the attempt the row does account for. The workers
on its daemon stop it (jobpool/workers/inventory.py), record why in the job's history, and publish it in
their daemon's inventory until it is gone, so `status`, the dashboard and the metrics show it.

The rule is defined here once, as a pure function of the container's labels and the row, and the format of
the inventory's `strays` field with it (written by the publisher, read by jobpool/status/read.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: The row fields the rule reads (HMGET), in this order.
ROW_FIELDS = ("state", "attempt", "daemon_id", "container_id", "owner_boot")
#: The items of an encoded `Stray` (its `encode`).
_ENCODED_LEN = 5


def why_stray(row: Sequence[str | None] | None, attempt: int, container_id: str, known_launcher: bool) -> str:
    """Why the running container `container_id` (labelled with `attempt`) is a stray, given its job's row
    (`ROW_FIELDS`, all None when there is no row), or ''. `known_launcher`: the boot that launched it (its
    label) is one this pool's Redis knows, so a missing row is this pool's job gone, not another pool's of
    the same name on the same daemon (two `jobpool up` stacks), which is none of ours to judge.

    Positive evidence only. A container is a stray when its job has no row (and it is ours), runs another
    attempt, is no longer running, or names another container for this attempt (container ids are unique,
    whatever daemon identity either side recorded: the same daemon can carry two identities, and a mismatch
    of identities alone is unknown, docs/architecture.md, "The daemon's identity"). Not a stray: the row
    names this container, or none yet. A launcher records its container before it starts it, so a row
    claimed elsewhere that names none yet is judged again once it does; and an unrecorded container on the
    attempt's own daemon is one whose record Redis lost (a second launch of the attempt there is refused by
    Docker by name, workers/executors/docker.py), which the supervisor adopts."""
    if row is None or row[0] is None:
        return "its job has no row in the pool" if known_launcher else ""
    state, row_attempt, row_daemon, row_container, _owner = (v or "" for v in row)
    if row_attempt != str(attempt):
        return f"attempt {attempt} is not its job's current attempt ({row_attempt or 'none'})"
    if state != "running":
        return f"its job is {state or 'in no state'}, not running attempt {attempt}"
    if row_container and row_container != container_id:
        where = f" on daemon {row_daemon}" if row_daemon else ""
        return f"its job's attempt {attempt} runs as container {row_container[:12]}{where}"
    return ""


@dataclass(frozen=True)
class Stray:
    """One stray container as its daemon's publisher saw it."""

    job_id: str
    attempt: int
    container_id: str
    reason: str
    #: When it was first found a stray (ms, Redis's clock).
    since_ms: int
    daemon_id: str = ""

    def encode(self) -> list[object]:
        return [self.job_id, self.attempt, self.container_id, self.reason, self.since_ms]

    def to_dict(self) -> dict[str, object]:
        return {"job": self.job_id, "attempt": self.attempt, "container": self.container_id,
                "daemon": self.daemon_id, "reason": self.reason, "since": self.since_ms}


def encode(strays: Iterable[Stray], max_count: int = 100) -> str:
    """The inventory's `strays` field: a JSON array, at most `max_count` entries."""
    return json.dumps([s.encode() for s in list(strays)[:max_count]], separators=(",", ":"))


def decode(raw: str | None, daemon_id: str) -> list[Stray]:
    """The strays of one inventory; malformed entries are left out (they are shown, not acted on)."""
    try:
        items = json.loads(raw or "[]")
    except ValueError:
        return []
    out = []
    for item in items if isinstance(items, list) else []:
        if (isinstance(item, list) and len(item) == _ENCODED_LEN
                and all(isinstance(item[i], int) for i in (1, 4))):
            out.append(Stray(str(item[0]), item[1], str(item[2]), str(item[3]), item[4], daemon_id))
    return out
