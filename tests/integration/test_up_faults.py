"""`jobpool up` under the faults adversarial testing found, with real processes:

- a process of the stack dies (SIGKILL of the supervisor, then of the worker holding a job): `up` starts it
  again, says so, and the queue moves on; `status` is unhealthy while no supervisor sweeps;
- `up` is SIGKILLed and another Redis takes its port: its leftover state file is not followed, and nothing
  is written to that Redis;
- two stacks want one port (the same JOBPOOL_METRICS_PORT; the dashboard's port, taken between `up`'s
  check and its dashboard's bind): never a URL that serves another pool.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobpool import JobState, Pool
from jobpool.errors import JobTimeout
from jobpool.procid import identity_of, same_process_alive
from jobpool.up.listen import listens_on
from tests.support.polling import eventually
from tests.support.procs import children
from tests.support.servers import RedisServer, free_port
from tests.support.upstack import Stacks, Up, descendants, fast_env, get_json, redis_servers_in

IMAGE = "jobpool-test:busybox"


@pytest.fixture
def start_up(tmp_path: Path) -> Iterator[Callable[..., Up]]:
    stacks = Stacks(tmp_path)
    yield stacks.start
    stacks.close()


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")[:-1]
    except OSError:
        return []


def _child(up: Up, command: str) -> dict[str, Any] | None:
    """The identity of `up`'s child running `jobpool <command>` (after its exec), if there is one now."""
    for pid in children(up.proc.pid):
        argv = _argv(pid)
        if "jobpool.cli" in argv and argv[argv.index("jobpool.cli") + 1:][:1] == [command]:
            with contextlib.suppress(OSError):
                return identity_of(pid)
    return None


def _cli(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobpool.cli", *args], cwd=cwd, env=env or fast_env(),
                          capture_output=True, text=True, timeout=60, check=False)


def _enqueue(cwd: Path, *command: str) -> str:
    done = _cli(cwd, "--json", "enqueue", IMAGE, "--", *command)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["id"])


def _gone(idents: list[dict[str, Any]]) -> bool:
    return not [i for i in idents if same_process_alive(i) is not False]


def test_up_starts_again_a_killed_supervisor_and_the_queue_moves_on(tmp_path: Path,
                                                                    start_up: Callable[..., Up]) -> None:
    """C7: SIGKILL the supervisor, then the worker holding a job (with its horse and the job's process): the
    job must not stay `running` nor the next one `queued` until someone starts a supervisor by hand."""
    up = start_up("--workers", "1", "--slots", "1")
    state = up.ready()
    with contextlib.closing(Pool.from_url(state["redis_url"])) as pool:
        # Its first attempt runs until killed; the one the supervisor starts again ends at once.
        first = _enqueue(tmp_path, "sh", "-c", 'if [ "$JOBPOOL_ATTEMPT" = 1 ]; then exec sleep 300; fi')
        second = _enqueue(tmp_path, "true")
        eventually(lambda: pool.get(first).state == JobState.RUNNING and pool.get(first).owner_boot,
                   timeout=30, message="the first job claimed by the worker")
        supervisor = _child(up, "supervisor")
        worker = _child(up, "worker")
        assert supervisor and worker
        os.kill(supervisor["pid"], signal.SIGKILL)
        holding = [worker["pid"], *descendants(worker["pid"])]  # its work horse and the job's process
        for pid in holding:
            os.kill(pid, signal.SIGKILL)
        assert pool.get(second).state == JobState.QUEUED
        # A new supervisor sweeps: the lost attempt is run again, then the next job gets the slot.
        try:
            pool.wait(second, timeout=90, states=(JobState.SUCCEEDED,))
        except JobTimeout:
            pytest.fail(f"the queue did not move on: {pool.events(first)} {pool.events(second)} "
                        f"{(tmp_path / '.jobpool' / 'logs' / 'supervisor.log').read_text()[-3000:]}")
        assert pool.get(first).state == JobState.SUCCEEDED and pool.get(first).attempt == 2
    again = _child(up, "supervisor")
    assert again and again["pid"] != supervisor["pid"]
    # The dashboard too: started again at the URL `up` said.
    dashboard = _child(up, "dashboard")
    assert dashboard
    os.kill(dashboard["pid"], signal.SIGKILL)
    port = int(state["dashboard_url"].rsplit(":", 1)[1].strip("/"))
    eventually(lambda: (d := _child(up, "dashboard")) and d["pid"] != dashboard["pid"] and
               listens_on(d["pid"], port), timeout=60, message="a new dashboard serves the same URL")
    assert get_json(state["dashboard_url"] + "api/status")["redis"]["url"] == state["redis_url"]
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0
    said = up.stderr()
    assert f"jobpool up: dashboard exited ({-signal.SIGKILL}); starting it again" in said, said
    assert f"jobpool up: supervisor exited ({-signal.SIGKILL}); starting it again" in said, said
    assert f"jobpool up: worker-0 exited ({-signal.SIGKILL}); starting it again" in said, said


