"""Real jobpool processes for tests: started with `python -m`, killed by pid (and their forked children)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path

import redis


def children(pid: int) -> list[int]:
    """Direct children of `pid` (e.g. an RQ worker's work horse)."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
    except FileNotFoundError:
        pass
    return out


def socket_inodes(pids: list[int]) -> set[str]:
    """The inodes of the sockets `pids` hold open, from /proc."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    return inodes


def tcp_ports(pids: list[int]) -> dict[int, str]:
    """The local ports of the TCP sockets `pids` hold (their Redis connections among them), each with its
    socket's inode, from /proc."""
    inodes = socket_inodes(pids)
    ports: dict[int, str] = {}
    for pid in pids[:1]:
        for table in ("tcp", "tcp6"):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                    fields = line.split()
                    if fields[9] in inodes:
                        ports[int(fields[1].rpartition(":")[2], 16)] = fields[9]
    return ports


def still_open(inodes: set[str]) -> set[str]:
    """Those of `inodes` some process still holds (a socket inherited by a process not killed, or held by one
    the kill has not ended yet): the kernel has not closed them, so Redis cannot see them end."""
    pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    return inodes & socket_inodes(pids)


def redis_clients(url: str, ports: Collection[int]) -> set[str]:
    """The ids of the clients the Redis server at `url` lists as connected from `ports` (empty when it does
    not answer, or `url` is not a plain redis:// one)."""
    if not ports or not url.startswith("redis://"):
        return set()
    try:
        with contextlib.closing(redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)) as c:
            return {str(x["id"]) for x in c.client_list() if int(x["addr"].rpartition(":")[2]) in ports}
    except redis.RedisError:
        return set()


def forgotten_by_redis(url: str, ids: set[str], timeout: float = 5.0) -> None:
    """Wait (at most `timeout`) until the Redis server at `url` lists none of the clients `ids` (it has read
    their end), or it does not answer. A process killed while blocked in BLMOVE is dropped by Redis only when
    Redis reads the closed socket: a push handled before that goes to the dead client (the supervisor
    redispatches it, past the claim grace). Tests that kill a worker and then enqueue wait for this, so a
    test without a supervisor does not wait for a delivery that went to the dead. By client id, not port: a
    closed port on the loopback may be taken again at once by another process's new connection."""
    if not ids:
        return
    deadline = time.monotonic() + timeout
    with contextlib.closing(redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)) as client:
        while time.monotonic() < deadline:
            try:
                if not ids & {str(c["id"]) for c in client.client_list()}:
                    return
            except redis.RedisError:
                return
            time.sleep(0.02)


def state_of(pid: int) -> str:
    """The kernel's state letter of `pid` (R, S, Z...), or '' once it is gone and reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return ""


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def other_boot(boot_id_file: Path, booted_at: int | None = None) -> tuple[str, ...]:
    """A `JobpoolProcess` prefix under which the process reads the kernel boot id in `boot_id_file`, and with
    `booted_at` that boot time (epoch seconds) as /proc/stat's `btime`: what a process on a rebooted host
    reads. It runs in a mount namespace of its own, the files bound over the kernel's (needs root). Its
    container daemon is the same one."""
    binds = f'mount --bind "$0" {BOOT_ID_PATH}'
    extra: tuple[str, ...] = ()
    if booted_at is not None:
        stat = boot_id_file.with_name(boot_id_file.name + ".stat")
        stat.write_text(f"btime {booted_at}\n")
        binds += ' && mount --bind "$1" /proc/stat && shift'
        extra = (str(stat),)
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c", f'{binds} && exec "$@"',
            str(boot_id_file), *extra)


class JobpoolProcess:
    """`python -m <module>` with JOBPOOL_* settings in its environment; output kept in a log file."""

    def __init__(self, module: str, env: dict[str, str], log_path: Path, args: tuple[str, ...] = (),
                 prefix: tuple[str, ...] = ()) -> None:
        """`prefix`: a command that execs the rest in place (the pid stays the process's), e.g. one that
        shows it another kernel boot id (bench/soak_fleet.py, a simulated host reboot)."""
        self.module, self.env, self.args, self.prefix = module, env, args, prefix
        self.log_path = log_path
        with open(log_path, "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", module, *args], env={**os.environ, **env},
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )

    def respawn(self) -> JobpoolProcess:
        """A new process like this one (a service manager restarting it), logging beside the old log."""
        n = 1
        while (path := self.log_path.with_name(f"{self.log_path.stem}.{n}{self.log_path.suffix}")).exists():
            n += 1
        return JobpoolProcess(self.module, self.env, path, self.args, self.prefix)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def catches(self, sig: int) -> bool:
        """Whether the process has a handler of its own for `sig` now (/proc's SigCgt mask): a worker's
        SIGTERM is its drain only once RQ's work loop has installed it; before, the signal ends it at once."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return False
        caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
        return bool(int(caught, 16) >> (sig - 1) & 1)

    def kill_with_children(self) -> None:
        """SIGKILL the process and its forked children at once (a crash, not a stop); return once they are
        gone and the pool's Redis has dropped the connections that ended with them (`forgotten_by_redis`:
        those a process left alive still holds, inherited, stay)."""
        kids = children(self.proc.pid)
        url = self.env.get("JOBPOOL_REDIS_URL", "")
        ports = tcp_ports([self.proc.pid, *kids])
        ids = redis_clients(url, ports)
        self.signal(signal.SIGKILL)
        for kid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(kid, signal.SIGKILL)
        self.proc.wait(10)
        deadline = time.monotonic() + 5
        while any(state_of(kid) not in ("", "Z") for kid in kids) and time.monotonic() < deadline:
            time.sleep(0.02)
        held = still_open(set(ports.values()))
        if held:  # their connections outlive the kill: only the others' ends can be waited for
            ids = redis_clients(url, [port for port, inode in ports.items() if inode not in held]) & ids
        forgotten_by_redis(url, ids)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop for test cleanup: SIGTERM, then SIGKILL (with children) if it lingers."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.proc.poll() is None:
                self.kill_with_children()
