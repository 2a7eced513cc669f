"""Idle and slow clients against the real servers: the dashboard (`jobpool dashboard`) under a lowered
descriptor limit, and the supervisor's `/metrics` (JOBPOOL_METRICS_PORT), each a real process on a real
redis-server, held open by real sockets from this test.

What is promised (jobpool/httplimits.py): a connection that sends no request, or sends one slowly, is
closed by the server within its request timeout; connections beyond a cap below the descriptor limit are
closed at once; so such clients cost neither descriptors nor threads for long, the server answers real
requests, and the supervisor's sweep goes on whatever is done to its metrics server.
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from jobpool import Pool
from jobpool.httplimits import REQUEST_TIMEOUT_SECS
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.servers import free_port

#: The descriptor limit the dashboard runs under, and more idle connections than it.
NOFILE = 128
IDLE_DASHBOARD = 160
IDLE_METRICS, SLOW_METRICS = 300, 20
#: Time to see a connection closed beyond its deadline, on a loaded machine.
MARGIN_SECS = 10.0


def get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as reply:
        reply.read()
        return int(reply.status)


def keep_alive_get(conn: http.client.HTTPConnection) -> int:
    conn.request("GET", "/api/status")
    reply = conn.getresponse()
    reply.read()
    assert reply.getheader("connection") != "close"
    return reply.status


def answers(url: str) -> bool:
    try:
        return get(url) == 200
    except OSError:  # refused, reset, closed at once: not yet
        return False


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed `sock` (end of stream or reset); it sent nothing before."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        data = sock.recv(1024)
    except ConnectionError:
        return True
    assert data == b"", f"the server answered an idle connection: {data!r}"
    return True


@contextlib.contextmanager
def connections(port: int, n: int, first_bytes: bytes = b"") -> Iterator[list[socket.socket]]:
    """`n` connections to 127.0.0.1:`port`, each having sent `first_bytes` (nothing: idle), closed after."""
    held: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            if first_bytes:
                with contextlib.suppress(ConnectionError):  # closed at once (over the cap)
                    sock.sendall(first_bytes)
            held.append(sock)
        yield held
    finally:
        for sock in held:
            sock.close()


def trickle(socks: list[socket.socket]) -> None:
    """One more byte of a header line on each open connection: a client that never finishes its request."""
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.send(b"x")


def all_closed(socks: list[socket.socket], then: list[socket.socket] | None = None) -> bool:
    if then is not None:
        trickle(then)
    return all(closed_by_server(s) for s in socks)


def open_descriptors(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


def test_idle_connections_beyond_the_descriptor_limit_do_not_stop_the_dashboard(
        spawn: Callable[..., JobpoolProcess]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/api/status"
    dash = spawn("jobpool.cli", ("dashboard", "--port", str(port)), prefix=("prlimit", f"--nofile={NOFILE}"))
    eventually(lambda: answers(url), timeout=30, message="the dashboard answering")
    # A client that behaves: keep-alive, open before the idle ones.
    with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=5)) as browser:
        assert keep_alive_get(browser) == 200
        began = time.monotonic()
        with connections(port, IDLE_DASHBOARD) as idle:
            # Beyond the cap (half the descriptors) closed at once: before any deadline could have passed.
            beyond = IDLE_DASHBOARD - NOFILE // 2
            eventually(lambda: sum(map(closed_by_server, idle)) >= beyond,
                       timeout=began + REQUEST_TIMEOUT_SECS - 0.5 - time.monotonic(),
                       message=f"{beyond} connections beyond the cap closed at once")
            # The connection open before them is served as before.
            assert keep_alive_get(browser) == 200
            # Held open by this test, never used: the dashboard answers a new request all the same, once it
            # has closed them (those beyond its cap at once, the others at their deadline).
            eventually(lambda: answers(url), timeout=REQUEST_TIMEOUT_SECS + MARGIN_SECS,
                       message=f"the dashboard answering with {IDLE_DASHBOARD} idle connections held open")
            eventually(lambda: all_closed(idle), timeout=REQUEST_TIMEOUT_SECS + MARGIN_SECS,
                       message="every idle connection closed by the dashboard")
            assert open_descriptors(dash.pid) < NOFILE // 2 + 32
            assert get(url) == 200


def test_idle_and_slow_scrapers_cost_the_supervisor_nothing_and_never_stop_its_sweep(
        pool: Pool, spawn: Callable[..., JobpoolProcess]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    sup = spawn("jobpool.cli", ("supervisor",), JOBPOOL_METRICS_PORT=str(port))
    eventually(lambda: answers(url), timeout=30, message="the supervisor serving /metrics")

    def sweeps() -> int:
        return int(pool.store.client.hget(pool.keys.metrics, "sweep_duration:count") or 0)

    before = threads(sup.pid)
    with connections(port, SLOW_METRICS, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ") as slow, \
            connections(port, IDLE_METRICS) as idle:
        swept = sweeps()
        # The sweep goes on while they are held, and they cost no thread each.
        eventually(lambda: sweeps() >= swept + 3, timeout=30, message="three more sweeps")
        assert threads(sup.pid) <= before + 8, f"{threads(sup.pid)} threads (was {before})"
        # Each closed by the server by its deadline: the slow ones though they keep sending.
        eventually(lambda: all_closed(idle + slow, then=slow), timeout=REQUEST_TIMEOUT_SECS + MARGIN_SECS,
                   message="every idle and slow connection closed by the supervisor")
        assert answers(url)
        swept = sweeps()
        eventually(lambda: sweeps() > swept, timeout=30, message="another sweep")
