"""Reading a job's live log: what its attempts print while they run, from any host that reaches Redis.

The job's worker appends what its attempt printed about every second (workers/livelog.py, through
scripts/log_append.lua), so a reader needs nothing but Redis: not the job's host, nor its Docker daemon. A
position in the log is a byte offset (store/logreads.py), which is how a reader knows it missed bytes that
were trimmed before it read them, and says so in the lines it yields. A follower ends once the job has ended
and the log's last append is read: the worker appends what is left before it records the end. A finished
job's record is its row's log tail (jobpool/logtail.py), which a follower yields when the job ended before
it started, or before its first append (an attempt shorter than a read sends none).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from . import logtail
from .contract import LIVE_LOG_POLL_SECS, LIVE_LOG_WATCH_SECS, TERMINAL
from .errors import NotFound, no_job
from .store.calls import Store
from .store.eventreads import Entries

_ENDED = frozenset(s.value for s in TERMINAL)
#: How many entries one read takes (each is at most one append of about a second's output).
READ_ENTRIES = 64


@dataclass(frozen=True)
class Piece:
    """One append of the live log: `text` is the attempt's output from byte `start` of the log to `end`;
    `position` where its worker had read the attempt's output up to (its executor's token)."""

    start: int
    end: int
    attempt: str
    text: str
    position: str = ""


def pieces(entries: Entries) -> list[Piece]:
    """The appends `entries` hold (an entry that is not one is skipped: not jobpool's)."""
    out: list[Piece] = []
    for entry_id, fields in entries:
        end, _, _ = entry_id.partition("-")
        text = fields.get("d", "")
        if end.isdigit():
            out.append(Piece(int(end) - len(text.encode()), int(end), fields.get("a", ""), text,
                             fields.get("p", "")))
    return out


class LiveText:
    """What a job printed so far: its live log while it may still run, its row's log tail once it ended."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def now(self, job_id: str) -> str:
        """Everything the live log holds now, or the row's tail when the job ended or has no live log."""
        state, _ = self.store.log_end(job_id)
        if state is None:
            raise NotFound(no_job(job_id))
        if state not in _ENDED:
            self.store.watch_log(job_id, LIVE_LOG_WATCH_SECS)  # read again soon: fresher then
            found: list[Piece] = []
            while batch := pieces(self.store.log_after(job_id, found[-1].end if found else 0, READ_ENTRIES)):
                found += batch
            if found:
                return text_of(found)
        return logtail.decode(self.store.log_tail(job_id))

    def follow(self, job_id: str, block_secs: float = LIVE_LOG_POLL_SECS) -> Iterator[str]:
        """The job's output, line by line, as it is printed, from the oldest the live log still holds;
        ends once the job has ended. A job that ended already yields its row's log tail. An unknown job
        is `NotFound` at once, not at the first line."""
        state, _ = self.store.log_end(job_id)
        if state is None:
            raise NotFound(no_job(job_id))
        return self._follow(job_id, state, block_secs)

    def _follow(self, job_id: str, state: str, block_secs: float) -> Iterator[str]:
        lines = Following()
        if ended(state):
            yield from logtail.decode(self.store.log_tail(job_id)).splitlines()
            return
        block_ms = max(1, int(block_secs * 1000))
        while True:
            if lines.watch_due():
                self.store.watch_log(job_id, LIVE_LOG_WATCH_SECS)
            batch = pieces(self.store.log_following(job_id, lines.offset, READ_ENTRIES, block_ms))
            yield from lines.take(batch)
            if not batch:
                now, newest = self.store.log_end(job_id)
                if lines.idle(now, newest):
                    break
        yield from self._rest_of_log(job_id, lines, now)

    def _rest_of_log(self, job_id: str, lines: Following, state: str | None) -> list[str]:
        """Once the job ended: the log read to its end once (the worker appends what is left before it
        records the end), or its row's tail."""
        out: list[str] = []
        while batch := pieces(self.store.log_after(job_id, lines.offset, READ_ENTRIES)):
            out += lines.take(batch)
        out += lines.rest()
        if state is not None:
            out += lines.tail_lines(*self.store.log_tail_and_attempt(job_id))
        return out


class Following:
    """A follower between its reads (`LiveText.follow`, and `AsyncPool.follow_logs` the same with asyncio):
    appends made into lines, a line split across appends yielded whole, an attempt's change and a gap
    (bytes trimmed before they were read) said in a line of their own; and when to stop."""

    def __init__(self) -> None:
        self.offset = 0
        self.attempt = ""
        self.partial = ""
        self._watched_at: float | None = None

    def watch_due(self) -> bool:
        """Whether the follower renews its mark now (`LogReads.watch_log`): thrice a mark's life, so that
        the worker sees it on every heartbeat while the follower reads."""
        now = time.monotonic()
        if self._watched_at is not None and now - self._watched_at < LIVE_LOG_WATCH_SECS / 3:
            return False
        self._watched_at = now
        return True

    def take(self, batch: list[Piece]) -> Iterator[str]:
        for piece in batch:
            if piece.end <= self.offset:
                continue
            if piece.attempt != self.attempt:
                yield from self.rest()
                if self.attempt:
                    yield f"[jobpool: attempt {piece.attempt}]"
                self.attempt = piece.attempt
            if piece.start > self.offset:
                yield from self.rest()
                gap = piece.start - self.offset
                yield f"[jobpool: {gap:,} bytes of this log were trimmed before they were read]"
            self.offset = piece.end
            *done, self.partial = (self.partial + piece.text).split("\n")
            yield from done

    def rest(self) -> Iterator[str]:
        if self.partial:
            yield self.partial
            self.partial = ""

    def idle(self, state: str | None, newest: Entries) -> bool:
        """A read that waited found nothing: whether the job ended (its row's `state` now, None when it is
        gone); then the follower reads the log to its end once and stops. A log whose newest entry ends
        before this follower's position expired between attempts and was started again from 0 by a worker
        of 0.3.0 (later ones go on from its length, scripts/log_append.lua): read from 0."""
        if state is None or ended(state):
            return True
        last = pieces(newest)
        if last and last[0].end < self.offset:
            self.offset = 0
        return False

    def tail_lines(self, tail: str | None, attempt: str) -> list[str]:
        """After the end, the row's log tail (as stored, and the job's last `attempt`) if the follower never
        read that attempt's live log: it ended before its first read, which sends none."""
        if not attempt or attempt == self.attempt:
            return []
        said = [f"[jobpool: attempt {attempt}]"] if self.attempt else []
        return said + logtail.decode(tail).splitlines()


def text_of(batch: list[Piece]) -> str:
    """The text of `batch` as `follow` shows it: its lines, and jobpool's lines between them."""
    lines = Following()
    return "".join(line + "\n" for line in [*lines.take(batch), *lines.rest()])


def ended(state: str) -> bool:
    """Whether a job in `state` has ended: its record is then its row's log tail."""
    return state in _ENDED
