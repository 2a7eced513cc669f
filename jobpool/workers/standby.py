"""`Standby`: one horse forked ahead of its job, seen from the worker (jobpool/workers/horses.py says why and
how a worker uses it): forked, handed its job on a pipe (and taken only on the standby's word), or closed.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import select
import signal
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("jobpool.worker")

#: How long `close` waits for a standby to exit on its EOF before it kills it.
CLOSE_WAIT_SECS = 2.0
#: How long `hand` waits for the standby to say it took its job (`TOOK`). It says so as soon as it has read
#: the message, microseconds of its own CPU; one that has not within this is stopped (SIGSTOP, a tracer) or
#: starved, and is replaced: a one-worker pool would otherwise wait on it for ever. Too short only costs a
#: fork (the job goes to RQ's own fork instead: nothing was done with it).
HANDOFF_ACK_SECS = 2.0
#: How long `hand` waits for a standby it killed (SIGKILL) to be gone: a process in the kernel's
#: uninterruptible sleep dies only once it leaves it.
KILL_WAIT_SECS = 5.0
#: The standby's first word on its done pipe: it read its job and does something with it from now on.
TOOK = b"a"


class Standby:
    """One forked standby horse, seen from the worker: its pid, the write end of its pipe, and the read end of
    the pipe on which, as a horse, it says it is done (`done_fd`)."""

    def __init__(self, pid: int, write_fd: int, done_fd: int) -> None:
        self.pid = pid
        self._write = write_fd
        self.done_fd = done_fd

    @classmethod
    def fork(cls, become_horse: Callable[[dict[str, Any], int], None],
             warm: Callable[[], None]) -> Standby | None:
        """Fork a standby. In the child: its own process group (as RQ's horses), SIGINT ignored and SIGTERM
        deadly until it takes a job, `warm()` (connections a horse would open first), then wait; on a message,
        `become_horse(message, done_write_fd)` (which never returns: RQ's horse code exits the process). None
        when the fork failed (the worker then forks per job, as RQ does)."""
        read_fd, write_fd = os.pipe()
        done_read, done_write = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            log.warning("could not fork a standby horse (%s); forking per job", exc)
            for fd in (read_fd, write_fd, done_read, done_write):
                os.close(fd)
            return None
        if pid == 0:  # the standby
            code = 1
            try:
                os.close(write_fd)
                os.close(done_read)
                os.setpgrp()
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                with contextlib.suppress(Exception):  # a cold connection is only slower
                    warm()
                # What the horse inherits is left out of its garbage collection: collecting writes the header
                # of every object it looks at, and each page written is copied from the worker's (a
                # copy-on-write fault). The horse lives for one job; its own objects are collected as ever.
                # That CPU is taken from cores the daemon needs.
                gc.freeze()
                message = _read_message(read_fd)
                if message is None:  # the worker closed the pipe: stopped, or gone
                    code = 0
                else:
                    # Said before anything is done with the job (fetched, claimed): a standby that has not
                    # said so when the worker kills it did nothing with it (see `hand`). A worker gone
                    # (EPIPE) raises here: the job is not taken.
                    os.write(done_write, TOOK)
                    become_horse(message, done_write)
            except BaseException:  # said here, or the worker would only read an exit code
                log.exception("standby horse %s: could not take its job (the supervisor dispatches it again)",
                              os.getpid())
            finally:
                os._exit(code)
        os.close(read_fd)
        os.close(done_write)
        return cls(pid, write_fd, done_read)

    def hand(self, message: dict[str, Any], ack_secs: float = HANDOFF_ACK_SECS) -> bool:
        """Give the standby its job: True once it says it took it (`TOOK`), within `ack_secs`; the worker
        then waits for it as its horse. False when it is gone, or did not say so in time (stopped, starved:
        it is killed): then it has done nothing with the job (it says so first), it is reaped, and the worker
        hands the job to another horse at once, the same delivery (nothing was claimed).

        Every wait here is bounded: the write never blocks (one message under PIPE_BUF in an empty pipe),
        the answer is waited for `ack_secs`, the killed standby's end `KILL_WAIT_SECS`. One that said it took
        the job just as it was killed, or that the kill has not ended by then, counts as taken (True): the
        worker waits for its exit and reads it as RQ reads a horse that died, and its row is the supervisor's
        (an unclaimed dispatch is dispatched again, a claim with nothing launched judged once its lease
        lapses: docs/architecture.md, "Evidence and verdicts")."""
        data = json.dumps(message).encode() + b"\n"
        try:
            written = os.write(self._write, data)
        except OSError:  # EPIPE: it died
            written = -1
        os.close(self._write)
        self._write = -1
        said = self._answer(ack_secs) if written == len(data) else b""
        if said == TOOK:
            return True
        with contextlib.suppress(ProcessLookupError):  # our own child, not reaped yet: never another process
            os.kill(self.pid, signal.SIGKILL)
        if said is None:
            log.warning("standby horse %s did not take its job within %gs (stopped?); killed, the job goes "
                        "to a fresh horse", self.pid, ack_secs)
            # It held the pipe's only write end: its exit reads as the pipe's end, after any word it wrote
            # just before the kill.
            said = self._answer(KILL_WAIT_SECS)
        if said != b"":
            log.warning("standby horse %s %s; waiting for its exit as for a horse that died", self.pid,
                        "was not gone yet" if said is None else "took its job as it was killed")
            return True
        reap(self.pid)
        os.close(self.done_fd)
        return False

    def _answer(self, timeout: float) -> bytes | None:
        """The standby's next byte on its done pipe (b"" at its end), or None when none came in `timeout`
        seconds. A signal's handler may run meanwhile: Python retries the poll with the time left."""
        poller = select.poll()
        poller.register(self.done_fd, select.POLLIN)
        if not poller.poll(max(0, int(timeout * 1000))):
            return None
        return os.read(self.done_fd, 1)

    def close(self) -> None:
        """The worker stops: the standby reads EOF and exits; waited for, killed past `CLOSE_WAIT_SECS`."""
        if self._write >= 0:
            os.close(self._write)
            self._write = -1
            os.close(self.done_fd)
        deadline = time.monotonic() + CLOSE_WAIT_SECS
        while not reap(self.pid, block=False):
            if time.monotonic() >= deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                reap(self.pid)
                return
            time.sleep(0.01)


def reap(pid: int, block: bool = True) -> bool:
    """Reap the child `pid` (waiting for it when `block`); True once it has exited and is reaped."""
    try:
        return os.waitpid(pid, 0 if block else os.WNOHANG)[0] == pid
    except ChildProcessError:  # reaped already
        return True


def _read_message(fd: int) -> dict[str, Any] | None:
    """The one message of a standby's life, or None at EOF. It is under PIPE_BUF, written with one write, so a
    read returns it whole; a read interrupted by a signal is retried by Python."""
    data = b""
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while not data.endswith(b"\n"):
            chunk = pipe.read(4096)
            if not chunk:
                return None
            data += chunk
    message = json.loads(data)
    return message if isinstance(message, dict) else None
