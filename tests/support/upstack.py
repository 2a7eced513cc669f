"""A real `jobpool up` for tests (tests/integration/test_up.py, test_readme_tour.py): started as a process,
watched through its state file, and torn down by pid and identity, whatever a failing test left behind."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
import urllib.request
from pathlib import Path
from typing import Any

from jobpool.procid import identity_of, same_process_alive
from tests.support.polling import eventually
from tests.support.procs import children


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


#: The checkout these tests belong to: a test `up` runs in a temporary directory, where `python -m jobpool`
#: would otherwise import whichever jobpool is installed, not the code under test.
REPO = Path(__file__).resolve().parents[2]


def fast_env() -> dict[str, str]:
    """The environment of a test `up`: this one's, with timings that make its tests finish in seconds, and
    this checkout's jobpool first on the path (so are its children's: they inherit it)."""
    env = {**os.environ, "JOBPOOL_SWEEP_INTERVAL_SECS": "1", "JOBPOOL_HEARTBEAT_SECS": "0.5",
           "JOBPOOL_LEASE_SECS": "2", "JOBPOOL_DRAIN_TIMEOUT_SECS": "3",
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("JOBPOOL_REDIS_URL", None)
    return env


def _take_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Up:
    """One real `jobpool up` in `cwd` (subprocess executor unless `args` name one); `seen` collects the
    identity of every process it was seen to start, so teardown can kill, by pid and identity, whatever a
    failing test left behind. With `tty`, it runs in a session of its own on a pseudo-terminal, as in a
    shell's window; closing the terminal (`hang_up`) is the kernel's hangup, not a signal the test picks."""

    def __init__(self, cwd: Path, name: str, args: tuple[str, ...], seen: list[dict[str, Any]],
                 tty: bool = False, env: dict[str, str] | None = None) -> None:
        self.cwd, self.seen = cwd, seen
        self.proc: subprocess.Popen[Any]  # bytes on a terminal, text with its stderr piped
        self.log_path = cwd / f"{name}.log"
        self.state_file = cwd / ".jobpool" / "up.json"
        argv = [sys.executable, "-m", "jobpool.cli", "up", *args]
        if not any(a.startswith("--executor") for a in args):
            argv += ["--executor", "subprocess"]
        env = env or fast_env()
        self.terminal: int | None = None
        if tty:
            self.terminal, window = os.openpty()
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=window, stdout=window,
                                         stderr=window, start_new_session=True, preexec_fn=_take_terminal)
            os.close(window)
        else:
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.PIPE,
                                             text=True)
        self.seen.append(identity_of(self.proc.pid))

    def hang_up(self) -> None:
        assert self.terminal is not None
        os.close(self.terminal)
        self.terminal = None

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr else "(on its terminal)"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready(self) -> dict[str, Any]:
        """The state file this very `up` wrote (not a stale one), once it has written it."""
        def mine() -> dict[str, Any] | None:
            assert self.proc.poll() is None, f"up exited ({self.proc.returncode}): {self.stderr()}"
            try:
                state = json.loads(self.state_file.read_text())
            except (OSError, ValueError):
                return None
            return state if state.get("pid") == self.proc.pid else None
        state = eventually(mine, timeout=30, message="up wrote its state file")
        self.snapshot()
        return state

    def snapshot(self) -> list[dict[str, Any]]:
        """The identities of every process below `up` now (redis and its guard, supervisor, workers, horses,
        jobs), remembered for teardown."""
        found = []
        for pid in descendants(self.proc.pid):
            with contextlib.suppress(OSError):  # gone meanwhile
                found.append(identity_of(pid))
        self.seen.extend(found)
        return found


class Stacks:
    """The `up`s one test starts in `cwd`; `close()` leaves no process of theirs behind."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.seen: list[dict[str, Any]] = []
        self.started: list[Up] = []

    def start(self, *args: str, name: str = "up", tty: bool = False, env: dict[str, str] | None = None) -> Up:
        up = Up(self.cwd, name, args, self.seen, tty, env)
        self.started.append(up)
        return up

    def close(self) -> None:
        for up in self.started:
            up.snapshot()
        # A test that failed (or ran against an `up` that leaks) leaves nothing behind.
        for ident in self.seen:
            if same_process_alive(ident):
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    os.kill(ident["pid"], sig)
        for up in self.started:
            up.proc.kill()
            up.proc.wait(10)
            if up.proc.stderr:
                up.proc.stderr.close()
            if up.terminal is not None:
                os.close(up.terminal)


def redis_servers_in(data_dir: Path) -> set[int]:
    """Pids of the redis-servers running with their data in `data_dir` (redis-server works from --dir)."""
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{entry}/comm").read_text().strip() == "redis-server" and \
                    os.readlink(f"/proc/{entry}/cwd") == str(data_dir):
                found.add(int(entry))
        except OSError:
            pass
    return found


def get_json(url: str) -> Any:
    """The JSON an HTTP GET of `url` answers, or None when nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.loads(reply.read())
    except OSError:
        return None