def test_up_keeps_restarting_a_supervisor_that_keeps_dying_with_a_growing_back_off(
        tmp_path: Path, start_up: Callable[..., Up]) -> None:
    """C7: a child that keeps exiting is started again after a back-off that doubles, each time said."""
    up = start_up("--workers", "1", "--no-dashboard")
    up.ready()
    pids: list[int] = []
    for _ in range(3):
        sup = eventually(lambda: (s := _child(up, "supervisor")) and s["pid"] not in pids and s, timeout=30,
                         message="a supervisor runs")
        pids.append(sup["pid"])
        os.kill(sup["pid"], signal.SIGKILL)
    eventually(lambda: (s := _child(up, "supervisor")) and s["pid"] not in pids, timeout=30,
               message="a fourth supervisor runs")
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0
    said = [line for line in up.stderr().splitlines() if "supervisor exited" in line]
    assert [line.split("starting it again")[1].split(" (its log")[0] for line in said] == \
        [" in 1 s", " in 2 s", " in 4 s"], said


def test_status_is_unhealthy_while_no_supervisor_sweeps(tmp_path: Path, start_up: Callable[..., Up]) -> None:
    """C7: a supervisor that does not sweep (stopped: `up` cannot see it die) makes `status` unhealthy, from
    the age of the last sweep; swept again, healthy."""
    up = start_up("--workers", "1", "--slots", "1", "--no-dashboard")
    up.ready()
    eventually(lambda: _cli(tmp_path, "status").returncode == 0, timeout=30, message="status healthy")
    supervisor = _child(up, "supervisor")
    assert supervisor
    os.kill(supervisor["pid"], signal.SIGSTOP)
    try:
        status = eventually(lambda: (s := _cli(tmp_path, "status")).returncode == 1 and s, timeout=30,
                            message="status unhealthy")
        assert "no live supervisor: the last sweep was" in status.stdout, status.stdout
    finally:
        os.kill(supervisor["pid"], signal.SIGCONT)
    eventually(lambda: _cli(tmp_path, "status").returncode == 0, timeout=30, message="status healthy again")
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0


def test_a_state_file_naming_another_redis_than_its_stacks_is_not_followed(
        tmp_path: Path, start_up: Callable[..., Up], redis_server_factory: Callable[[], RedisServer]) -> None:
    """C8: a state file naming a live `up` but a Redis that is not the one it started (its stack id is not
    there) is refused in one line, and nothing is written to that Redis; the stack's own file is followed."""
    up = start_up("--workers", "1", "--no-dashboard")
    state = up.ready()
    # A copy of the live stack's file, its URL pointed at another Redis: `up` lives, that Redis is not its.
    elsewhere = redis_server_factory()
    elsewhere.start()
    other_dir = tmp_path / "elsewhere"
    (other_dir / ".jobpool").mkdir(parents=True)
    (other_dir / ".jobpool" / "up.json").write_text(json.dumps({**state, "redis_url": elsewhere.url}))
    refused = _cli(other_dir, "enqueue", IMAGE, "--", "true")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "is gone (the Redis at" in refused.stderr and "is not the one it started" in refused.stderr
    with contextlib.closing(redis.Redis.from_url(elsewhere.url)) as other:
        assert other.dbsize() == 0
    # The stack's own directory follows it.
    assert _cli(tmp_path, "status").returncode in (0, 1)
    assert _cli(tmp_path, "enqueue", IMAGE, "--", "true").returncode == 0
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0


