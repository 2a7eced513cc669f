"""An attempt's live log: a thread of its watcher that sends what the job prints to Redis as it runs.

Every `LIVE_LOG_POLL_SECS` while someone follows the log (the heartbeat says so: scripts/heartbeat.lua),
else every `LIVE_LOG_IDLE_SECS`, it reads what the job printed since its last read (`Handle.read_output`:
a bounded read whatever the job prints) and appends it, fenced on (boot, attempt), to the job's live log
(scripts/log_append.lua); jobpool/livelogs.py reads it from any host. A job that prints more than a read
keeps costs its worker and Redis no more: what was skipped is said in the log, in a line of jobpool's own.
Its own thread, so that a daemon slow to answer a log read never delays the watcher's heartbeat.

Resuming: each append records where the attempt's output was read up to, so a worker that adopts the
attempt goes on from there, and an append sent again after a lost reply adds nothing. The watcher's last
append, made before it records the attempt's end, carries what is left and starts the log's linger.
"""

from __future__ import annotations

import codecs
import dataclasses
import logging
import threading
import time

from ..contract import (
    LIVE_LOG_IDLE_SECS,
    LIVE_LOG_LINGER_SECS,
    LIVE_LOG_POLL_SECS,
    LIVE_LOG_RATE_BYTES,
    LIVE_LOG_READ_LINES,
)
from ..errors import JobpoolError, NotFound, NotOwner, RedisUnavailable
from ..livelogs import pieces
from .attempt import Attempt
from .executors import Handle
from .executors.base import Output
from .outage import Backoff

log = logging.getLogger("jobpool.worker")

#: How long one read of the job's output may take, and how long the watcher waits for the thread to end.
READ_TIMEOUT_SECS = 5.0


def dropped_line(got: Output, secs: int) -> str:
    """jobpool's line in the log for what a read of `secs` seconds of output skipped to stay within its
    bounds."""
    said = []
    if got.dropped:
        said.append(f"{got.dropped:,} bytes skipped (more than {LIVE_LOG_RATE_BYTES:,} a second)")
    if got.more:
        said.append(f"lines skipped (more than {LIVE_LOG_READ_LINES * secs:,} in {secs} s)")
    return f"[jobpool: live log: {'; '.join(said)}; the job's output itself is whole]\n" if said else ""


class LiveLog:
    """The live log of one attempt, sent by its own thread until `close`."""

    def __init__(self, attempt: Attempt, handle: Handle) -> None:
        self.attempt, self.handle = attempt, handle
        #: Someone follows the log (the watcher sets it from each heartbeat): sent every second, not every
        #: LIVE_LOG_IDLE_SECS.
        self.followed = False
        self._last = time.monotonic()
        self.position: str | None = None  # read from the log itself first: an adopted attempt goes on
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending: tuple[str, str] | None = None
        self._reads = 0
        self._stop = threading.Event()
        self._owned = True
        self._thread = threading.Thread(target=self._run, name=f"livelog-{attempt.job_id}", daemon=True)

    def start(self) -> LiveLog:
        self._thread.start()
        return self

    def close(self, last: bool) -> None:
        """Stop sending. `last`: the attempt has ended; what is left is sent, and the log starts to linger.
        An attempt that ended before the first read sends nothing: a reader of it reads the row's log tail
        (jobpool/livelogs.py), and a short job's end costs no read or write more."""
        self._stop.set()
        self._thread.join(READ_TIMEOUT_SECS + 1)
        if last and self._reads and self._owned and not self._thread.is_alive():
            backoff = Backoff()
            try:
                # Sent until Redis answers, as the exit it comes before is (jobpool/workers/watch.py
                # `_finish`): lost, a follower would miss the attempt's last lines.
                while not self._send(LIVE_LOG_LINGER_SECS * 1000):
                    backoff.sleep()
            except Exception:  # the watcher records the exit next: a live log must never keep it from that
                log.exception("job %s: the live log's last append failed", self.attempt.job_id)

    def _run(self) -> None:
        while self._owned and not self._stop.wait(LIVE_LOG_POLL_SECS):
            if self.followed or time.monotonic() - self._last >= LIVE_LOG_IDLE_SECS:
                self._reads += 1
                self._send(0)

    def _send(self, linger_ms: int) -> bool:
        """Read what the job printed since the last read and append it; False when Redis did not answer
        (what was read is then pending, sent again first next time)."""
        # A read covers the seconds since the last one, within the same bounds a second.
        secs = max(1, min(round(time.monotonic() - self._last), int(LIVE_LOG_IDLE_SECS)))
        self._last = time.monotonic()
        try:
            if self._pending is not None:  # its reply was lost: sent again as it was, adding nothing twice
                self.attempt.append_log(*self._pending, linger_ms)
                self._pending = None
            if self.position is None:
                newest = pieces(self.attempt.store.log_end(self.attempt.job_id)[1])
                mine = [p for p in newest if p.attempt == str(self.attempt.attempt)]
                self.position = mine[0].position if mine else ""
            got = self.handle.read_output(self.position, LIVE_LOG_RATE_BYTES * secs,
                                          LIVE_LOG_READ_LINES * secs, READ_TIMEOUT_SECS)
            if got is None:
                return True
            text = self._decoder.decode(got.text, final=linger_ms > 0)
            over = len(text.encode()) - LIVE_LOG_RATE_BYTES * secs
            if over > 0:  # undecodable bytes became U+FFFD, three bytes each: kept within the budget too
                text = text.encode()[over:].decode(errors="ignore")
                got = dataclasses.replace(got, dropped=got.dropped + over)
            text = dropped_line(got, secs) + text
            self.position = got.position
            if text or linger_ms:
                self._pending = (text, got.position)
                self.attempt.append_log(text, got.position, linger_ms)
                self._pending = None
        except (NotOwner, NotFound):
            self._owned = False  # no longer ours: the watcher learns it from its own next write
        except RedisUnavailable:
            return False  # what was read is pending: sent again next time, before anything more is read
        except JobpoolError as exc:
            self._pending = None
            log.warning("job %s: live log not sent: %s", self.attempt.job_id, exc)
        return True
