"""How a worker's work horses start and end: forked before their job arrives, and RQ's record of an ended
delivery deleted in one step. Both sit between a slot's release and the next launch.

**The standby horse.**

RQ forks a horse per job after the dequeue. On a loaded two-core host the fork, the child's first scheduling
and its first Redis connection sat on the path from one container's exit to the next one's create
(bench/handoff_trace.py measures it), and with as many workers as slots every job waits that long. So the
worker keeps one horse forked ahead, a *standby*: a child that has connected to Redis and waits on a pipe.
When a job is dequeued, the worker writes the job's id, its queue and RQ's execution record to the pipe, and
the standby becomes the horse: it fetches the job and runs RQ's own horse code (`main_work_horse`). The worker
then forks the next standby once this job runs ("After the launch").

What the standby knows is what the worker knew when it forked: boot, settings, the prepared executor
(workers/runtime.py). Nothing in a horse depends on the worker's state after that, except what the pipe
carries, and the queues the worker reads (added at run time: jobpool/workers/rqworker.py), which the message
names. A standby is never handed a job once the worker stops.

The hand-off is taken only on the standby's word: as soon as it has read its message, before it does
anything with the job, it writes b"a" (*took*) on the pipe on which it later says it is done, and the worker
waits for that word at most `standby.HANDOFF_ACK_SECS` (`Standby.hand`). Failure modes, each ending in RQ's
ordinary fork of the same delivery (nothing was claimed: the claim is the horse's):
- the standby died (killed, or out of memory): the write fails (EPIPE), or its pipe ends; the worker reaps
  it and forks;
- the standby says nothing in time (stopped by SIGSTOP or a tracer, or starved): the worker kills it
  (SIGKILL: its own child, never reaped yet, so never another process), reads its pipe's end, reaps it and
  forks. Without the word, a stopped standby took the job into its pipe and the worker waited on it for
  ever: a one-worker pool wedged;
- the worker dies or stops: the pipe's only write end closes, the standby reads EOF and exits
  (`Standby.close` also waits for it).
A standby that took the job (said so, perhaps just as it was killed) and then fails before it runs (its
Redis away when it fetches the job, killed) exits non-zero: the worker reads that as RQ reads any horse that
died, and the job's row is the supervisor's (an unclaimed dispatch is dispatched again: docs/architecture.md,
"Workers").

**A stopped horse.** RQ's monitor waits for the horse a second at a time (a job runs for hours), so the
worker beats on; but a horse that is stopped renews its job's lease no more, and its worker would take no
other work for as long as the stop lasts (not even the supervisor's request to adopt that job's container).
Stopped for `horse_stop_limit_secs` (the lease: jobpool/workers/rqworker.py), it is killed
(`check_stopped_horse`), and read from its exit as any horse that died. Meanwhile `stuck` says so, for the
worker's boot record (jobpool/workers/boot.py) and `jobpool status`.

**After the launch.** Forking the next standby takes the worker several milliseconds of CPU (copying its page
tables); on two cores shared with the daemon, a fork while the horse claims and creates its container slows
that down. So the horse says when its job runs (`Runtime.job_launched`, b"s" on the pipe on which it says it
is done), and the worker forks then (`wait_for_horse`, `maintain_heartbeats`). A horse forked by RQ says
nothing: the worker forks the next standby at once.

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
jobpool/workers/rqbookkeeping.py). A horse whose record of the delivery fails after saying so deletes it as a
success would (`handle_job_failure`: RQ's failure record would keep it for ever); one killed then leaves it
for the pruning of the job's row (scripts/prune.lua).

**RQ's record of an ended delivery.** Once the job function returned, RQ's horse records the delivery. For a
job that ended (`rqjob.after_delivery` set its result TTL to 0) RQ deletes its records, but first asks Redis
up to five times, one round trip each, which registry the job is in, and watches its dependents key;
`HorseWorker.handle_job_success` deletes the same records in one pipeline.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from datetime import datetime, timezone
from typing import Any

from rq import Worker
from rq.exceptions import StopRequested
from rq.executions import Execution
from rq.timeouts import HorseMonitorTimeoutException
from rq.utils import now
from rq.worker import WorkerStatus

from .standby import CLOSE_WAIT_SECS, HANDOFF_ACK_SECS, TOOK, Standby, reap

log = logging.getLogger("jobpool.worker")

#: How often, while a horse runs, the worker renews RQ's records of it: the worker's hash, the delivery's
#: execution and started-registry entry, the job hash's heartbeat, the job's working time. RQ's monitor wakes
#: every `job_monitoring_interval`, a second here (the drain bound and a stopped horse are looked at that
#: often: jobpool/workers/rqworker.py), and would renew them at each wake, a Redis transaction per running
#: job per second: most of a long job's Redis work. Each renewal lasts `job_monitoring_interval` + 60 s (RQ's
#: TTLs), so renewed this often, each record is renewed about three times within one lifetime.
RQ_RENEW_SECS = 20.0


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
        #: The thread reaping the last horse that said it was done (joined as the worker stops), and its pid.
        self._reaper: threading.Thread | None = None
        self._reaped_pid = 0
        #: What `wait_for_horse` read and has yet to return (see there), and whether RQ's monitor is waiting
        #: and a standby is due (the job runs).
        self._clean_end: tuple[int, int, None] | None = None
        self._monitoring = False
        self._launched_due = False
        #: When RQ's records of the running delivery were last written (monotonic): `maintain_heartbeats`.
        self._rq_renewed = float("-inf")
        #: The standby being handed a job, and since when (monotonic): read by `stuck`, in another thread.
        self._handing: tuple[int, float] | None = None
        #: The running horse seen stopped, and since when (monotonic): `check_stopped_horse`.
        self._horse_stopped: tuple[int, float] | None = None

    #: How long the worker lets its running horse stay stopped (SIGSTOP) before it kills it;
    #: None: never (RQ's own behaviour). jobpool/workers/rqworker.py sets the job's lease.
    horse_stop_limit_secs: float | None = None

    def standby_wanted(self) -> bool:
        """Whether to fork a standby now: not once the worker is stopping."""
        return not self._stop_requested

    def warm_horse(self) -> None:
        """In a standby: open the connections a horse opens first (the fork's copies are the worker's)."""
        self.connection.ping()

    def have_standby(self) -> None:
        """Fork a standby unless there is one: once a job runs, and before a dequeue (the first job, or after
        one died). Never within RQ's timed wait for its horse, whose SIGALRM handler raises wherever the main
        thread is: after the fork, a standby no one kept (see `wait_for_horse`)."""
        if self._standby is None and self.standby_wanted():
            self._standby = Standby.fork(self._become_horse, self.warm_horse)
            # A stop signal that came during the fork ran RQ's handler inside the fork's own callbacks (its
            # locks' release), which swallow the exception that stops an idle worker: raised again here, as
            # RQ's handler would have, or the worker would go on as if never asked to stop.
            if getattr(self, "stop_asked", False) and self.get_state() != WorkerStatus.BUSY:
                raise StopRequested()

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
        self._rq_renewed = time.monotonic()  # written fresh here (and by the horse), with RQ's TTLs
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
        self.procline(f"Processing {job.func_name} from {job.origin} since {time.time()}")  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in RQ 2.12

    def fork_work_horse(self, job: Any, queue: Any) -> None:
        """Hand the job to the standby, or fork a horse as RQ does when there is none, or when the standby
        did not take the job (gone, or no word within `HANDOFF_ACK_SECS`: killed and reaped by
        `Standby.hand`, having done nothing with it, so RQ's fork takes the same delivery at once); the
        standby for the next job is forked once this one runs (`have_standby`)."""
        standby, self._standby = self._standby, None
        message = None if self.execution is None else {
            "job": job.id, "queue": queue.name, "queues": self.queue_names(), "execution": self.execution.id,
            "created_at": self.execution.created_at.timestamp(), "prepared": True}
        if standby is not None and message is None:
            standby.close()
            standby = None
        if standby is not None and message is not None:
            self._handing = (standby.pid, time.monotonic())
            try:
                taken = standby.hand(message)
            finally:
                self._handing = None
            if taken:
                os.environ["RQ_WORKER_ID"] = self.name
                os.environ["RQ_JOB_ID"] = job.id
                self._horse_pid = standby.pid
                self._horse_done = standby.done_fd
                self.procline(f"Handed to standby {standby.pid} at {time.time()}")  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in RQ 2.12
                return
        super().fork_work_horse(job, queue)
        self.have_standby()

    def monitor_work_horse(self, job: Any, queue: Any) -> None:
        self._monitoring = True
        try:
            super().monitor_work_horse(job, queue)
        finally:
            self._monitoring = False

    def wait_for_horse(self) -> tuple[int | None, int | None, Any]:
        """The horse's end: as RQ waits for it, except that a standby that took the job says when it is done,
        and its exit (the kernel freeing what the horse touched) is not waited
        for: a thread reaps it. A horse that ends without saying so (killed, or RQ's horse code failed) closes
        the pipe: then its exit is waited for, and read, as RQ does.

        RQ's monitor calls this under a one-second SIGALRM timer whose handler raises wherever the main
        thread is, and calls it again after its periodic work; so every step here can be cut short and
        resumed: the pipe is given up before it is closed, and a clean end, once read, is kept until it is
        returned. *Launched* cuts the wait short itself (as the timer does), so the next standby is forked
        in RQ's periodic work, where no timer runs (`maintain_heartbeats`). A word lost to the timer between
        the read and its use only costs time: the standby is forked before the next dequeue, the end is read
        from the horse's exit."""
        while self._horse_done >= 0 and self._clean_end is None:
            said = os.read(self._horse_done, 1)
            if said == TOOK:  # read by `Standby.hand` already, unless it counted a killed standby as taken
                continue
            if said == b"s":
                if self._monitoring:
                    self._launched_due = True
                    raise HorseMonitorTimeoutException("the horse's job runs")
                continue
            fd, self._horse_done = self._horse_done, -1
            os.close(fd)
            if said == b"0":
                self._clean_end = (self.horse_pid, 0, None)
        if self._clean_end is not None:
            pid = self._clean_end[0]
            if self._reaped_pid != pid:
                self._reaped_pid = pid
                self._reaper = threading.Thread(target=reap, args=(pid,), name=f"jobpool-reap-{pid}",
                                                daemon=True)
                self._reaper.start()
            end, self._clean_end = self._clean_end, None
            return end
        return super().wait_for_horse()

    def maintain_heartbeats(self, job: Any) -> bool:
        """RQ's periodic work while its horse runs, called every second: the stopped-horse check each time,
        RQ's renewal of its records every `RQ_RENEW_SECS`; or, when the wait was cut short because the job
        runs, the next standby instead. Not both: RQ's renewal writes the delivery's execution record, which
        a short job's horse may be deleting at that moment (it would be made again, to expire). Whether it
        wrote to Redis (a wake that wrote nothing is no news of Redis: jobpool/workers/rqworker.py)."""
        self.check_stopped_horse()
        if self._launched_due:
            self._launched_due = False
            self.have_standby()
            return False
        if time.monotonic() - self._rq_renewed < RQ_RENEW_SECS:
            return False
        self._rq_renewed = time.monotonic()
        super().set_current_job_working_time(self.current_job_working_time)
        super().maintain_heartbeats(job)
        return True

    def set_current_job_working_time(self, current_job_working_time: float, pipeline: Any = None) -> None:
        """RQ's monitor sets the running job's working time at each wake: kept here, and written with RQ's
        renewal (`maintain_heartbeats`); its reset to 0 as the job ends is written at once."""
        if pipeline is None and current_job_working_time and self.horse_pid:
            self.current_job_working_time = current_job_working_time
            return
        super().set_current_job_working_time(current_job_working_time, pipeline)

    def check_stopped_horse(self) -> None:
        """Kill the running horse once it has been stopped (SIGSTOP, SIGTSTP: `stopped`) for
        `horse_stop_limit_secs`; called each second while the worker waits for it. Waiting on would wedge
        the worker for as long as the stop lasts: its slot's job unwatched, and no other job taken, not even
        the supervisor's request to adopt that very job's container (docs/architecture.md, "Workers"). Killed,
        it is read from its exit as any horse that died, and the worker takes work again."""
        pid, limit = self.horse_pid, self.horse_stop_limit_secs
        if not pid or limit is None or not stopped(pid):
            self._horse_stopped = None
            return
        now = time.monotonic()
        if self._horse_stopped is None or self._horse_stopped[0] != pid:  # seen stopped first now
            self._horse_stopped = (pid, now)
            log.warning("worker %s: its horse %s is stopped; killed if still stopped in %gs", self.name, pid,
                        limit)
        elif now - self._horse_stopped[1] >= limit:
            log.warning("worker %s: its horse %s stopped for %gs; killing it", self.name, pid, limit)
            self.kill_horse(signal.SIGKILL)

    def stuck(self) -> str:
        """Why the worker cannot take work while it should, or '': a standby that has not taken the job
        handed to it past the deadline, or a horse that is stopped. Called by another thread (the boot
        record's heartbeat: `jobpool status` counts such a worker as not ready, jobpool/status/health.py)."""
        handing, pid = self._handing, self.horse_pid
        if handing is not None and time.monotonic() - handing[1] > HANDOFF_ACK_SECS:
            return (f"standby horse {handing[0]} has not taken its job for "
                    f"{time.monotonic() - handing[1]:.0f}s")
        if pid and stopped(pid):
            return f"horse {pid} is stopped"
        return ""

    def job_ended(self) -> None:
        """In a horse whose job's end is recorded (see the module's docstring): RQ's record is deleted next,
        and a standby that took the job is done with its worker."""
        self._ended = True
        self._say_done()

    def job_launched(self) -> None:
        """In a standby that took its job, once the job runs: the worker may fork its next standby."""
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
        self.setup_work_horse_signals()  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in RQ 2.12
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
        self._delete_delivery(job, succeeded=True)

    def handle_job_failure(self, job: Any, queue: Any, started_job_registry: Any = None,
                           exc_string: str = "") -> None:
        """RQ's, except in a horse that said it was done (its job ended; something failed after that, RQ's
        record of the delivery most likely): RQ's failure record would delete the worker's current job, which
        may be the next one's by now, and keep the job's hash for ever (failure TTL -1). It is deleted
        instead, as a success's is."""
        if not self._said_done:
            super().handle_job_failure(job, queue, started_job_registry, exc_string)
            return
        log.warning("job %s: RQ's record of its delivery failed after the job ended (%s); deleting it",
                    job.id, exc_string.strip().splitlines()[-1] if exc_string.strip() else "no detail")
        self._delete_delivery(job, succeeded=False)

    def _delete_delivery(self, job: Any, succeeded: bool) -> None:
        executions = job.get_executions()
        with self.connection.pipeline() as pipe:
            if succeeded:
                self.increment_successful_job_count(pipeline=pipe)
            else:
                self.increment_failed_job_count(pipeline=pipe)
            if job.started_at is not None and job.ended_at is not None:
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


def stopped(pid: int) -> bool:
    """Whether `pid` is stopped by a signal (state T in /proc/<pid>/stat); False once it is gone. Not a
    tracer's stop (t): a process being traced (strace) is in it at each system call, and a debugger's pause
    is the operator's."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] == b"T"
    except (OSError, IndexError):
        return False