def test_a_state_file_whose_stack_is_gone_is_not_followed(
        tmp_path: Path, start_up: Callable[..., Up], redis_server_factory: Callable[[], RedisServer]) -> None:
    """C8: `up` SIGKILLed leaves its state file; once another Redis listens on its port, a command in that
    directory says in one line that the stack is gone, fails, and writes nothing to that Redis."""
    up = start_up("--workers", "1", "--no-dashboard")
    state = up.ready()
    port = int(state["redis_url"].rsplit(":", 1)[1].split("/")[0])
    stack = up.snapshot()
    up.proc.kill()
    up.proc.wait(10)
    eventually(lambda: _gone(stack), timeout=45, message="every process of the stack is gone")
    assert up.state_file.exists()
    foreign = redis_server_factory()
    foreign._port = port  # the port the dead stack's file names (RedisServer keeps a restart's)
    foreign.start()
    with contextlib.closing(redis.Redis.from_url(foreign.url)) as other:
        for args in (("enqueue", IMAGE, "--", "true"), ("status",), ("pause",), ("ls",)):
            done = _cli(tmp_path, *args)
            assert done.returncode == 2, (args, done.stdout)
            err = done.stderr.strip()
            assert len(err.splitlines()) == 1 and "is gone (its `up` process" in err, (args, err)
            assert str(up.state_file) in err
        assert other.dbsize() == 0, other.keys()
    # A new `up` is not stopped by the file (it replaces it).
    again = start_up("--workers", "1", "--no-dashboard", name="again")
    assert again.ready()["stack_id"] != state["stack_id"]
    again.proc.send_signal(signal.SIGINT)
    assert again.proc.wait(60) == 0


def test_two_ups_given_the_same_metrics_port(tmp_path: Path, start_up: Callable[..., Up]) -> None:
    """C9: the second `up` stops with one line naming the port; it never says (or records) a metrics URL
    that serves the first stack's pool."""
    port = free_port()
    env = {**fast_env(), "JOBPOOL_METRICS_PORT": str(port)}
    first = start_up("--workers", "1", "--no-dashboard", env=env)
    state = first.ready()
    assert state["metrics_url"] == f"http://127.0.0.1:{port}/metrics"
    other = Stacks(tmp_path / "b")
    (tmp_path / "b").mkdir()
    try:
        second = other.start("--workers", "1", "--no-dashboard", name="second", env=env)
        eventually(lambda: second.proc.poll() is not None or second.state_file.exists(), timeout=90,
                   message="the second up stopped or came up")
        assert not second.state_file.exists(), f"it came up on a port the first stack serves: {second.log()}"
        assert second.proc.wait(30) != 0
        err = second.stderr().strip()
        assert len(err.splitlines()) == 1 and f"JOBPOOL_METRICS_PORT: port {port}" in err, err
        assert f":{port}/metrics" not in second.log()
        eventually(lambda: not redis_servers_in(tmp_path / "b" / ".jobpool" / "redis"), timeout=30,
                   message="the second up's Redis is gone")
    finally:
        other.close()
    supervisor = _child(first, "supervisor")
    assert supervisor and listens_on(supervisor["pid"], port), "the first stack still serves its metrics"
    first.proc.send_signal(signal.SIGINT)
    assert first.proc.wait(60) == 0


