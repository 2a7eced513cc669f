"""Every printer of the Redis URL, as real processes against a real redis-server that requires the password
(and an ACL user) the URL carries, reached over TCP, its unix socket and a real Sentinel that requires one
too: `jobpool status` and `status --json`, a `jobpool dashboard` fetched over HTTP (the overview, its
fragments, /api/status and the other pages), and the logs of `supervisor --once` and of a worker. In each, the
secret appears nowhere, and the URL is shown with the rest of it readable (jobpool/store/redisurl.py `safe`).
"""

from __future__ import annotations

import contextlib
import html
import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from jobpool.store.keys import PoolKeys
from tests.support.bad_input import cli
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.sentinels import SERVICE, Sentinel
from tests.support.servers import RedisServer, free_port

SECRET = "Default-pw-7f3a"  # the default user's (requirepass)
ALICE = "Alice-pw-91c2"  # the ACL user alice's
SENTINEL_SECRET = "Sentinel-pw-5d0e"  # the sentinel's own (its requirepass)
SECRETS = (SECRET, ALICE, SENTINEL_SECRET)
POOL = "urls"
PAGES = ("/", "/fragments/overview", "/api/status", "/jobs", "/fragments/jobs", "/events",
         "/fragments/events")


class Secured:
    """A redis-server requiring SECRET (and alice's ALICE), on TCP and a unix socket, with one sentinel
    that watches it (given its password) and requires SENTINEL_SECRET."""

    def __init__(self, server: RedisServer, sentinel: Sentinel) -> None:
        self.server, self.sentinel = server, sentinel
        self.port, self.sock = server.port, server.dir / "r.sock"

    def forms(self) -> list[tuple[str, str]]:
        """(URL, how every printer must show it): each credential form, each one that really logs in; the
        query's password first (the form printed in full before jobpool/store/redisurl.py hid it)."""
        tcp, sock, sent = f"127.0.0.1:{self.port}", str(self.sock), f"127.0.0.1:{self.sentinel.port}"
        return [
            (f"unix://{sock}?password={SECRET}", f"unix://{sock}?password=***"),
            (f"redis://{tcp}/0?password={SECRET}", f"redis://{tcp}/0?password=***"),
            (f"redis://alice:{ALICE}@{tcp}/0", f"redis://***@{tcp}/0"),
            (f"redis://:{SECRET}@{tcp}/0", f"redis://***@{tcp}/0"),
            (f"redis://{tcp}/0?username=alice&password={ALICE}&socket_timeout=5",
             f"redis://{tcp}/0?username=***&password=***&socket_timeout=5"),
            (f"redis://{tcp}/0?pass%77ord={SECRET}", f"redis://{tcp}/0?pass%77ord=***"),
            (f"unix://alice:{ALICE}@{sock}?db=0", f"unix://***@{sock}?db=0"),
            (f"redis+sentinel://:{SECRET}@{sent}/{SERVICE}/0?sentinel_password={SENTINEL_SECRET}",
             f"redis+sentinel://***@{sent}/{SERVICE}/0?sentinel_password=***"),
            (f"redis+sentinel://alice:{ALICE}@{sent}/{SERVICE}?sentinel_username=default&"
             f"sentinel_password={SENTINEL_SECRET}",
             f"redis+sentinel://***@{sent}/{SERVICE}?sentinel_username=***&sentinel_password=***"),
        ]

    def admin(self) -> redis.Redis:
        return redis.Redis(port=self.port, password=SECRET, decode_responses=True, socket_timeout=5)


def _authed_ping(port: int, password: str) -> bool:
    with contextlib.closing(redis.Redis(port=port, password=password, socket_timeout=2)) as c:
        try:
            return bool(c.ping())
        except redis.ConnectionError:
            return False


@pytest.fixture
def secured(redis_server_factory: Callable[[], RedisServer]) -> Iterator[Secured]:
    server = redis_server_factory()
    server.extra_args = ("--unixsocket", str(server.dir / "r.sock"), "--unixsocketperm", "700")
    server.start()
    with contextlib.closing(redis.Redis(port=server.port, decode_responses=True)) as admin:
        admin.acl_setuser("alice", enabled=True, passwords=[f"+{ALICE}"], keys=["*"], channels=["*"],
                          commands=["+@all"])
        admin.config_set("requirepass", SECRET)
    sentinel = Sentinel(server.dir, server.port)
    with sentinel.conf.open("a") as conf:
        conf.write(f"sentinel auth-pass {SERVICE} {SECRET}\nrequirepass {SENTINEL_SECRET}\n")
    sentinel._pings = lambda: _authed_ping(sentinel.port, SENTINEL_SECRET)  # type: ignore[method-assign]
    sentinel.start()
    try:
        yield Secured(server, sentinel)
    finally:
        sentinel.stop()


