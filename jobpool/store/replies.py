"""What the Lua scripts answer, as small frozen values: the one place besides `store.calls` that knows a
reply's shape, so no caller reads a reply by position (each script's header in jobpool/scripts/ says what it
returns; `store.calls.Store` reads it into these).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: The `why_stopped` values after which the caller promotes again: the candidates it passed ran out or went
#: stale (scripts/_lib.lua, promote_candidates).
PROMOTE_AGAIN = ("stale", "batch")


@dataclass(frozen=True)
class Requests:
    """Persisted user intent read back with each fenced write of an attempt (claim, heartbeat, ...)."""

    pause: bool
    cancel: bool
    #: Someone follows the job's live log (heartbeat.lua): its watcher sends it every second.
    followed: bool = False


@dataclass(frozen=True)
class Release:
    """What a script that may free a slot or promote did with the queue's head: how many jobs it promoted
    and why it stopped (paused | full | empty | stale | batch, or 'none' when no slot was freed)."""

    promoted: int
    why_stopped: str

    @property
    def promote_again(self) -> bool:
        """Whether the promotion is left to finish (`Store.finish_promotion`)."""
        return self.why_stopped in PROMOTE_AGAIN


@dataclass(frozen=True)
class Moved(Release):
    """A job's state after a script that may free its slot (cancel, pause_job, resume_job, evict, finish,
    reconcile_apply)."""

    state: str


@dataclass(frozen=True)
class Cancelled(Moved):
    """cancel's reply: besides the state after, the owner boot and attempt of a claimed running job (whose
    watcher, or the caller, stops its container)."""

    owner_boot: str
    #: As stored in the row ('' when it holds none).
    attempt: str


@dataclass(frozen=True)
class QueueResumed(Release):
    """resume_queue's reply: whether promotion was paused."""

    was_paused: bool


@dataclass(frozen=True)
class SlotsSet(Release):
    """set_slots's reply: the limit before the change."""

    old: int


@dataclass(frozen=True)
class LimitSet(Release):
    """limit.lua's reply: the limit's size before the change (None: there was none)."""

    old: int | None


@dataclass(frozen=True)
class GhostDropped(Release):
    """drop_ghost's reply: whether the id was still in `running` and left it."""

    dropped: bool


@dataclass(frozen=True)
class Enqueued(Release):
    """enqueue's reply: how many rows it made, the server's time they were made at, and per job in input
    order what became of it (`jobs`)."""

    created: int
    now: int
    #: The reply's per-job part, four values a job (scripts/enqueue.lua); read through `jobs`.
    entries: tuple[Any, ...]

    def jobs(self) -> Iterator[tuple[int, str, str, str]]:
        """Per job: whether it coalesced (1 or 0), the id (of the queued job it equals, when it did), its seq
        and its state ('' both when it coalesced)."""
        e = self.entries
        return zip(e[0::4], e[1::4], e[2::4], e[3::4], strict=True)


@dataclass(frozen=True)
class Claimed:
    """claim's reply: the job's spec as stored (JSON) and the requests persisted on its row."""

    spec_json: str
    requests: Requests


@dataclass(frozen=True)
class Adopted:
    """adopt's reply: the job's spec (JSON), the container recorded for the attempt, and the requests."""

    spec_json: str
    container_id: str
    requests: Requests


@dataclass(frozen=True)
class DaemonBoots:
    """The reads a worker's look for earlier boots of its daemon takes (jobpool/fleet/inventory.py
    `earlier_boots`): when each daemon last published (ms; only those silent since before `before_ms` when it
    was given), when the asker's daemon first published (None if never), and the server's time (ms)."""

    index: dict[str, int]
    first: str | None
    now_ms: int


@dataclass(frozen=True)
class Lead:
    """inventory_lead's reply: whether the asking boot holds the daemon's lead, and which boot does (and, for
    another, how long its lead has left); with the earlier-boots look's reads when they were asked for in the
    same round trip (`boots`: None when not asked, the error a read met in its place)."""

    held: bool
    holder: str
    boots: DaemonBoots | Exception | None = None
    #: For a follower: how long (ms) the holder's lead has left at most, as read with its holder (PTTL):
    #: it cannot lapse sooner, so the follower need not read it again before then (0: not read, as when the
    #: lead was taken by another just before this boot's script ran). None when this boot holds it, or when
    #: it has no expiry, which only a hand-made key has.
    lapse_ms: int | None = None


@dataclass(frozen=True)
class Marked:
    """daemon_mark's reply: when (ms, the server's time), whether this call recorded a new collision, and
    whether the caller took the pool's turn to index unindexed records (markrecords.index_unindexed)."""

    at: int
    recorded: bool
    scan: bool = False


@dataclass(frozen=True)
class MarkRound:
    """daemon_mark_round's reply: the refresh's `Marked`, the standing collision on the identity (its JSON,
    None for none), the processes in the identity's index, the records read (process id -> fields; {} for a
    record gone) and the processes named whose record is as the caller last read it (`unchanged`): together,
    one for each process the call named. `complete`: whether `ids` is the whole index (the script reads a
    bounded number of ids)."""

    marked: Marked
    standing: str | None
    ids: tuple[str, ...]
    records: dict[str, dict[str, str]]
    unchanged: frozenset[str] = frozenset()
    complete: bool = True


@dataclass(frozen=True)
class CollisionCleared:
    """forget_collision's reply: when (ms, the server's time), and how many records' reports were emptied."""

    at: int
    cleared: int
