"""A job's own cgroup (v2): how the subprocess executor ends every process a job started.

A process group is not enough: a child that calls `setsid` leaves it, and a double fork leaves the job's tree
of parents. A cgroup is inherited by every fork and kept through `setsid`; a process leaves it only by a write
to a cgroup file (which a job running as root could make, as a privileged container could leave its own:
jobpool contains jobs that do not mean to escape, it is no sandbox). So the job's cgroup is the job, as a
container is. `cgroup.kill` (Linux 5.14) kills every process in it at once, forks in flight included, and
`cgroup.events` says whether any process is left (a zombie is not counted: it does no work).

A job's cgroup is made under the cgroup of the process that launches it (the worker's work horse), so it
needs a cgroup2 hierarchy mounted (a v2-only host has it at /sys/fs/cgroup, a hybrid one at
/sys/fs/cgroup/unified) and write access there (root, or a subtree delegated to the user, as systemd gives a
user's session). Where either is missing, `unavailable()` says why, and the executor falls back to the
job's process group (jobpool/workers/executors/tree.py), which does not keep the promise.

The row records the cgroup by its path (as this process's cgroup namespace shows it), its inode (a cgroup
made again at that path is another one) and the cgroup namespace, so a supervisor on the same kernel can tell
whether a process of the job still lives after its worker died (`still_populated`; docs/architecture.md,
"The subprocess executor's promise").
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MOUNTINFO = "/proc/self/mountinfo"
OWN_CGROUP = "/proc/self/cgroup"
CGROUP_NS = "/proc/self/ns/cgroup"
#: The fields of a mountinfo line (proc(5)) read here: the root within its filesystem, the mount point.
_ROOT, _MOUNT_POINT = 3, 4


class Unavailable(Exception):
    """A job cannot get a cgroup of its own here; the message says why."""


def _unescape(field: str) -> str:
    """A path as /proc/self/mountinfo writes it: space, tab, newline and backslash octal-escaped."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def hierarchy() -> tuple[Path, str]:
    """Where this mount namespace shows the cgroup2 hierarchy, and which of its cgroups is shown there."""
    try:
        with open(MOUNTINFO) as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if right.split(" ", 1)[0] == "cgroup2" and len(fields) > _MOUNT_POINT:
                    return Path(_unescape(fields[_MOUNT_POINT])), _unescape(fields[_ROOT])
    except OSError as exc:
        raise Unavailable(f"cannot read {MOUNTINFO}: {exc.strerror}") from None
    raise Unavailable("no cgroup2 hierarchy is mounted (a cgroup v1-only host)")


def own_path() -> str:
    """This process's cgroup2 cgroup, as its cgroup namespace names it."""
    try:
        text = Path(OWN_CGROUP).read_text()
    except OSError as exc:
        raise Unavailable(f"cannot read {OWN_CGROUP}: {exc.strerror}") from None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise Unavailable("this process is in no cgroup2 cgroup (a cgroup v1-only host)")


def directory(path: str) -> Path:
    """The directory of the cgroup `path` (as named by /proc/self/cgroup) in this mount namespace."""
    mount, root = hierarchy()
    if root != "/":
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            raise Unavailable(f"cgroup {path} is outside the cgroup2 hierarchy mounted at {mount}")
        path = path[len(root):]
    return mount / path.lstrip("/")


def namespace() -> int:
    """This process's cgroup namespace (0 on a kernel without them): another one names cgroups otherwise."""
    try:
        return os.stat(CGROUP_NS).st_ino
    except OSError:
        return 0


def _populated(where: Path) -> bool:
    """Whether any live process is in the cgroup at `where` or below it. One that is gone was empty: only an
    empty cgroup can be removed."""
    try:
        events = (where / "cgroup.events").read_text()
    except FileNotFoundError:
        return False
    return "populated 1" in events.splitlines()