def _no_secret(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{where} shows a password: {text[:3000]}"


def test_status_shows_every_credential_form_hidden_and_the_rest_readable(secured: Secured,
                                                                         tmp_path: Path) -> None:
    for url, shown in secured.forms():
        env = {"JOBPOOL_REDIS_URL": url, "JOBPOOL_POOL": POOL, "JOBPOOL_STATE_DIR": str(tmp_path)}
        text = cli("status", env=env, cwd=tmp_path)
        as_json = cli("status", "--json", env=env, cwd=tmp_path)
        _no_secret(f"status with {shown}", text.stdout + text.stderr)
        _no_secret(f"status --json with {shown}", as_json.stdout + as_json.stderr)
        assert "Traceback" not in text.stderr + as_json.stderr, as_json.stderr
        redis_part = json.loads(as_json.stdout)["redis"]
        assert redis_part == {**redis_part, "url": shown, "reachable": True}, (url, redis_part)
        assert shown in text.stdout, text.stdout


def _fetch(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class Dashboards:
    """Real `jobpool dashboard` processes, each on a port of its own; one whose port another process took
    before it bound it is started again on another."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path, self.used, self.procs = tmp_path, set[int](), list[JobpoolProcess]()

    def start(self, url: str) -> tuple[int, JobpoolProcess]:
        port = free_port()
        while port in self.used:
            port = free_port()
        self.used.add(port)
        env = {"JOBPOOL_REDIS_URL": url, "JOBPOOL_POOL": POOL, "JOBPOOL_STATE_DIR": str(self.tmp_path)}
        self.procs.append(JobpoolProcess("jobpool.cli", env, self.tmp_path / f"dash-{len(self.procs)}.log",
                                         ("dashboard", "--port", str(port))))
        return port, self.procs[-1]

    def serving(self, url: str, port: int, proc: JobpoolProcess) -> tuple[int, JobpoolProcess]:
        for _ in range(3):
            if eventually(lambda p=port, d=proc: _state(p, d), timeout=60,
                          message=f"the dashboard on port {port} serves") == "up":
                return port, proc
            assert "address already in use" in proc.log().lower(), proc.log()
            port, proc = self.start(url)
        raise AssertionError(f"no free port for the dashboard: {proc.log()}")

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()


def _state(port: int, proc: JobpoolProcess) -> str:
    if proc.proc.poll() is not None:
        return "exited"
    with contextlib.suppress(OSError):
        return "up" if _fetch(port, "/api/status")[0] == 200 else ""
    return ""


def test_the_dashboard_shows_every_credential_form_hidden(secured: Secured, tmp_path: Path) -> None:
    """One real `jobpool dashboard` per URL form, all started at once, each fetched over HTTP once it
    serves: every page and fragment, and /api/status, whose URL is the hidden form."""
    dashboards = Dashboards(tmp_path)
    try:
        started = [(url, shown, *dashboards.start(url)) for url, shown in secured.forms()]
        for url, shown, first_port, first_proc in started:
            port, proc = dashboards.serving(url, first_port, first_proc)
            for page in PAGES:
                status, body = _fetch(port, page)
                assert status == 200, (shown, page, body[:2000])
                _no_secret(f"{page} of the dashboard for {shown}", body)
                _no_secret(f"{page} of the dashboard for {shown} (unescaped)", html.unescape(body))
                if page in ("/", "/fragments/overview"):
                    assert shown in html.unescape(body), (page, shown)
            status_doc = json.loads(_fetch(port, "/api/status")[1])
            assert (status_doc["redis"]["url"], status_doc["redis"]["reachable"]) == (shown, True), status_doc
        dashboards.stop()
        for proc in dashboards.procs:
            _no_secret(f"the log of {proc.log_path.name}", proc.log())
    finally:
        dashboards.stop()


def test_worker_and_supervisor_logs_never_show_the_password(secured: Secured, tmp_path: Path) -> None:
    """A worker (subprocess executor) runs until it has registered its boot in Redis, then drains; a
    supervisor sweeps once. Neither's log (everything they print) holds a password, whatever the form."""
    keys = PoolKeys(POOL)
    with contextlib.closing(secured.admin()) as admin:
        for n, (url, shown) in enumerate(secured.forms()):
            env = {"JOBPOOL_REDIS_URL": url, "JOBPOOL_POOL": POOL, "JOBPOOL_EXECUTOR": "subprocess",
                   "JOBPOOL_STATE_DIR": str(tmp_path / "state"), "JOBPOOL_HEARTBEAT_SECS": "0.5",
                   "JOBPOOL_LEASE_SECS": "2"}
            once = cli("supervisor", "--once", env=env, cwd=tmp_path)
            assert once.returncode == 0, once.stderr
            _no_secret(f"supervisor --once with {shown}", once.stdout + once.stderr)
            admin.delete(keys.boots)
            worker = JobpoolProcess("jobpool.workers", env, tmp_path / f"worker-{n}.log")
            try:
                eventually(lambda w=worker: admin.zcard(keys.boots) > 0 or w.proc.poll() is not None,
                           timeout=30, message=f"the worker with {shown} registers")
                assert worker.proc.poll() is None, worker.log()
            finally:
                worker.stop()
            _no_secret(f"the worker's log with {shown}", worker.log())
