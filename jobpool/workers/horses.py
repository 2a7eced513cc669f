"""How a worker's work horses start and end: forked before their job arrives, and RQ's record of an ended
delivery deleted in one step. Both sit between a slot's release and the next launch.

**The standby horse.**

RQ forks a horse per job after the dequeue. On a loaded two-core host the fork, the child's first scheduling
and its first Redis connection took 10-40 ms of the path from one container's exit to the next one's create
(bench/handoff_trace.py), and with as many workers as slots every job waits that long. So the worker keeps
one horse forked ahead, a *standby*: a child that has connected to Redis and waits on a pipe. When a job is
dequeued, the worker writes the job's id, its queue and RQ's execution record to the pipe, and the standby
becomes the horse: it fetches the job and runs RQ's own horse code (`main_work_horse`). The worker then forks
the next standby while this job runs.

What the standby knows is what the worker knew when it forked: boot, settings, the prepared executor
(workers/runtime.py). Nothing in a horse depends on the worker's state after that, except what the pipe
carries, and the queues the worker reads (added at run time: jobpool/workers/rqworker.py), which the message
names. A standby is never handed a job once the worker stops.

Failure modes, each ending in RQ's ordinary fork:
- the standby died (killed, or out of memory): the write fails (EPIPE), the worker reaps it and forks;
- the worker dies or stops: the pipe's only write end closes, the standby reads EOF and exits
  (`Standby.close` also waits for it).
A standby that takes the job and then fails before it runs (its Redis away when it fetches the job) exits
non-zero: the worker reads that as RQ reads any horse that died, and the job's row is the supervisor's
(an unclaimed dispatch is dispatched again: docs/architecture.md, "Workers").

**RQ's record of an ended delivery.** Once the job function returned, RQ's horse records the delivery. For a
job that ended (`rqjob.after_delivery` set its result TTL to 0) RQ deletes its records, but first asks Redis
up to five times, one round trip each, which registry the job is in, and watches its dependents key;
`HorseWorker.handle_job_success` deletes the same records in one pipeline.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from rq import Worker
from rq.executions import Execution

log = logging.getLogger("jobpool.worker")

#: How long `close` waits for a standby to exit on its EOF before it kills it.
CLOSE_WAIT_SECS = 2.0


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
                # About 6 ms of CPU per job (bench/throughput.py, paired runs), on cores the daemon needs.
                gc.freeze()
                message = _read_message(read_fd)
                if message is None:  # the worker closed the pipe: stopped, or gone
                    code = 0
                else:
                    become_horse(message, done_write)
            except BaseException:  # noqa: BLE001 - said here, or the worker would only read an exit code
                log.exception("standby horse %s: could not take its job (the supervisor dispatches it again)",
                              os.getpid())
            finally:
                os._exit(code)
        os.close(read_fd)
        os.close(done_write)
        return cls(pid, write_fd, done_read)

    def hand(self, message: dict[str, Any]) -> bool:
        """Give the standby its job; False (and the standby reaped) when it is gone."""
        data = json.dumps(message).encode() + b"\n"
        try:
            written = os.write(self._write, data)
        except OSError:  # EPIPE: it died
            written = -1
        os.close(self._write)
        self._write = -1
        if written == len(data):
            return True
        _reap(self.pid, block=False)
        os.close(self.done_fd)
        return False

    def close(self) -> None:
        """The worker stops: the standby reads EOF and exits; waited for, killed past `CLOSE_WAIT_SECS`."""
        if self._write >= 0:
            os.close(self._write)
            self._write = -1
            os.close(self.done_fd)
        deadline = time.monotonic() + CLOSE_WAIT_SECS
        while not _reap(self.pid, block=False):
            if time.monotonic() >= deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                _reap(self.pid)
                return
            time.sleep(0.01)



def _reap(pid: int, block: bool = True) -> bool:
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


class HorseWorker(Worker):
    """RQ's forking worker, with a standby horse (`Standby`) and RQ's record of an ended delivery deleted in
    one pipeline. jobpool/workers/rqworker.py builds on it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The horse forked ahead for the next job.
        self._standby: Standby | None = None
        #: The worker's end of the pipe on which its current horse, a standby that took the job, says it is
        #: done (-1: a horse of RQ's own fork, waited for by its exit alone).
        self._horse_done = -1
        #: The horse's end of that pipe (in a horse).
        self._done_write = -1

    def standby_wanted(self) -> bool:
        """Whether to fork a standby now: not once the worker is stopping."""
        return not self._stop_requested

    def warm_horse(self) -> None:
        """In a standby: open the connections a horse opens first (the fork's copies are the worker's)."""
        self.connection.ping()

    def have_standby(self) -> None:
        """Fork a standby unless there is one (the first job, or after one died): called before a dequeue."""
        if self._standby is None and self.standby_wanted():
            self._standby = Standby.fork(self._become_horse, self.warm_horse)

    def close_standby(self) -> None:
        standby, self._standby = self._standby, None
        if standby is not None:
            standby.close()

    def fork_work_horse(self, job: Any, queue: Any) -> None:
        """Hand the job to the standby, or fork a horse as RQ does when there is none; then fork the standby
        for the next job while this one runs."""
        standby, self._standby = self._standby, None
        message = None if self.execution is None else {
            "job": job.id, "queue": queue.name, "queues": self.queue_names(), "execution": self.execution.id,
            "created_at": self.execution.created_at.timestamp()}
        if standby is not None and message is not None and standby.hand(message):
            os.environ["RQ_WORKER_ID"] = self.name
            os.environ["RQ_JOB_ID"] = job.id
            self._horse_pid = standby.pid
            self._horse_done = standby.done_fd
            self.procline(f"Handed to standby {standby.pid} at {time.time()}")
        else:
            if standby is not None:
                standby.close()
            super().fork_work_horse(job, queue)
        self.have_standby()

    def wait_for_horse(self) -> tuple[int | None, int | None, Any]:
        """The horse's end: as RQ waits for it, except that a standby that took the job says when it is done,
        and its exit (the kernel freeing what the horse touched: 3-7 ms, bench/handoff_trace.py) is not waited
        for: a thread reaps it. A horse that ends without saying so (killed, or RQ's horse code failed) closes
        the pipe: then its exit is waited for, and read, as RQ does."""
        if self._horse_done >= 0:
            # An exception out of the read (RQ's death penalty, every second) leaves it for the next call.
            said = os.read(self._horse_done, 1)
            os.close(self._horse_done)
            self._horse_done = -1
            if said == b"0":
                pid = self.horse_pid
                threading.Thread(target=_reap, args=(pid,), name=f"jobpool-reap-{pid}", daemon=True).start()
                return pid, 0, None
        return super().wait_for_horse()

    def perform_job(self, job: Any, queue: Any) -> bool:
        """RQ's, then (in a standby that took the job) the word that the horse is done: RQ's horse code exits
        0 when this returns, 1 when it raises (nothing is said then, and the worker reads the exit)."""
        result = super().perform_job(job, queue)
        if self._done_write >= 0:
            with contextlib.suppress(OSError):
                os.write(self._done_write, b"0")
        return result

    def _become_horse(self, message: dict[str, Any], done_write: int) -> None:
        """In a standby handed a job: what RQ's fork gives a horse (the job, its queue, the queues the worker
        reads now, RQ's execution record), rebuilt from the message, then RQ's own horse code."""
        self._done_write = done_write
        os.environ["RQ_WORKER_ID"] = self.name
        os.environ["RQ_JOB_ID"] = message["job"]
        self.setup_work_horse_signals()
        queues = [self.queue_class(name, connection=self.connection, serializer=self.serializer)
                  for name in message["queues"]]
        self.queues[:] = queues
        self._ordered_queues = list(queues)
        job = self.job_class.fetch(message["job"], connection=self.connection, serializer=self.serializer)
        queue = self.queue_class(message["queue"], connection=self.connection, serializer=self.serializer)
        execution = Execution(message["execution"], job.id, self.connection, worker_name=self.name)
        execution.created_at = execution.last_heartbeat = datetime.fromtimestamp(message["created_at"],
                                                                                 tz=timezone.utc)
        self.execution = execution
        self.main_work_horse(job, queue)

    def handle_job_success(self, job: Any, queue: Any, started_job_registry: Any) -> None:
        """RQ's record of a delivery whose job ended, deleted in one pipeline (see the module's docstring):
        its executions (and their entries in the started registry), the current execution, the job hash.
        Any other delivery (handed back or paused: delivered again later) is recorded RQ's way."""
        if job.get_result_ttl(self.default_result_ttl) != 0:
            super().handle_job_success(job, queue, started_job_registry)
            return
        executions = job.get_executions()
        with self.connection.pipeline() as pipe:
            self.increment_successful_job_count(pipeline=pipe)
            self.increment_total_working_time(job.ended_at - job.started_at, pipe)
            for execution in executions:
                execution.delete(job=job, pipeline=pipe)
            pipe.delete(job.execution_registry.key)
            self.cleanup_execution(job, pipeline=pipe)
            pipe.delete(job.key, job.dependents_key, job.dependencies_key)
            pipe.execute()
