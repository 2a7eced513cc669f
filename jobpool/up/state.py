"""What one `jobpool up` stack leaves for other processes to find it by: two locks and a state file.

A stack is alive while ANY of its processes lives, not while the `up` that started it does: a SIGKILLed
`up` can leave a worker draining, or a stopped one, still writing through its Redis. So `up` holds an
exclusive `flock` on `up.lock` in the state directory and passes that descriptor to every child; the kernel
releases the lock only when the last process holding it (redis, supervisor, workers, their work horses)
is gone. A second `up` that cannot take the lock refuses, naming the processes that hold it. A stale state
file (every process it names gone, the lock free) blocks nothing.

`up-workers.lock` is held the same way by the workers (and their horses) only, so the process that stops
Redis (jobpool/up/guard.py) can wait until no worker is left that may still write through it.

Children die with their parent through the kernel's parent-death signal (`dying_with_parent`), so a `up`
killed with SIGKILL still takes its stack with it.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import STATE_FILE
from ..procid import identity_of, same_process_alive
from ..store import redisurl

STACK_LOCK = "up.lock"
WORKERS_LOCK = "up-workers.lock"
_PR_SET_PDEATHSIG = 1


def dying_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get `sig` when its parent dies (Linux `PR_SET_PDEATHSIG`).

    The setting survives exec but not fork, so a worker's work horse does not get it: it drains when its
    worker asks it to. Should the parent die between fork and prctl, no signal would ever come: the child
    sees a different parent pid after prctl and exits before exec. None where prctl does not exist.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded here: the child only calls it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(1)

    return preexec


def take_lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on `path` (not inherited unless passed on), or None if held."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def lock_is_free(path: Path) -> bool:
    """Whether no process holds the lock on `path` (taken and released at once, through a fresh fd)."""
    fd = take_lock(path)
    if fd is None:
        return False
    os.close(fd)
    return True


def lock_holders(path: Path) -> list[int]:
    """Pids of the processes with `path` open, found in /proc (a process we may not inspect is skipped)."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                fst = os.stat(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if (fst.st_dev, fst.st_ino) == (st.st_dev, st.st_ino):
                found.append(int(entry))
                break
    return found


def record(name: str, pid: int) -> dict[str, Any]:
    """A stack process as the state file names it: its role and its identity (pid plus start time, so a
    recycled pid is never taken for it; see jobpool/procid.py)."""
    return {"name": name, **identity_of(pid)}


def read_state(root: Path) -> dict[str, Any]:
    try:
        state = json.loads((root / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def write_state(root: Path, state: dict[str, Any]) -> None:
    """Write, then rename: a reader in another shell never sees half a file."""
    tmp = (root / STATE_FILE).with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, root / STATE_FILE)


def children_of(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc (empty once it is gone)."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            out += [int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    except OSError:
        pass
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def live_stack(root: Path, locked_by_other: bool) -> list[str]:
    """The processes of an earlier stack on `root` that still live, as "name pid" strings: those the state
    file names whose identity is still alive, and (when the lock is held) whoever holds it."""
    state = read_state(root)
    recorded = state.get("processes")
    recorded = recorded if isinstance(recorded, list) else []
    alive = {int(r["pid"]): str(r.get("name", "?")) for r in recorded
             if isinstance(r, dict) and same_process_alive(r) is True}
    if locked_by_other:
        for pid in lock_holders(root / STACK_LOCK):
            alive.setdefault(pid, _comm(pid))
    return [f"{name} {pid}" for pid, name in sorted(alive.items())]


def refusal(root: Path, alive: list[str]) -> str:
    """The one line a second `up` prints when a stack on `root` still lives."""
    url = read_state(root).get("redis_url")
    named = ", ".join(alive) if alive else "pids not visible from here"
    redis_part = f"; redis {redisurl.safe(url)}" if url else ""
    return (f"Error: jobpool up is already running on {root} (alive: {named}"
            f"{redis_part}); stop it with Ctrl-C in its shell, or end those processes")