class JobCgroup:
    """One job attempt's cgroup."""

    def __init__(self, path: str, where: Path, inode: int) -> None:
        self.path = path
        self.directory = where
        self.inode = inode

    @classmethod
    def make(cls, name: str) -> JobCgroup:
        """A new cgroup `name` under this process's own; raises `Unavailable` when it cannot be made."""
        path = own_path().rstrip("/") + "/" + name
        where = directory(path)
        try:
            where.mkdir()
        except OSError as exc:
            raise Unavailable(f"cannot make a cgroup in {where.parent}: {exc.strerror}") from None
        cgroup = cls(path, where, where.stat().st_ino)
        if not (where / "cgroup.kill").exists():
            cgroup.remove()
            raise Unavailable("this kernel has no cgroup.kill (Linux 5.14 and later have)")
        # Moving a process needs write access to `cgroup.procs` of the cgroup it moves to and of the common
        # ancestor of where it is and where it goes: here, this process's own cgroup.
        for procs in (where / "cgroup.procs", where.parent / "cgroup.procs"):
            if not os.access(procs, os.W_OK):
                cgroup.remove()
                raise Unavailable(f"{procs} is not writable by this user")
        return cgroup

    def identity(self) -> dict[str, Any]:
        """What the row records of it, beside the main process's identity (jobpool/procid.py)."""
        return {"cgroup": self.path, "cgroup_id": self.inode, "cgroupns": namespace()}

    def open_procs(self) -> int:
        """A descriptor on its `cgroup.procs`: a child writes "0" there to enter it before it execs (a write
        by pid from the parent would come after the exec, when the job may already have forked)."""
        return os.open(self.directory / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)

    def pids(self) -> list[int]:
        """The processes in it and in any cgroup the job made below it."""
        pids: list[int] = []
        for where, _dirs, _files in os.walk(self.directory):
            with contextlib.suppress(FileNotFoundError, ValueError):
                pids += [int(p) for p in Path(where, "cgroup.procs").read_text().split()]
        return pids

    def populated(self) -> bool:
        return _populated(self.directory)

    def signal(self, sig: int) -> None:
        """Send `sig` to every process in it. Each is pinned by a pidfd and checked to be still in it before
        the signal goes, so a pid number freed and reused meanwhile is never signalled."""
        for pid in self.pids():
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # gone already
            try:
                if self._holds(pid):
                    signal.pidfd_send_signal(fd, sig)
            except OSError:
                pass  # it exited meanwhile
            finally:
                os.close(fd)

    def _holds(self, pid: int) -> bool:
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False
        mine = f"0::{self.path}"
        return any(line == mine or line.startswith(mine + "/") for line in text.splitlines())

    def kill(self) -> None:
        """SIGKILL every process in it (and below it) at once."""
        with contextlib.suppress(FileNotFoundError):  # removed: it was empty
            (self.directory / "cgroup.kill").write_text("1")

    def remove(self) -> bool:
        """Remove it (and any cgroup the job made below it) once empty; True once it is gone. A cgroup that
        still holds a process refuses (EBUSY) and is left."""
        if not self.directory.exists():
            return True
        for where, _dirs, _files in os.walk(self.directory, topdown=False):
            try:
                os.rmdir(where)
            except FileNotFoundError:
                pass
            except OSError:
                return False
        return True


def job_cgroup_name(pool: str, job_id: str, attempt: int) -> str:
    """A name of its own for each launch (a random tail: an attempt launched again after Redis lost its claim
    must not find its first launch's cgroup); pool names and job ids are short (jobpool/store/keys.py)."""
    return f"jobpool-{pool}-{job_id}-a{attempt}-{secrets.token_hex(4)}"[:200]


#: What a job without a cgroup of its own risks: said by the worker at start and by `jobpool up` when it
#: picks the subprocess executor (README.md, "The subprocess executor", says it too).
UNCONTAINED = ("a process a job starts in a session or process group of its own (setsid) may outlive the "
               "job, and run on after its slot went to the next job")


def promise_unkept() -> str:
    """'' where a job gets a cgroup of its own; else why not, and what that risks, in one line."""
    why = unavailable()
    return f"no cgroup of its own for a job here ({why}): {UNCONTAINED}" if why else ""


def unavailable() -> str:
    """Why a job cannot get a cgroup of its own on this host ('' when it can): one is made and removed to
    find out."""
    try:
        JobCgroup.make(f"jobpool-check-{os.getpid()}-{secrets.token_hex(4)}").remove()
    except Unavailable as exc:
        return str(exc)
    return ""


def recorded(identity: Mapping[str, Any]) -> JobCgroup | None:
    """The job cgroup a row's identity names, as this process sees it; None when it names none, or one this
    process cannot see for sure (another cgroup namespace, no cgroup2 hierarchy mounted here, or another
    cgroup at that path now). A cgroup removed since is returned: it was empty."""
    try:
        path, inode, ns = str(identity["cgroup"]), int(identity["cgroup_id"]), int(identity["cgroupns"])
        if ns != namespace():
            return None
        where = directory(path)
    except (KeyError, TypeError, ValueError, Unavailable):
        return None
    try:
        if where.stat().st_ino != inode:
            return None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    return JobCgroup(path, where, inode)


def still_populated(identity: Mapping[str, Any]) -> bool | None:
    """For a row that recorded a job cgroup: True while a process of the job lives in it, False once none
    does, None when this process cannot tell (see `recorded`). The caller has checked that the row's kernel
    (boot id) is this one."""
    cgroup = recorded(identity)
    return None if cgroup is None else cgroup.populated()
