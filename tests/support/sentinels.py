"""A Redis watched by Sentinel, started by the tests: one primary, one replica and three sentinels, each a
private redis-server process (the sentinels are `redis-server CONF --sentinel`) on its own 127.0.0.1 port,
stopped by its pid. Faults: a forced failover (`SENTINEL FAILOVER`), a SIGKILLed primary, and a replica cut
off from its primary while both run, so that it falls behind.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any, cast

import redis

from tests.support.polling import eventually
from tests.support.servers import RedisServer, _stop_process, _wait_until, free_port, redis_server_binary

SERVICE = "jp"
#: Short, so a SIGKILLed primary is failed over within seconds (Redis's default is 30 s).
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 4000


def direct_client(server: RedisServer) -> redis.Redis:
    """A text client of one server of the group, whatever its role."""
    return redis.Redis(port=server.port, decode_responses=True, socket_timeout=2)


class Sentinel:
    """One sentinel process monitoring `SERVICE`."""

    def __init__(self, root: Path, primary_port: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="jp-sentinel-", dir=root))
        self.port = free_port()
        self.conf = self.dir / "sentinel.conf"
        self.conf.write_text("\n".join([
            f"port {self.port}", "bind 127.0.0.1", "daemonize no", f"dir {self.dir}",
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2",
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {SERVICE} 1", ""]))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise FileNotFoundError("redis-server not found (apt-get install redis-server)")
        log = self.dir / "sentinel.log"
        with log.open("ab") as out:
            self.proc = subprocess.Popen([binary, str(self.conf), "--sentinel"], stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT)
        _wait_until(self._pings, self.proc, timeout, f"redis sentinel on port {self.port}", log)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=2)

    def _pings(self) -> bool:
        with contextlib.closing(self.client()) as c:
            try:
                return bool(c.ping())
            except redis.ConnectionError:
                return False

    def stop(self) -> None:
        _stop_process(self.proc, signal.SIGTERM, 10)


class SentinelGroup:
    """A primary, a replica and three sentinels. `url` is what JOBPOOL_REDIS_URL is set to."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="jp-sentinels-"))
        self.primary = RedisServer()
        self.servers: list[RedisServer] = [self.primary]
        self.sentinels: list[Sentinel] = []

    def start(self) -> None:
        self.primary.start()
        replica = RedisServer(extra_args=("--replicaof", "127.0.0.1", str(self.primary.port)))
        self.servers.append(replica)
        replica.start()
        eventually(lambda: self._info(replica).get("master_link_status") == "up", timeout=20,
                   message="the replica is in sync")
        self.sentinels = [Sentinel(self.root, self.primary.port) for _ in range(3)]
        for s in self.sentinels:
            s.start()
        eventually(self._all_see_everyone, timeout=30,
                   message="every sentinel sees the replica and the others")

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def _info(self, server: RedisServer) -> dict[str, Any]:
        with contextlib.closing(direct_client(server)) as c:
            try:
                return dict(c.info("replication"))
            except redis.RedisError:
                return {}

    def _all_see_everyone(self) -> bool:
        for s in self.sentinels:
            with contextlib.closing(s.client()) as c:
                try:
                    master = cast("dict[str, Any]", c.sentinel_master(SERVICE))
                except redis.RedisError:
                    return False
                if master.get("num-slaves") != 1 or master.get("num-other-sentinels") != 2:
                    return False
        return True

    def primary_port(self) -> int | None:
        """Where the sentinels (a majority of those that answer) say the primary is."""
        answers: list[int] = []
        for s in self.sentinels:
            with contextlib.closing(s.client()) as c, contextlib.suppress(redis.RedisError):
                addr = cast("tuple[str, int] | None", c.sentinel_get_master_addr_by_name(SERVICE))
                if addr:
                    answers.append(int(addr[1]))
        return max(set(answers), key=answers.count) if answers else None

    def current_primary(self) -> RedisServer:
        port = self.primary_port()
        return next(s for s in self.servers if s._port == port)

    def current_replica(self) -> RedisServer:
        port = self.primary_port()
        return next(s for s in self.servers if s._port != port)

    def _promoted(self, old_port: int) -> bool:
        """The sentinels name a new primary, it says it is one, and (if it runs) the old one follows it."""
        port = self.primary_port()
        if port is None or port == old_port:
            return False
        new = next(s for s in self.servers if s._port == port)
        return self._info(new).get("role") == "master"

    def failover(self, timeout: float = 30.0) -> RedisServer:
        """SENTINEL FAILOVER: the replica is promoted, the old primary demoted to its replica."""
        old = self.current_primary()
        with contextlib.closing(self.sentinels[0].client()) as c:
            c.execute_command("SENTINEL", "FAILOVER", SERVICE)
        eventually(lambda: self._promoted(old.port), timeout=timeout,
                   message="the sentinels promoted the replica")
        eventually(lambda: self._info(old).get("role") == "slave"
                   and self._info(old).get("master_link_status") == "up", timeout=timeout,
                   message="the old primary follows the new one")
        return self.current_primary()

    def kill_primary(self, timeout: float = 30.0) -> RedisServer:
        """SIGKILL the primary; wait until the sentinels promote the replica. The old one stays down."""
        old = self.current_primary()
        old.kill()
        eventually(lambda: self._promoted(old.port), timeout=timeout,
                   message="the sentinels promoted the replica after the primary died")
        return self.current_primary()

    def cut_replica(self) -> None:
        """The replica's link to the primary is cut and cannot come back (it now offers the primary a
        password the primary does not take), while both run: it falls behind from here, yet stays a
        candidate for promotion. (SIGSTOP would not do: the kernel keeps receiving for a stopped replica,
        and it catches up when it resumes.)"""
        replica, primary = self.current_replica(), self.current_primary()
        with contextlib.closing(direct_client(replica)) as r, contextlib.closing(direct_client(primary)) as p:
            r.config_set("masterauth", "not-the-primarys-password")
            p.client_kill_filter(_type="replica")
            eventually(lambda: r.info("replication").get("master_link_status") == "down", timeout=10,
                       message="the replica lost its primary")

    def close(self) -> None:
        for s in self.sentinels:
            s.stop()
        for server in self.servers:
            server.close()

        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SentinelGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

