"""Reading a pool's events: a range from the start, the newest few, and following them live.

Every script appends its transitions to one capped stream, and a job's own transitions to its row's
`history` too (docs/architecture.md, "The Redis data model"); these are their only readers, behind
`Pool.events`, `Pool.tail_events` and `Pool.follow_events`. One job's events come from its row, so finding
them costs what that job has, not what the stream holds; a row written before rows kept a history falls back
to filtering the stream. Entries come back as dicts of the stream's fields plus their stream ``id``.

A job's history is whole unless it outgrew contract.HISTORY_MAX_BYTES: then one of its entries, after its
first few, has reason contract.REASON_HISTORY_TRIMMED and stands for the run of events dropped there (its
evidence gives their number, first and last ids and times; scripts/_lib.lua `trim_history`). It is read and
returned like any other entry, so every reader shows it where the dropped events were.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import errors

if TYPE_CHECKING:
    from .store.calls import Store

#: Bounds of what a caller may ask for in one read: generous (the stream keeps about EVENTS_MAXLEN entries,
#: contract.py), but finite, so a huge number is a clear InvalidArgument and never a Redis overflow.
MAX_EVENTS = 10_000_000
#: Entries per round trip when paging back through the stream or following it.
PAGE = 1000
#: How long one wait of `follow` may block on the server, at least and at most.
MIN_BLOCK_SECS, MAX_BLOCK_SECS = 0.001, 3600
#: A stream entry id: "<ms>[-<seq>]"; `read` also takes "-" (the start) and "(" first (exclusive).
_STREAM_ID = re.compile(r"\(?([0-9]{1,20})(?:-([0-9]{1,20}))?")
#: The largest number Redis takes in a stream id or a counter.
UINT64_MAX = 2**64 - 1

Event = dict[str, str]


def _check_job(job_id: Any) -> None:
    if job_id is not None and not isinstance(job_id, str):
        raise errors.InvalidArgument(f"job_id must be a string, got {job_id!r}")


def _check_count(count: Any, low: int) -> None:
    if not isinstance(count, int) or isinstance(count, bool) or not low <= count <= MAX_EVENTS:
        raise errors.InvalidArgument(f"count must be a whole number from {low} to {MAX_EVENTS}, "
                                     f"got {count!r}")


def _is_stream_id(value: Any, exclusive_ok: bool) -> bool:
    m = _STREAM_ID.fullmatch(value) if isinstance(value, str) else None
    return (m is not None and (exclusive_ok or not value.startswith("("))
            and all(int(g) <= UINT64_MAX for g in m.groups() if g))


def _entry(entry_id: str, fields: dict[str, str]) -> Event:
    return {"id": entry_id, **fields}


#: The fields of one line of a row's history, in the order scripts/_lib.lua `event` writes them.
_HISTORY_FIELDS = ("id", "from", "to", "reason", "evidence", "actor", "at")


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.lstrip("(").partition("-")
    return int(ms), int(seq or 0)


def history(store: Store, job_id: str) -> tuple[list[Event] | None, str]:
    """A job's transitions from its row, oldest first, and the newest id in the stream then, read in one
    transaction so a follow from it has no gap and no repeat. None instead of the transitions when there is no
    row that keeps them: a row written before rows did, or none at all (a job pruned, dropped as a ghost or a
    corrupt row, or never there), whose traces only the stream may still hold."""
    found, newest = store.history_and_newest(job_id)
    return history_entries(job_id, found), newest[0][0] if newest else "0-0"


def history_entries(job_id: str, found: str | None) -> list[Event] | None:
    """A job's `history` field as read (None: the row keeps none) as its events, oldest first (`history`;
    the asyncio API reads the field itself)."""
    if found is None:
        return None
    entries = []
    for line in found.split("\n"):
        try:
            values = json.loads(line)
        except ValueError:
            values = None
        if not isinstance(values, list) or len(values) != len(_HISTORY_FIELDS):
            raise errors.CorruptRow(f"job {job_id}: field history is unreadable ({line[:60]!r})",
                                    job_id, "history")
        fields = dict(zip(_HISTORY_FIELDS, map(str, values), strict=True))
        entries.append({"id": fields.pop("id"), "job": job_id, **fields})
    return entries


def check_read(job_id: Any, count: Any, after: Any) -> None:
    """`read`'s arguments: `InvalidArgument` for a bad one."""
    _check_job(job_id)
    _check_count(count, 1)
    if after != "-" and not _is_stream_id(after, exclusive_ok=True):
        raise errors.InvalidArgument(f"after must be '-' or a stream id like '1700000000000-0', "
                                     f"got {after!r}")


