"""Process identity that survives pid recycling: (pid, start time, pid-namespace inode, kernel boot id).

A pid number alone is evidence of nothing once the process that recorded it is gone: numbers are reused
across restarts and namespaces. The start time (in clock ticks since boot, /proc/<pid>/stat field 22), the
pid namespace and the kernel's boot id together name one process, once.
"""

from __future__ import annotations

import os
from typing import Any


def kernel_boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def host_boot_time() -> float | None:
    """When this host's kernel booted (epoch seconds, /proc/stat `btime`); None where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def pid_namespace(pid: int | str = "self") -> int:
    """Inode of a process's pid namespace (a different namespace means its pid numbers mean other things)."""
    return os.stat(f"/proc/{pid}/ns/pid").st_ino


def start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # The command name (field 2) may hold spaces and parentheses: split after its closing parenthesis.
    return int(stat[stat.rindex(")") + 2:].split()[19])


def identity_of(pid: int) -> dict[str, Any]:
    """The identity of a live process, as recorded with its job row."""
    return {"pid": pid, "start_time": start_time(pid), "pidns": pid_namespace(pid),
            "boot_id": kernel_boot_id()}


def same_process_alive(identity: dict[str, Any]) -> bool | None:
    """True: that very process is alive. False: it is gone (the pid is free or now names another process).
    None: cannot tell from here (another kernel, i.e. host or boot, or another pid namespace than ours)."""
    try:
        if identity["boot_id"] != kernel_boot_id():
            return None  # another kernel: another host, or this one rebooted; either way not ours to judge
        if identity["pidns"] != pid_namespace():
            return None  # our /proc shows another namespace's pid numbers
        pid = int(identity["pid"])
    except (KeyError, TypeError, ValueError, OSError):
        return None
    try:
        return start_time(pid) == int(identity["start_time"]) and not _is_zombie(pid)
    except FileNotFoundError:
        return False
    except (OSError, ValueError, IndexError):
        return None


def _is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return stat[stat.rindex(")") + 2] == "Z"
