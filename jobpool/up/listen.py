"""Which process listens on a TCP port, read from /proc: how `jobpool up` (jobpool/up/stack.py) knows that the
URL it prints is served by its own child, not by another stack that took the port first.

A port `up` picked as free (jobpool/up/find.py, `free_port`) can still be taken before its child binds it:
two `up` stacks started at once race for the dashboard's default port, and two given the same
JOBPOOL_METRICS_PORT want the same one. The child that loses exits, but a URL on that port would answer all
the same, with the other stack's pool. So `up` says a URL only once the listening socket on its port is one
of its child's own descriptors.
"""

from __future__ import annotations

import os
from pathlib import Path

#: /proc/net/tcp's state column for a listening socket.
_LISTEN = "0A"
#: Its column of the socket's inode.
_INODE = 9


def _listening_inodes(port: int) -> set[str]:
    """The inodes of the sockets listening on `port`, on any address, IPv4 or IPv6."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            if len(fields) > _INODE and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[_INODE])
    return found


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process `pid` holds open (empty once it is gone, or if not ours to see)."""
    found: set[str] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[len("socket:["):-1])
    return found


def taken(port: int) -> bool:
    """Whether any process listens on TCP `port` (a port merely not bindable, e.g. below 1024, is not)."""
    return bool(_listening_inodes(port))


def listens_on(pid: int, port: int) -> bool:
    """Whether process `pid` holds a socket listening on TCP `port`."""
    wanted = _listening_inodes(port)
    return bool(wanted) and not wanted.isdisjoint(_socket_inodes(pid))
