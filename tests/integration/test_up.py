"""`jobpool up` as a real process: it comes up, runs a job, is visible to RQ's own CLI, and Ctrl-C (SIGINT)
stops everything it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from polling import eventually
from procs import children

from jobpool import JobState, Pool

IMAGE = "jobpool-test:busybox"


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("executor", ["docker", "subprocess"])
def test_up_runs_a_job_and_ctrl_c_leaves_nothing(tmp_path: Path, docker_host: str, executor: str) -> None:
    env = {**os.environ, "JOBPOOL_SWEEP_INTERVAL_SECS": "1", "JOBPOOL_HEARTBEAT_SECS": "0.5",
           "JOBPOOL_LEASE_SECS": "2"}
    env.pop("JOBPOOL_REDIS_URL", None)
    log = open(tmp_path / "up.log", "wb")
    up = subprocess.Popen([sys.executable, "-m", "jobpool.cli", "up", "--workers", "2", "--slots", "1",
                           "--executor", executor], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        state_file = tmp_path / ".jobpool" / "up.json"
        state = eventually(lambda: state_file.exists() and json.loads(state_file.read_text()), timeout=30,
                           message="up wrote its state file")
        out = eventually(lambda: "Ctrl-C drains" in (log_text := (tmp_path / "up.log").read_text()) and log_text,
                         timeout=10, message="up announced itself")
        assert state["redis_url"] in out and f"executor: {executor}" in out
        # Another shell in the same directory finds it with no flags.
        enq = subprocess.run([sys.executable, "-m", "jobpool.cli", "--json", "enqueue", IMAGE, "--",
                              "sh", "-c", "echo hello from up"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=30)
        assert enq.returncode == 0, enq.stderr
        job_id = json.loads(enq.stdout)["id"]
        pool = Pool.from_url(state["redis_url"])
        assert pool.wait(job_id, timeout=60).state == JobState.SUCCEEDED
        assert "hello from up" in pool.logs(job_id)
        # RQ's own CLI, a real client of our keys, sees the pool's queue and its workers.
        info = subprocess.run(["rq", "info", "--url", state["redis_url"]], capture_output=True, text=True,
                              timeout=30)
        assert info.returncode == 0, info.stderr
        assert "jobpool-default" in info.stdout and "2 workers" in info.stdout.replace("\n", " ")
        # A second `up` on the same state directory refuses.
        again = subprocess.run([sys.executable, "-m", "jobpool.cli", "up"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=30)
        assert again.returncode == 1 and "already running" in again.stderr
        started = _descendants(up.pid)
        assert len(started) >= 4, "redis, supervisor and two workers"
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0
        eventually(lambda: not [p for p in started if _alive(p)], timeout=15,
                   message="every process up started is gone")
        assert not state_file.exists()
    finally:
        if up.poll() is None:
            for p in _descendants(up.pid):
                os.kill(p, signal.SIGKILL)
            up.kill()
            up.wait(10)
        log.close()
