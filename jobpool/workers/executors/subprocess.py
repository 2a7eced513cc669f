"""Subprocess executor: the job is a child process in a session of its own, for machines without Docker.

The recorded identity is (pid, start time, pid namespace, kernel boot id), never a bare pid, so a recycled
pid number can never pass for the job. The job's process group gets the stop signal; a worker that dies
leaves its job running, as a container would be left.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from ...contract import ENV_CHECKPOINT_DIR
from ...exits import Ending
from ...procid import identity_of
from .base import STATE_DIR, Fence, HostFault, Launch, LaunchError, no_fence


class ProcessHandle:
    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path, scratch: Path | None = None) -> None:
        self._proc = proc
        self._log_path = log_path
        #: The working directory of an attempt that keeps no checkpoint: removed with the log.
        self._scratch = scratch
        self.container_id = ""
        self.daemon_id = ""
        self.identity: dict[str, Any] | None = {"executor": "subprocess", **identity_of(proc.pid)}

    def wait(self, timeout: float) -> Ending | None:
        try:
            code = self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        # A job killed by a signal reports 128+N, as a shell (and Docker) would. Our own child: its end is
        # its own (no daemon in between to lose it, and no OOM flag to read).
        return Ending(128 - code if code < 0 else code)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self._proc.pid, sig)  # our own child, in its own session: pgid == pid
        except ProcessLookupError:
            pass

    def signal_stop(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def log_tail(self, max_bytes: int) -> bytes:
        try:
            with open(self._log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read()
        except OSError as exc:
            return f"[jobpool: logs unavailable: {exc}]".encode()

    def remove(self) -> None:
        try:
            self._log_path.unlink()
        except FileNotFoundError:
            pass
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)


class SubprocessExecutor:
    name = "subprocess"

    def __init__(self, state_dir: str) -> None:
        self.root = Path(state_dir).absolute()

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
        with out:
            try:
                proc = subprocess.Popen(
                    list(spec.command), env=env, cwd=spec.workdir or str(cwd), stdin=subprocess.DEVNULL,
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                )
            except (OSError, ValueError) as exc:
                if scratch is not None:
                    shutil.rmtree(scratch, ignore_errors=True)
                raise LaunchError(f"launch_failed: {exc}") from None
        return ProcessHandle(proc, log_path, scratch)

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
