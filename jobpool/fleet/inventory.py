"""A Docker daemon's inventory: what the workers on a daemon publish so that a supervisor on another host can
judge that daemon's containers without asking it (docs/architecture.md, "Many hosts").

The format is shared by the publisher (jobpool/workers/inventory.py, in every worker process, one of them
elected per daemon) and the judge (jobpool/supervisor/remote.py), so it is defined here once. One inventory
is one hash `inventory:<daemon identity>` (jobpool/store/keys.py), written whole by
scripts/publish_inventory.lua:

| field | holds |
|---|---|
| `daemon_id` | the daemon's identity (jobpool/fleet/daemonid.py) the listing came from |
| `kernel_boot_id` | the boot id of the host's kernel (the part after '@' of the identity) |
| `at` | when it was written (ms, Redis's clock: no host's clock is compared with another's) |
| `first_at` | when this daemon identity was first published (ms): the boot rule compares it |
| `publisher` | the worker boot that wrote it |
| `complete` | 1 when every container of the pool is listed; 0 when some were left out (too many) |
| `containers` | a JSON array of entries `[job id, attempt, state, exit code, container id, cause, reason]` |
| `strays` | a JSON array of the running containers no row accounts for, being stopped (fleet/strays.py) |

An entry's state is `running` (running, paused or restarting), `exited` (with its exit code and, when the
publisher inspected it, what ended it: jobpool/exits.py), `created` (never started) or `unknown` (a state the
publisher could not read, its reason in the place of the cause).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from ..contract import INVENTORY_MAX_BYTES
from .daemonid import uuid_of

RUNNING, EXITED, CREATED, UNKNOWN = "running", "exited", "created", "unknown"
STATES = frozenset({RUNNING, EXITED, CREATED, UNKNOWN})
#: Entries of the `inventories` index older than this are forgotten (the boot rule needs the last
#: publication of a daemon that went away; a week covers any reboot).
FORGET_MS = 7 * 86400 * 1000
#: The items of an encoded `Entry` (its `encode`).
_ENCODED_LEN = 7


@dataclass(frozen=True)
class Entry:
    """One jobpool container of a daemon, as its publisher saw it."""

    job_id: str
    attempt: int
    state: str
    exit_code: int | None = None
    container_id: str = ""
    #: For an exited container: what ended it (jobpool/exits.py: '' its own exit, 'oom', 'crashed');
    #: for an unknown one, why it is unknown.
    cause: str = ""
    reason: str = ""

    def encode(self) -> list[object]:
        return [self.job_id, self.attempt, self.state, self.exit_code, self.container_id, self.cause,
                self.reason]

    @classmethod
    def decode(cls, raw: object) -> Entry | None:
        """An entry as written, or None for anything malformed (it is then simply not evidence)."""
        if not _readable(raw):
            return None
        job_id, attempt, state, code, cid, cause, reason = cast(list[Any], raw)
        return cls(job_id, attempt, str(state), code, str(cid or ""), str(cause or ""), str(reason or ""))


def _readable(raw: object) -> bool:
    """Whether an item of `containers` is an entry `Entry.decode` makes: a list of its seven values, the job
    id a string, the attempt and any exit code whole numbers, the state one of `STATES`."""
    if not isinstance(raw, list) or len(raw) != _ENCODED_LEN:
        return False
    job_id, attempt, state, code = raw[:4]
    return (isinstance(job_id, str) and isinstance(attempt, int) and isinstance(state, str)
            and state in STATES and (code is None or isinstance(code, int)))


class Listed(Mapping[str, list[Entry]]):
    """An inventory's entries by job id, as read: a supervisor asks for a few jobs of inventories that list
    hundreds (jobpool/supervisor/remote.py), so the items are grouped by job id at the first question, a
    job's are made into `Entry`s when it is asked for, and whether every item is readable is found out only
    when asked (`readable`: what makes "not listed" proof of absence)."""

    def __init__(self, items: list[Any]) -> None:
        self._items = items
        self._by_job: dict[str, list[list[Any]]] | None = None
        self._made: dict[str, list[Entry]] = {}
        self._readable: bool | None = None

    @property
    def readable(self) -> bool:
        """Whether every item is an entry `Entry.decode` makes."""
        if self._readable is None:
            self._readable = all(map(_readable, self._items))
        return self._readable

    def _index(self) -> dict[str, list[list[Any]]]:
        if self._by_job is None:
            by_job: dict[str, list[list[Any]]] = {}
            for item in self._items:  # the rest is not an entry of any job, and `readable` says so
                if type(item) is list and item and type(item[0]) is str:
                    by_job.setdefault(item[0], []).append(item)
            self._by_job = by_job
        return self._by_job

    def __getitem__(self, job_id: str) -> list[Entry]:
        made = self._made.get(job_id)
        if made is None:
            made = [e for e in map(Entry.decode, self._index()[job_id]) if e is not None]
            if not made:
                raise KeyError(job_id)  # only unreadable items name it: it is not listed
            self._made[job_id] = made
        return made

    def __iter__(self) -> Iterator[str]:
        return (job_id for job_id in self._index() if job_id in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def encode(entries: Iterable[Entry], max_bytes: int = INVENTORY_MAX_BYTES) -> tuple[str, bool]:
    """The `containers` field and whether it is complete: entries past `max_bytes` are left out, and then
    the inventory says so (the judge reads "not listed" in an incomplete inventory as unknown, not absent)."""
    out: list[str] = []
    size = 2
    complete = True
    for entry in entries:
        text = json.dumps(entry.encode(), separators=(",", ":"))
        if size + len(text) + 1 > max_bytes:
            complete = False
            break
        out.append(text)
        size += len(text) + 1
    return "[" + ",".join(out) + "]", complete


@dataclass(frozen=True)
class Inventory:
    """One published inventory, as read back."""

    daemon_id: str
    kernel_boot_id: str
    at_ms: int
    first_at_ms: int
    #: Whether its publisher listed every container of the pool (`complete` also asks that each be readable).
    listed_all: bool
    publisher: str = ""
    entries: Listed = field(default_factory=lambda: Listed([]))

    @property
    def complete(self) -> bool:
        """Every container of the pool on that daemon is listed, readably: only then is a container not listed
        one that is not there."""
        return self.listed_all and self.entries.readable

    def age_secs(self, now_ms: int) -> float:
        return max(0.0, (now_ms - self.at_ms) / 1000.0)

    def of(self, job_id: str) -> list[Entry]:
        return self.entries.get(job_id, [])


def parse(fields: Mapping[str, str | None]) -> Inventory | None:
    """An inventory from its hash (decoded strings), or None if it is missing or unreadable."""
    try:
        daemon_id = str(fields["daemon_id"] or "")
        at_ms = int(fields["at"] or "")
        first_at_ms = int(fields.get("first_at") or at_ms)
        raw = json.loads(fields.get("containers") or "[]")
    except (KeyError, TypeError, ValueError):
        return None
    if not daemon_id or not isinstance(raw, list):
        return None
    # An item that cannot be read makes it incomplete ("not listed" proves nothing): `Inventory.complete`.
    return Inventory(daemon_id, str(fields.get("kernel_boot_id") or ""), at_ms, first_at_ms,
                     fields.get("complete") == "1", str(fields.get("publisher") or ""), Listed(raw))


#: The fields the judge reads (HMGET), in this order.
FIELDS = ("daemon_id", "kernel_boot_id", "at", "first_at", "complete", "publisher", "containers")


def earlier_boots(me: str, last_at: Mapping[str, int], my_first_ms: int, now_ms: int,
                  stale_ms: int) -> list[str]:
    """The identities of daemon `me` under earlier boots of its host that are over, from the `inventories`
    index (identity -> its last publication, Redis's clock): the same daemon uuid, last published before
    `me` first was (`my_first_ms`), and silent for longer than the stale limit since. A clone of the data
    root on another host that still publishes is neither (its publications go on past `me`'s first): the
    rule of the boot rule in jobpool/supervisor/remote.py, seen from the new boot.

    The workers of the new boot listen on those boots' queues too (jobpool/workers/rqworker.py): a job with
    a checkpoint affinity to the old boot (its volume is on this daemon, which a reboot keeps) would
    otherwise wait on a queue no worker reads any more."""
    daemon = uuid_of(me)
    return sorted(d for d, last in last_at.items()
                  if d != me and uuid_of(d) == daemon and last < my_first_ms and now_ms - last > stale_ms)
