"""Removing a finished attempt's container (and an ended job's checkpoint volume) off the handoff path.

A work horse records its job's exit with `finish`, which frees the slot and promotes the next job; the
container it watched must then go. Removing it in the horse (a container and a volume: two daemon requests)
kept the worker from taking its next job: with as many workers as slots, the job
just promoted waited for it. So the horse hands the removal to its worker's main process, through a pipe
the horse inherits, and exits; a thread of the main process removes it while the worker already takes and
launches the next job.

The thread removes a container only once the worker has handed its next job to a horse (`launched`), or
after `HOLD_MAX_SECS` when no job comes: a removal is a few milliseconds of docker-py's Python, and run
while the main process itself works between two jobs it took the GIL from it at each of its Redis round
trips, lengthening the path from a container's exit to the next create (bench/handoff_trace.py measures it).

Only what `finish` recorded is handed over, so a container is never removed before its exit is in Redis
(the supervisor judges an exited container whose exit was not recorded: docs/architecture.md, "Workers").
A removal that fails, or that dies with the worker before it ran, leaves an exited container of an ended
attempt: the supervisor removes those, then the checkpoint volumes they held (supervisor/volumes.py).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger("jobpool.worker")

#: How long a stopping worker waits for the removals handed to it.
STOP_WAIT_SECS = 10.0
#: How long a removal waits for the worker's next launch before it goes ahead (the worker is idle).
HOLD_MAX_SECS = 1.0
_STOP = b"stop\n"


class Cleaner:
    """The main process's side: a pipe (made before any horse is forked, so each inherits its write end) and
    a thread that calls `remove(container_id, pool, job_id)` for each line a horse writes; `job_id` is ''
    when the job has not ended (its checkpoint volume stays for the next attempt) or keeps no checkpoint."""

    def __init__(self, remove: Callable[[str, str, str], None]) -> None:
        self._remove = remove
        self._read, self._write = os.pipe()
        # A horse never blocks on a full pipe (a main process stuck on an unanswering daemon): `hand_off`
        # then says no and the horse removes its container itself.
        os.set_blocking(self._write, False)
        #: Counts the worker's launches (`launched`); a removal waits for the next one.
        self._launches = 0
        self._stopping = False
        self._turn = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="jobpool-cleanup", daemon=True)
        self._thread.start()

    def hand_off(self, container_id: str, pool: str, job_id: str = "") -> bool:
        """Called in the horse once `finish` recorded the exit: True when the main process will remove it.
        One write of a short line, under PIPE_BUF: atomic, so lines of horses never interleave."""
        line = f"{container_id}\t{pool}\t{job_id}\n".encode()
        try:
            return os.write(self._write, line) == len(line)
        except OSError:  # full (EAGAIN), or the main process is gone
            return False

    def launched(self) -> None:
        """Called by the worker once it handed a job to a horse: the removals waiting may go now (the main
        process waits for its horse, idle)."""
        with self._turn:
            self._launches += 1
            self._turn.notify_all()

    def _run(self) -> None:
        buf = b""
        with os.fdopen(self._read, "rb", buffering=0) as pipe:
            while True:
                chunk = pipe.read(4096)
                if not chunk:
                    return
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line + b"\n" == _STOP:
                        return
                    self._one(line)

    def _one(self, line: bytes) -> None:
        with self._turn:  # read as the horse wrote it, so before the worker's next launch
            seen = self._launches
            self._turn.wait_for(lambda: self._launches != seen or self._stopping, HOLD_MAX_SECS)
        try:
            container_id, pool, job_id = line.decode().split("\t")
            self._remove(container_id, pool, job_id)
        except Exception:  # the thread must outlive any one removal; the supervisor retries
            log.exception("removing a finished container failed (left to the supervisor)")

    def stop(self, timeout: float = STOP_WAIT_SECS) -> None:
        """Finish the removals handed over so far (at most `timeout` seconds), then end the thread."""
        with self._turn:
            self._stopping = True
            self._turn.notify_all()
        try:
            os.write(self._write, _STOP)
        except OSError:  # full: its thread is stuck on an unanswering daemon
            log.warning("removals of finished containers still pending at exit; the supervisor removes them")
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("removals of finished containers still pending at exit; the supervisor removes them")
