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

**After the launch.** Forking the next standby takes the worker several milliseconds of CPU (copying its page
tables); on two cores shared with the daemon, a fork while the horse claims and creates its container slows
that down. So the horse says when its job runs (`Runtime.job_launched`, b"s" on the pipe on which it says it
is done), and the worker forks then (`horse_launched`). A horse forked by RQ says nothing: the worker forks
the next standby at once.

**One round trip to prepare.** RQ's worker writes the job's execution record and its busy state, then its
horse writes what it writes first (`prepare_job_execution`: the worker's current job, the job's started
state): two round trips in a row on the path to the launch. For a standby, the worker writes both in one
(`HorseWorker.prepare_execution`); the message says so, and the standby's horse skips its own. Should the
hand-off fail, RQ's fork writes its part again (the same values).

**Done before RQ's record.** A horse learns from the finish that its job ended (`Runtime.job_ended`,
called by workers/watch.py once the end is recorded and the container handed to the worker's remover:
`HorseWorker.job_ended`). Then RQ's end-of-job writes that the record's deletion undoes at once are skipped
(the job hash's last heartbeat; the success callback's read of the row: jobpool/rqjob.py), and a standby
that took the job says it is done there, not once RQ's record is deleted too: the deletion runs while the
worker already takes its next job. Only for a job that ended: its RQ records are its own and it is never
delivered again, so nothing the worker writes for its next job meets them, except RQ's "current job" field
of the worker's hash, which this horse then leaves alone (the worker clears it as it goes idle:
jobpool/workers/rqworker.py). A horse that fails after saying so leaves RQ's record of a job that ended;
RQ's registry maintenance expires it.

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
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

from rq import Worker
from rq.executions import Execution
from rq.utils import now
from rq.worker import WorkerStatus

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
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGALRM])  # held by the worker's fork
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



