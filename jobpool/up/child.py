"""One process `jobpool up` owns (jobpool/up/stack.py): Redis's guard, the supervisor, the dashboard, a
worker. Started in a session of its own (a terminal's Ctrl-C reaches `up` only, which stops its children in
order) with the parent-death signal (should `up` die without stopping it, it goes too), started again with a
back-off when it keeps exiting, and asked whether it serves its port and what its log said last.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .listen import listens_on
from .state import dying_with_parent

#: A child that exits after running this long is started again at once; one that keeps exiting sooner
#: waits RESTART_FIRST_SECS, then twice as long each time, up to RESTART_MAX_SECS (it must not spin).
STEADY_SECS = 30.0
RESTART_FIRST_SECS = 1.0
RESTART_MAX_SECS = 30.0


@dataclass
class Child:
    """One owned process: its command, log, environment and the descriptors it keeps, and its restarts."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str]
    #: Descriptors the child keeps: the stack's locks (jobpool/up/state.py), held while it lives.
    fds: tuple[int, ...] = ()
    #: The port it serves (the supervisor's metrics, the dashboard), if any: its URL's.
    port: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    asked_to_drain: bool = False
    started_at: float = 0.0
    #: Exits in a row that came before STEADY_SECS of running, and when to start it again after the last.
    quick_exits: int = 0
    restart_at: float | None = None

    def start(self) -> None:
        # Own session: a terminal's Ctrl-C reaches `up` only, which then stops children in the right order.
        # The parent-death signal: should `up` die without stopping them (SIGKILL), they still go.
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env, start_new_session=True,
                                         pass_fds=self.fds, preexec_fn=dying_with_parent())
        self.asked_to_drain = False
        self.started_at = time.monotonic()
        self.restart_at = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    def schedule_restart(self, now: float) -> float:
        """Once it has exited: when to start it again, as a delay from `now` (also kept in `restart_at`)."""
        self.quick_exits = 0 if now - self.started_at >= STEADY_SECS else self.quick_exits + 1
        delay = 0.0
        if self.quick_exits:
            delay = min(RESTART_MAX_SECS, RESTART_FIRST_SECS * 2 ** (self.quick_exits - 1))
        self.restart_at = now + delay
        return delay

    def serving(self) -> bool:
        """Whether this very child listens on its port (jobpool/up/listen.py)."""
        return self.proc is not None and self.port is not None and listens_on(self.proc.pid, self.port)

    def last_line(self) -> str:
        """The last line of its log: what a child that exited at start said about why."""
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                lines = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1].strip() if lines else ""

    def signal(self, sig: int) -> None:
        if self.running():
            assert self.proc is not None
            os.kill(self.proc.pid, sig)


def wait_all(children: list[Child], timeout: float) -> None:
    """Wait at most `timeout` for `children` to exit; SIGKILL, and reap, those still running then."""
    deadline = time.monotonic() + timeout
    while any(c.running() for c in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    for c in children:
        if c.running():
            c.signal(signal.SIGKILL)
            assert c.proc is not None
            c.proc.wait(5)
