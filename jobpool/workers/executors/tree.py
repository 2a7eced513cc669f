"""A subprocess job's process tree: every process the job started, signalled and ended together, as a
container's processes are (docs/architecture.md, "The subprocess executor's promise").

`CgroupTree` keeps the promise: the job's own cgroup (jobpool/jobcgroup.py) holds every descendant, whatever
session or process group it moved to. `GroupTree` is the fallback where no cgroup can be made: the job's
process group, which a child leaves by calling `setsid` (or `setpgid`), and such a child outlives its job. The
worker logs the fallback at start, and `jobpool up` says it.
"""

from __future__ import annotations

import os
import signal
from typing import Any, Protocol

from ...jobcgroup import JobCgroup


class ProcessTree(Protocol):
    def identity(self) -> dict[str, Any]:
        """What the row records of the tree, beside its main process's identity."""

    def signal(self, sig: int) -> None:
        """Send `sig` to every process of the tree."""

    def kill(self) -> None:
        """SIGKILL every process of the tree."""

    def gone(self) -> bool:
        """No process of the tree runs any more (a zombie does no work, so it does not count)."""

    def remove(self) -> bool:
        """Release what held the tree, once it is gone; True when nothing of it is left."""


class CgroupTree:
    """The tree is the job's cgroup: nothing a process of it does takes it out."""

    def __init__(self, cgroup: JobCgroup) -> None:
        self.cgroup = cgroup

    def identity(self) -> dict[str, Any]:
        return self.cgroup.identity()

    def signal(self, sig: int) -> None:
        self.cgroup.signal(sig)

    def kill(self) -> None:
        self.cgroup.kill()  # atomic: a fork in flight is killed too

    def gone(self) -> bool:
        return not self.cgroup.populated()

    def remove(self) -> bool:
        return self.cgroup.remove()


class GroupTree:
    """The tree is the job's process group (its main process is the group's leader: pgid == pid). A group's
    id is not handed to a new process while any member lives, so the group is signalled safely after its
    leader is gone; but a member that left it is out of reach."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        #: Seen gone: from then on its number may name another process's group, never signalled.
        self._gone = False

    def identity(self) -> dict[str, Any]:
        return {}

    def signal(self, sig: int) -> None:
        if self._gone:
            return
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            self._gone = True

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def gone(self) -> bool:
        if not self._gone:
            try:
                os.killpg(self.pgid, 0)
            except ProcessLookupError:
                self._gone = True
        # A group of zombies only is gone too, but it still holds its number: no need to mark it.
        return self._gone or not any(_running_in_group(pid, self.pgid) for pid in _pids())

    def remove(self) -> bool:
        return self.gone()


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _running_in_group(pid: int, pgid: int) -> bool:
    """`pid` is a member of process group `pgid` that is not a zombie (/proc/<pid>/stat: state, ppid, pgrp
    after the command name)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0] != "Z" and int(fields[2]) == pgid

