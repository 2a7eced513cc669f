"""The process commands of the CLI: `worker`, `supervisor`, `up`, and the operator's `reconcile`.

Their packages import lazily, so the admin commands work (and start fast) without them; a build without
one says so in one line.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import click

from .cli import CliState, Failure, cli, pool_command
from .cli_format import decisions_table


def _log_to_stderr() -> None:
    """The long-running commands log their decisions (sweep summaries, drains, verdicts) to stderr."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _load(module: str, name: str, what: str) -> Callable[..., Any]:
    try:
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
    except (ImportError, AttributeError) as exc:
        raise Failure(f"{what} is not available in this build ({exc})") from None


def _finish(rc: Any) -> None:
    if isinstance(rc, int) and not isinstance(rc, bool) and rc != 0:
        click.get_current_context().exit(rc)


@cli.command()
@click.option("--evict-stale", is_flag=True, help="Also stop and fail live jobs past the stale limit.")
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@pool_command
def reconcile(state: CliState, evict_stale: bool, dry_run: bool) -> None:
    """Reconcile running rows against ground truth once (the operator's sweep)."""
    run = _load("jobpool.supervisor", "reconcile", "reconcile")
    report = run(state.pool(), evict_stale=evict_stale, dry_run=dry_run)
    doc = report.to_dict()
    state.emit(doc, lambda: report.line() + ("\n" + decisions_table(doc["decisions"])
                                               if doc["decisions"] else ""))


@cli.command()
@click.option("--burst", is_flag=True, help="Exit once the queue is empty.")
@pool_command
def worker(state: CliState, burst: bool) -> None:
    """Run one worker process (SIGTERM drains it)."""
    run = _load("jobpool.workers", "run_worker", "the worker")
    _log_to_stderr()
    run(state.settings(), burst=burst)  # returns how many jobs a drain left running: logged, not an error


@cli.command()
@click.option("--once", is_flag=True, help="Sweep once (reconcile, then promote) and exit.")
@pool_command
def supervisor(state: CliState, once: bool) -> None:
    """Run the sweep loop: reconcile, then promote, every JOBPOOL_SWEEP_INTERVAL_SECS."""
    run = _load("jobpool.supervisor", "run_supervisor", "the supervisor")
    _log_to_stderr()
    _finish(run(state.settings(), once=once))


@cli.command()
@click.option("--workers", type=click.IntRange(1, 256), default=2, show_default=True,
              help="Worker processes.")
@click.option("--slots", type=click.IntRange(0, 100_000), default=None,
              help="Fleet-wide limit [default: workers].")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None,
              help="Where Redis data and the state file live [default: JOBPOOL_STATE_DIR or ./.jobpool].")
@click.option("--executor", type=click.Choice(["auto", "docker", "subprocess"]), default="auto",
              show_default=True, help="auto: Docker when a daemon answers, else subprocess.")
@pool_command
def up(state: CliState, workers: int, slots: int | None, state_dir: str | None, executor: str) -> None:
    """Run a private Redis, a supervisor and N workers on this machine; Ctrl-C drains and stops them."""
    run = _load("jobpool.up", "run_up", "`jobpool up`")
    _finish(run(state.settings(), workers=workers, slots=slots, state_dir=state_dir, executor=executor))