def own_after(own: list[Event], after: str, count: int) -> list[Event]:
    """A job's own events from `after` ("-" or a stream id, "(" first: exclusive), at most `count`."""
    if after != "-":
        bound = _id_key(after)
        own = [e for e in own
               if _id_key(e["id"]) > bound or (not after.startswith("(") and _id_key(e["id"]) == bound)]
    return own[:count]


def stream_entries(entries: list[Any], job_id: str | None) -> list[Event]:
    """Stream entries as events, those of `job_id` alone when it is given."""
    return [_entry(entry_id, fields) for entry_id, fields in entries
            if job_id is None or fields.get("job") == job_id]


def read(store: Store, job_id: str | None, count: int, after: str) -> list[Event]:
    """`count` entries from `after` ("-" or a stream id, "(" first: exclusive), oldest first; those of
    `job_id` alone when it is given."""
    check_read(job_id, count, after)
    own = history(store, job_id)[0] if job_id is not None else None
    if own is not None:
        return own_after(own, after, count)
    return stream_entries(store.events_after(after, count), job_id)


def tail(store: Store, job_id: str | None, count: int) -> tuple[list[Event], str]:
    """The newest `count` entries (of `job_id`, if given), oldest first, and the id of the newest entry in
    the stream ("0-0" when it is empty): where a follow goes on without a gap or a repeat."""
    _check_job(job_id)
    _check_count(count, 0)
    own, newest_now = history(store, job_id) if job_id is not None else (None, "0-0")
    if own is not None:
        return (own[len(own) - count:] if count else []), newest_now
    newest, upper = "0-0", "+"
    found: list[Event] = []
    while len(found) < count:
        page = store.events_before(upper, PAGE)
        if not page:
            break
        if newest == "0-0":
            newest = page[0][0]
        for entry_id, fields in page:
            if job_id is None or fields.get("job") == job_id:
                found.append(_entry(entry_id, fields))
                if len(found) == count:
                    break
        upper = "(" + page[-1][0]
    if count == 0:
        newest = _newest(store)
    found.reverse()
    return found, newest


def _newest(store: Store) -> str:
    page = store.events_before("+", 1)
    return page[0][0] if page else "0-0"


def follow(store: Store, job_id: str | None, after: str | None, block_secs: float) -> Iterator[Event]:
    """Entries written after stream id `after` (None: after the newest now), as they come; each wait for
    new ones blocks at most `block_secs` on the server. Checked at once; the iterator never ends by itself."""
    check_follow(job_id, after, block_secs)
    return _follow(store, job_id, after if after is not None else _newest(store), int(block_secs * 1000))


def check_follow(job_id: Any, after: Any, block_secs: Any) -> None:
    """`follow`'s arguments (the asyncio API's too): `InvalidArgument` for a bad one."""
    _check_job(job_id)
    if after is not None and not _is_stream_id(after, exclusive_ok=False):
        raise errors.InvalidArgument(f"after must be a stream id like '1700000000000-0', got {after!r}")
    if (isinstance(block_secs, bool) or not isinstance(block_secs, (int, float)) or math.isnan(block_secs)
            or not MIN_BLOCK_SECS <= block_secs <= MAX_BLOCK_SECS):
        raise errors.InvalidArgument(f"block_secs must be from {MIN_BLOCK_SECS} to {MAX_BLOCK_SECS} seconds, "
                                     f"got {block_secs!r}")


def _follow(store: Store, job_id: str | None, after: str, block_ms: int) -> Iterator[Event]:
    while True:
        reply = store.events_following(after, PAGE, block_ms)
        for _key, entries in reply or []:
            for entry_id, fields in entries:
                after = entry_id  # a concrete id, never "$": nothing written between two reads is missed
                if job_id is None or fields.get("job") == job_id:
                    yield _entry(entry_id, fields)
