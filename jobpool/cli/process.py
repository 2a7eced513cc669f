"""The process commands: `worker`, `supervisor`, `dashboard` and `up`, each a thin wiring to its package.

Their packages import lazily (`load`), so the admin commands work (and start fast) without them; a build
without one says so in one line.
"""

from __future__ import annotations

from typing import Any

import click

from ..config import Settings
from ..contract import MAX_SLOTS
from .app import CliState, load, pool_command


def _log_to_stderr() -> None:
    """The long-running commands log their decisions (sweep summaries, drains, verdicts) to stderr."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _finish(rc: Any) -> None:
    if isinstance(rc, int) and not isinstance(rc, bool) and rc != 0:
        click.get_current_context().exit(rc)


@click.command()
@click.option("--burst", is_flag=True, help="Exit once the queue is empty.")
@pool_command
def worker(state: CliState, burst: bool) -> None:
    """Run one worker process (SIGTERM drains it)."""
    run = load("jobpool.workers", "run_worker", "the worker")
    _log_to_stderr()
    run(state.settings(), burst=burst)  # returns how many jobs a drain left running: logged, not an error


@click.command()
@click.option("--once", is_flag=True, help="Sweep once (reconcile, then promote) and exit.")
@pool_command
def supervisor(state: CliState, once: bool) -> None:
    """Run the sweep loop: reconcile, then promote, every JOBPOOL_SWEEP_INTERVAL_SECS."""
    run = load("jobpool.supervisor", "run_supervisor", "the supervisor")
    _log_to_stderr()
    _finish(run(state.settings(), once=once))


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, metavar="ADDR",
              help="Address to listen on (loopback by default: the pages show the whole pool).")
@click.option("--port", type=click.IntRange(1, 65535), default=8765, show_default=True, help="Port.")
@pool_command
def dashboard(state: CliState, host: str, port: int) -> None:
    """Serve the live web dashboard: read-only unless JOBPOOL_DASHBOARD_TOKEN is set (actions need it)."""
    run = load("jobpool.dashboard", "run_dashboard", "the dashboard")
    _log_to_stderr()
    _finish(run(state.settings(), host=host, port=port))


@click.command()
@click.option("--workers", type=click.IntRange(1, 256), default=2, show_default=True,
              help="Worker processes.")
@click.option("--slots", type=click.IntRange(0, MAX_SLOTS), default=None,
              help="Fleet-wide limit [default: workers].")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None,
              help="Where Redis data and the state file live [default: JOBPOOL_STATE_DIR or ./.jobpool].")
@click.option("--executor", type=click.Choice(["auto", "docker", "subprocess"]), default="auto",
              show_default=True, help="auto: Docker when a daemon answers, else subprocess (which ends every "
              "process of a job with it only where it can give the job a cgroup v2: `up` says when not).")
@click.option("--dashboard-port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="The dashboard's port on 127.0.0.1 (taken, even while the dashboard starts: any free "
                   "one, said; 0: any free one).")
@click.option("--no-dashboard", is_flag=True, help="Serve no dashboard.")
@pool_command
def up(state: CliState, workers: int, slots: int | None, state_dir: str | None, executor: str,
       dashboard_port: int, no_dashboard: bool) -> None:
    """Run a private Redis, a supervisor, N workers and the dashboard on this machine, starting again any
    that exits (with back-off); Ctrl-C drains and stops them. Metrics are served on JOBPOOL_METRICS_PORT (in
    use by another process: `up` stops), else on a free port. Other shells in this directory find it through
    the state file while it runs."""
    run = load("jobpool.up.stack", "run_up", "`jobpool up`")
    # Not from the state file: `up` starts its own Redis, and a file an earlier `up` left must not stop it.
    settings = Settings.from_env(redis_url=state.redis_url, pool=state.pool_name, follow_up=False)
    _finish(run(settings, workers=workers, slots=slots, state_dir=state_dir, executor=executor,
                dashboard_port=None if no_dashboard else dashboard_port))


COMMANDS = (worker, supervisor, dashboard, up)
