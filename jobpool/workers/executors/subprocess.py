"""Subprocess executor: the job is a child process in a session of its own, for machines without Docker.

The recorded identity is (pid, start time, pid namespace, kernel boot id), never a bare pid, so a recycled
pid number can never pass for the job. Its promise is a container's: every process the job started is gone
before its end is recorded and its slot freed. The job runs in a cgroup of its own (jobpool/jobcgroup.py),
which no `setsid` or double fork leaves: its stop signal goes to every process in it, and when its main
process exits (the job is over then, as a container is when its PID 1 exits) whatever it left is killed and
its end waits until none is left. Where no cgroup can be made the job's process group stands in for it, and
a process that left the group may outlive its job (executors/tree.py); the worker says so at start. A worker
that dies leaves its job running, as a container would be left: the supervisor keeps the slot while the
main process or, recorded with the row, anything in the job's cgroup lives (supervisor/probes.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ... import jobcgroup
from ...contract import ENV_CHECKPOINT_DIR
from ...exits import Ending
from ...procid import identity_of
from .base import STATE_DIR, Fence, HostFault, Launch, LaunchError, Output, newest, no_fence
from .tree import CgroupTree, GroupTree, ProcessTree

log = logging.getLogger(__name__)

#: How often the end of a job's tree is looked at, once its main process has exited.
TREE_POLL_SECS = 0.01
#: How long a removal waits for a killed tree to be gone (a process in uninterruptible sleep dies late).
REMOVE_WAIT_SECS = 5.0
#: The kernel's clock ticks per second: the unit of a process's start time in /proc/<pid>/stat.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class ProcessHandle:
    def __init__(self, proc: subprocess.Popen[bytes], tree: ProcessTree, log_path: Path,
                 scratch: Path | None = None) -> None:
        self._proc = proc
        self._tree = tree
        self._log_path = log_path
        #: The working directory of an attempt that keeps no checkpoint: removed with the log.
        self._scratch = scratch
        #: The main process's exit, once it has exited (128+N when a signal killed it).
        self._code: int | None = None
        self.container_id = ""
        self.daemon_id = ""
        self.identity: dict[str, Any] | None = {"executor": "subprocess", **identity_of(proc.pid),
                                                **tree.identity()}

    def wait(self, timeout: float) -> Ending | None:
        """The job's end, once its main process has exited and nothing of its tree is left: what the main
        process left running is killed then, as a container's processes are when its PID 1 exits."""
        deadline = time.monotonic() + timeout
        if self._code is None:
            try:
                code = self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return None
            # A job killed by a signal reports 128+N, as a shell (and Docker) would. Our own child: its end is
            # its own (no daemon in between to lose it, and no OOM flag to read).
            self._code = 128 - code if code < 0 else code
            self._tree.kill()
        if not self._gone_by(deadline):
            self._tree.kill()  # anything a fork in flight made past the last kill (a process group's)
            return None  # asked again next slice: the slot is not freed while a process of it lives
        self._tree.remove()
        return Ending(self._code)

    def ran_for(self, timeout: float) -> float | None:
        """From its main process's start time as recorded in its identity (clock ticks since the kernel
        booted), against the kernel's time since boot now (/proc/uptime): the kernel's own record on one
        clock, whatever the wall clock does."""
        assert self.identity is not None  # a process's handle always has one
        try:
            with open("/proc/uptime") as f:
                up = float(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return max(0.0, up - int(self.identity["start_time"]) / CLOCK_TICKS)

    def _gone_by(self, deadline: float) -> bool:
        while not self._tree.gone():
            if time.monotonic() >= deadline:
                return False
            time.sleep(TREE_POLL_SECS)
        return True

    def signal_stop(self) -> None:
        self._tree.signal(signal.SIGTERM)

    def kill(self) -> None:
        self._tree.kill()

    def log_tail(self, max_bytes: int) -> bytes:
        try:
            with open(self._log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read()
        except OSError as exc:
            return f"[jobpool: logs unavailable: {exc}]".encode()

    def read_output(self, position: str, budget: int, lines: int, timeout: float) -> Output | None:
        """From its output file, where `position` is a byte offset: what was written past it, of which the
        newest `budget` bytes (the rest counted as dropped)."""
        try:
            with open(self._log_path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                start = int(position) if position.isdigit() else 0
                start = min(start, size)  # a shorter file than the position: not the same file, read its end
                before = max(0, size - start - budget - 1)  # with the byte before the newest `budget`
                f.seek(start + before)
                text, cut = newest(f.read(size - start - before), budget)
                return Output(text, str(size), before + cut)
        except OSError:
            return None

    def remove(self) -> None:
        # Its end is recorded, or nothing will record it (the row is someone else's): whatever of it still
        # runs is killed, and its cgroup goes once empty.
        self._tree.kill()
        if self._gone_by(time.monotonic() + REMOVE_WAIT_SECS):
            self._proc.poll()  # reaped, if it was the main process that was left
            if not self._tree.remove():
                log.warning("pid %s: could not remove its job's cgroup", self._proc.pid)
        else:
            log.warning("pid %s: processes of its job still live %.0fs after SIGKILL; left",
                        self._proc.pid, REMOVE_WAIT_SECS)
        with contextlib.suppress(FileNotFoundError):
            self._log_path.unlink()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)


def _enter(procs: int) -> None:
    os.write(procs, b"0")  # "0": the writing process itself


#: Starts a job's process, with what its child runs before its exec (or nothing).
Starter = Callable[[Callable[[], None] | None], "subprocess.Popen[bytes]"]


def _start_in(cgroup: jobcgroup.JobCgroup, start: Starter) -> subprocess.Popen[bytes] | None:
    """Start the job's process inside `cgroup`; None when it could not enter it, and then nothing ran (the
    child failed before its exec). The child enters the cgroup between fork and exec, so every process the job
    makes is born in it; Python code there must take no lock another thread of this process may hold, and a
    write of one byte to a descriptor opened beforehand takes none."""
    try:
        procs = cgroup.open_procs()
    except OSError:
        return None
    try:
        return start(lambda: _enter(procs))
    except subprocess.SubprocessError:  # what Popen raises when the preexec function failed
        return None
    finally:
        os.close(procs)


class SubprocessExecutor:
    name = "subprocess"

    def __init__(self, state_dir: str) -> None:
        self.root = Path(state_dir).absolute()
        #: Why a job gets no cgroup of its own here ('' when it does): then a process that leaves the job's
        #: process group outlives its job. Said once per worker boot (the executor is made once per boot:
        #: workers/runtime.py).
        self.uncontained = jobcgroup.unavailable()
        if self.uncontained:
            log.warning("subprocess executor: no cgroup of its own for a job here (%s): %s", self.uncontained,
                        jobcgroup.UNCONTAINED)
        else:
            log.info("subprocess executor: each job runs in a cgroup of its own, under %s",
                     jobcgroup.own_path())

    def checkpoint_dir(self, pool: str, job_id: str) -> Path:
        return self.root / "checkpoints" / pool / job_id

    def launch(self, launch: Launch, fence: Fence = no_fence) -> ProcessHandle:
        spec = launch.spec
        logs = self.root / "logs" / launch.pool
        log_path = logs / f"{launch.job_id}-a{launch.attempt}.log"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **spec.env, **launch.env}
        # The job's checkpoint directory, or, for a job that keeps none, an empty one of this attempt's own
        # (removed with the attempt's log): its working directory unless the spec names one.
        scratch = None
        if spec.checkpoint:
            cwd = self.checkpoint_dir(launch.pool, launch.job_id)
            env[ENV_CHECKPOINT_DIR] = str(cwd)
        else:
            cwd = scratch = self.root / "scratch" / launch.pool / f"{launch.job_id}-a{launch.attempt}"
        try:
            logs.mkdir(parents=True, exist_ok=True)
            cwd.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._host_fault(exc, scratch) from None
        fence("", "")  # nothing to name or undo yet: a refusal (NotLaunched) goes straight through
        try:
            out = open(log_path, "wb")  # noqa: SIM115 - closed below, once the child has its copy
        except OSError as exc:
            raise self._host_fault(exc, scratch) from None
        cgroup = self._cgroup(launch)
        with out:

            def start(enter: Callable[[], None] | None) -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    list(spec.command), env=env, cwd=spec.workdir or str(cwd), stdin=subprocess.DEVNULL,
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=enter,
                )

            try:
                proc = _start_in(cgroup, start) if cgroup is not None else None
                if proc is None and cgroup is not None:
                    log.warning("job %s: could not enter its cgroup %s: %s", launch.job_id, cgroup.path,
                                jobcgroup.UNCONTAINED)
                    cgroup.remove()
                    cgroup = None
                if proc is None:
                    proc = start(None)
            except (OSError, ValueError) as exc:
                if cgroup is not None:
                    cgroup.remove()
                if scratch is not None:
                    shutil.rmtree(scratch, ignore_errors=True)
                raise LaunchError(f"launch_failed: {exc}") from None
        tree: ProcessTree = CgroupTree(cgroup) if cgroup is not None else GroupTree(proc.pid)
        return ProcessHandle(proc, tree, log_path, scratch)

    def _cgroup(self, launch: Launch) -> jobcgroup.JobCgroup | None:
        """The attempt's own cgroup, or None where none can be made (then its process group stands in)."""
        if self.uncontained:
            return None
        try:
            name = jobcgroup.job_cgroup_name(launch.pool, launch.job_id, launch.attempt)
            return jobcgroup.JobCgroup.make(name)
        except jobcgroup.Unavailable as exc:
            log.warning("job %s: no cgroup of its own (%s): %s", launch.job_id, exc, jobcgroup.UNCONTAINED)
            return None

    @staticmethod
    def _host_fault(exc: OSError, scratch: Path | None) -> HostFault:
        """The host's own directories could not be written (read-only, full): no fault of the job's."""
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        return HostFault(STATE_DIR, str(exc))

    def attach(self, pool: str, job_id: str, attempt: int, container_id: str) -> None:
        return None  # a process cannot be re-parented: the supervisor waits for it to end instead

    def remove_checkpoint(self, pool: str, job_id: str) -> None:
        shutil.rmtree(self.checkpoint_dir(pool, job_id), ignore_errors=True)

    def close(self) -> None:
        pass