class _OtherPool(http.server.BaseHTTPRequestHandler):
    """Another process on the dashboard's port: what a URL to it would show."""

    def do_GET(self) -> None:  # http.server's name
        body = json.dumps({"pool": "another stack's"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


def test_a_dashboard_port_taken_before_the_dashboard_binds_it(tmp_path: Path,
                                                              start_up: Callable[..., Up]) -> None:
    """C9: `up` found the port free, then another process took it before its dashboard bound it (two `up`s
    racing for the default port). `up` says a URL on another port, served by its own dashboard."""
    wanted = free_port()
    up = start_up("--workers", "1", "--dashboard-port", str(wanted))
    # Catch the dashboard between its exec and its bind (it imports for a good while first), hold it there,
    # and take its port.
    dashboard = eventually(lambda: _child(up, "dashboard"), timeout=60, interval=0.002,
                           message="up started its dashboard")
    os.kill(dashboard["pid"], signal.SIGSTOP)
    if listens_on(dashboard["pid"], wanted):
        os.kill(dashboard["pid"], signal.SIGCONT)
        pytest.fail("the dashboard bound its port before the test could take it")
    taker = _serve_other_pool(wanted)
    with _serving(taker):
        os.kill(dashboard["pid"], signal.SIGCONT)
        state = up.ready()
        url = state["dashboard_url"]
        assert url != f"http://127.0.0.1:{wanted}/", "its URL serves another process's pages"
        assert f"dashboard: {url}" in up.log()
        port = int(url.rsplit(":", 1)[1].strip("/"))
        mine = _child(up, "dashboard")
        assert mine and listens_on(mine["pid"], port)
        status = eventually(lambda: get_json(url + "api/status"), timeout=30,
                            message="its dashboard answers")
        assert status["redis"]["url"] == state["redis_url"]
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0
    said = up.stderr()
    assert f"dashboard: port {wanted} was taken by another process meanwhile; taking {port}" in said, said


def test_redis_killed_comes_back_with_its_jobs(tmp_path: Path, start_up: Callable[..., Up]) -> None:
    """C7: Redis is a process `up` owns too: SIGKILLed, it comes back on its port from its AOF (its guard
    starts it again), and the pool goes on."""
    up = start_up("--workers", "1", "--no-dashboard")
    state = up.ready()
    with contextlib.closing(Pool.from_url(state["redis_url"])) as pool:
        before = _enqueue(tmp_path, "true")
        assert pool.wait(before, timeout=60).state == JobState.SUCCEEDED
    # Redis writes its AOF before it replies (fsync is every second, but a killed process loses nothing the
    # kernel has): what was answered survives.
    os.kill(state["redis_pid"], signal.SIGKILL)
    fresh = eventually(lambda: (s := json.loads(up.state_file.read_text())) and
                       s["redis_pid"] != state["redis_pid"] and s, timeout=60, message="redis started again")
    with contextlib.closing(Pool.from_url(state["redis_url"])) as pool:
        assert pool.store.client.info("server")["process_id"] == fresh["redis_pid"]
        assert pool.get(before).state == JobState.SUCCEEDED
        after = _enqueue(tmp_path, "true")
        assert pool.wait(after, timeout=60).state == JobState.SUCCEEDED
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0
    said = up.stderr()
    assert "jobpool up: redis-server exited (" in said and "starting it again" in said, said


def test_two_ups_started_at_once_on_one_dashboard_port(tmp_path: Path) -> None:
    """C9: two `up`s started at once both find the dashboard's port free; each ends with a URL served by its
    own dashboard, showing its own pool."""
    wanted = free_port()
    both = [Stacks(tmp_path / name) for name in ("a", "b")]
    try:
        ups = []
        for stacks in both:
            stacks.cwd.mkdir()
            ups.append(stacks.start("--workers", "1", "--dashboard-port", str(wanted)))
        states = [up.ready() for up in ups]
        urls = [s["dashboard_url"] for s in states]
        assert urls[0] != urls[1], urls
        for up, state in zip(ups, states, strict=True):
            port = int(state["dashboard_url"].rsplit(":", 1)[1].strip("/"))
            mine = _child(up, "dashboard")
            assert mine and listens_on(mine["pid"], port), (state["dashboard_url"], up.log())
            status = eventually(lambda u=state["dashboard_url"]: get_json(u + "api/status"), timeout=30,
                                message="its dashboard answers")
            assert status["redis"]["url"] == state["redis_url"]
        for up in ups:
            up.proc.send_signal(signal.SIGINT)
        assert [up.proc.wait(60) for up in ups] == [0, 0]
    finally:
        for stacks in both:
            stacks.close()


def test_a_dashboard_whose_port_was_taken_while_it_was_down_moves(tmp_path: Path,
                                                                  start_up: Callable[..., Up]) -> None:
    """C7 and C9: the dashboard dies and another process takes its port before it is started again: `up`
    starts it on another port, says the new URL and records it, never leaving the old one (another
    process's) as its own."""
    up = start_up("--workers", "1", "--dashboard-port", "0")
    state = up.ready()
    old = int(state["dashboard_url"].rsplit(":", 1)[1].strip("/"))
    dashboard = _child(up, "dashboard")
    assert dashboard
    os.kill(dashboard["pid"], signal.SIGKILL)
    taker = eventually(lambda: _serve_other_pool(old), timeout=10, ignoring=(OSError,),
                       message="the test took the dead dashboard's port")
    with _serving(taker):
        moved = eventually(lambda: (s := json.loads(up.state_file.read_text()))["dashboard_url"] !=
                           state["dashboard_url"] and s, timeout=60, message="the dashboard moved")
        port = int(moved["dashboard_url"].rsplit(":", 1)[1].strip("/"))
        mine = eventually(lambda: (d := _child(up, "dashboard")) and listens_on(d["pid"], port) and d,
                          timeout=60, message="the new dashboard serves the new URL")
        assert mine["pid"] != dashboard["pid"]
        assert get_json(moved["dashboard_url"] + "api/status")["redis"]["url"] == state["redis_url"]
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0
    said = up.stderr()
    assert f"dashboard: port {old} is taken by another process; moving to port {port}" in said, said
    assert f"dashboard: {moved['dashboard_url']}" in said, said


@contextlib.contextmanager
def _serving(server: http.server.ThreadingHTTPServer) -> Iterator[None]:
    """`server` answering from a thread for the block; shut and closed after it."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _serve_other_pool(port: int) -> http.server.ThreadingHTTPServer:
    return http.server.ThreadingHTTPServer(("127.0.0.1", port), _OtherPool)