@contextlib.contextmanager
def _alarm_held() -> Iterator[None]:
    """SIGALRM held (blocked) in this thread for the block, and delivered after it if it came meanwhile."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


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
        #: The horse's end of that pipe (in a horse), and whether it has said so (`job_ended`).
        self._done_write = -1
        self._said_done = False
        #: In a horse: its job ended, and the finish that said so is recorded (`job_ended`).
        self._ended = False
        #: In a standby's horse: the worker wrote what RQ's horse writes first (`prepare_execution`).
        self._prepared = False
        #: The thread reaping the last horse that said it was done (joined as the worker stops).
        self._reaper: threading.Thread | None = None

    def standby_wanted(self) -> bool:
        """Whether to fork a standby now: not once the worker is stopping."""
        return not self._stop_requested

    def warm_horse(self) -> None:
        """In a standby: open the connections a horse opens first (the fork's copies are the worker's)."""
        self.connection.ping()

    def have_standby(self) -> None:
        """Fork a standby unless there is one: once a job runs (`horse_launched`), and before a dequeue (the
        first job, or after one died). RQ's monitor of a running horse times its waits with SIGALRM, whose
        handler raises: held off during the fork, so no standby is forked without being kept."""
        if self._standby is None and self.standby_wanted():
            with _alarm_held():
                self._standby = Standby.fork(self._become_horse, self.warm_horse)

    def horse_launched(self) -> None:
        """The horse's job runs (or a horse was forked by RQ): the next standby is forked now."""
        self.have_standby()

    def close_standby(self) -> None:
        """The worker stops: its standby exits, and the last horse, which may still be writing RQ's record
        after saying it was done, is waited for (not left a zombie, nor to outlive its worker unseen)."""
        standby, self._standby = self._standby, None
        if standby is not None:
            standby.close()
        if self._reaper is not None:
            self._reaper.join(CLOSE_WAIT_SECS)

    def prepare_execution(self, job: Any) -> Execution:
        """RQ's preparation (the job's execution record, the worker busy), and, when a standby is to take the
        job, what RQ's horse writes first (see `prepare_job_execution`), in one round trip."""
        if self._standby is None:
            return super().prepare_execution(job)
        with self.connection.pipeline() as pipe:
            ttl = self.get_heartbeat_ttl(job)
            self.execution = Execution.create(job, ttl, pipeline=pipe, worker_name=self.name)
            self.set_state(WorkerStatus.BUSY, pipeline=pipe)
            # RQ's `prepare_job_execution`, as its horse would send it.
            self.set_current_job_id(job.id, pipeline=pipe)
            self.set_current_job_working_time(0, pipeline=pipe)
            self.heartbeat(ttl, pipeline=pipe)
            job.heartbeat(now(), ttl, pipeline=pipe)
            job.prepare_for_execution(self.name, pipeline=pipe)
            if len(self.queues) == 1:
                pipe.lrem(self.queue_class(job.origin, connection=self.connection).intermediate_queue_key, 1,
                          job.id)
            pipe.execute()
        return self.execution

    def prepare_job_execution(self, job: Any, remove_from_intermediate_queue: bool = False) -> None:
        """RQ's, unless the worker wrote it already (a standby's horse: `prepare_execution`)."""
        if not self._prepared:
            super().prepare_job_execution(job, remove_from_intermediate_queue)
            return
        self.procline(f"Processing {job.func_name} from {job.origin} since {time.time()}")

    def fork_work_horse(self, job: Any, queue: Any) -> None:
        """Hand the job to the standby, or fork a horse as RQ does when there is none; the standby for the
        next job is forked once this one runs (`horse_launched`)."""
        standby, self._standby = self._standby, None
        message = None if self.execution is None else {
            "job": job.id, "queue": queue.name, "queues": self.queue_names(), "execution": self.execution.id,
            "created_at": self.execution.created_at.timestamp(), "prepared": True}
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
            self.horse_launched()

    def wait_for_horse(self) -> tuple[int | None, int | None, Any]:
        """The horse's end: as RQ waits for it, except that a standby that took the job says when it is done,
        and its exit (the kernel freeing what the horse touched: 3-7 ms, bench/handoff_trace.py) is not waited
        for: a thread reaps it. A horse that ends without saying so (killed, or RQ's horse code failed) closes
        the pipe: then its exit is waited for, and read, as RQ does."""
        while self._horse_done >= 0:
            # An exception out of the read (RQ's death penalty, every second) leaves it for the next call.
            said = os.read(self._horse_done, 1)
            if said == b"s":
                with _alarm_held():  # RQ's timed wait must not cut it short: see `have_standby`
                    self.horse_launched()
                continue
            os.close(self._horse_done)
            self._horse_done = -1
            if said == b"0":
                pid = self.horse_pid
                self._reaper = threading.Thread(target=_reap, args=(pid,), name=f"jobpool-reap-{pid}",
                                                daemon=True)
                self._reaper.start()
                return pid, 0, None
        return super().wait_for_horse()

    def job_ended(self) -> None:
        """In a horse whose job's end is recorded (see the module's docstring): RQ's record is deleted next,
        and a standby that took the job is done with its worker."""
        self._ended = True
        self._say_done()

    def job_launched(self) -> None:
        """In a standby that took its job, once the job runs: the worker's work that waited may go."""
        if self._done_write >= 0 and not self._said_done:
            with contextlib.suppress(OSError):
                os.write(self._done_write, b"s")

    def _say_done(self) -> None:
        """In a standby that took its job: tell the worker this horse needs it no more (once; nothing in any
        other process)."""
        if self._done_write >= 0 and not self._said_done:
            self._said_done = True
            with contextlib.suppress(OSError):
                os.write(self._done_write, b"0")

    def perform_job(self, job: Any, queue: Any) -> bool:
        """RQ's, then (in a standby that took the job, unless it said so already) the word that the horse
        is done: RQ's horse code exits 0 when this returns, 1 when it raises (nothing is said then, and the
        worker reads the exit)."""
        result = super().perform_job(job, queue)
        self._say_done()
        return result

    def handle_execution_ended(self, job: Any, queue: Any, heartbeat_ttl: int) -> None:
        """RQ's, except for a job that ended: its result TTL is 0 (what rqjob.after_delivery would read the
        row to find), and RQ's last heartbeat on the job's hash, deleted next, is not sent."""
        if not self._ended:
            super().handle_execution_ended(job, queue, heartbeat_ttl)
            return
        job.ended_at = now()
        job.result_ttl = 0

    def _become_horse(self, message: dict[str, Any], done_write: int) -> None:
        """In a standby handed a job: what RQ's fork gives a horse (the job, its queue, the queues the worker
        reads now, RQ's execution record), rebuilt from the message, then RQ's own horse code."""
        self._done_write = done_write
        self._prepared = bool(message.get("prepared"))
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
            if self._said_done:
                # The worker may have deregistered meanwhile (stopped): the counts above would make its hash
                # again, so it is given the TTL a live worker's hash has. Its "current job" may be the next
                # job's already: left to the worker (RQ's cleanup would delete it).
                pipe.expire(self.key, self.worker_ttl + 60)
                if self.execution is not None:
                    self.execution.delete(job=job, pipeline=pipe)
                    self.execution = None
            else:
                self.cleanup_execution(job, pipeline=pipe)
            for execution in executions:
                execution.delete(job=job, pipeline=pipe)
            pipe.delete(job.execution_registry.key)
            pipe.delete(job.key, job.dependents_key, job.dependencies_key)
            pipe.execute()
