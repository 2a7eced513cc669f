"""The pool commands: `slots`, `limit`, `status`, `events`, and the operator's `reconcile`, `prune`,
`forget-daemon`, `forget-collision` and `migrate`."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ..contract import EVENTS_MAXLEN, MAX_LIMIT, MAX_SLOTS
from ..fleet.gone import forget_daemon, unforget_daemon
from ..fleet.markrecords import forget_collision
from .app import CliState, load, pool_command
from .format import decisions_table, event_json, event_line, status_report


@click.command(context_settings={"ignore_unknown_options": True})  # so `slots -1` reaches the range check
@click.argument("n", type=click.IntRange(0, MAX_SLOTS), required=False)
@pool_command
def slots(state: CliState, n: int | None) -> None:
    """Show the fleet-wide limit (used/max), or set it to N. Lowering it stops nothing that runs."""
    pool = state.pool()
    previous = pool.set_slots(n) if n is not None else None
    used, mx = pool.slots()
    doc: dict[str, Any] = {"used": used, "max": mx}
    if previous is not None:
        doc["previous"] = previous
    state.emit(doc, lambda: f"{used}/{mx}" + (f"  (was {previous})" if previous is not None else ""))


@click.command(context_settings={"ignore_unknown_options": True})  # so `limit gpu -1` reaches the check
@click.argument("name", required=False, metavar="NAME")
@click.argument("n", type=click.IntRange(0, MAX_LIMIT), required=False, metavar="N")
@click.option("--remove", is_flag=True, help="Remove limit NAME (a job using a name no limit covers waits).")
@pool_command
def limit(state: CliState, name: str | None, n: int | None, remove: bool) -> None:
    """List the named limits (size and use), or set limit NAME to N units, or remove it (--remove).

    NAME is a name or a prefix and '*' (`dataset:*`: every name under it gets a limit of N of its own). A job
    holds units of the names it uses (`enqueue --uses NAME[=AMOUNT]`) while it runs. Lowering a limit stops
    nothing that runs: new starts wait.
    """
    pool = state.pool()
    if name is None:
        if n is not None or remove:
            raise click.UsageError("NAME is needed to set or remove a limit")
        uses = pool.limits()
        state.emit([{"name": u.name, "max": u.size, "used": u.used} for u in uses],
                   lambda: "\n".join(f"{u.name}  {u.used}/{u.size}" for u in uses) or "no limits")
        return
    if remove:
        if n is not None:
            raise click.UsageError("--remove takes no N")
        old = pool.remove_limit(name)
        state.emit({"name": name, "removed": True, "previous": old}, lambda: f"removed {name} (was {old})")
        return
    if n is None:
        found = [u for u in pool.limits() if u.name == name]
        if not found:
            raise click.ClickException(f"no limit {name} (jobpool limit {name} N sets one)")
        u = found[0]
        state.emit({"name": u.name, "max": u.size, "used": u.used}, lambda: f"{u.name}  {u.used}/{u.size}")
        return
    previous = pool.set_limit(name, n)
    state.emit({"name": name, "max": n, "previous": previous},
               lambda: f"{name} = {n}" + (f"  (was {previous})" if previous is not None else "  (new)"))


@click.command()
@pool_command
def status(state: CliState) -> None:
    """Slots, queue, workers and the supervisor; exits 1 when the pool is unhealthy.

    Each worker is listed with the first 10 of its running jobs and how many it runs (`jobs` and `running`
    in --json): a worker runs one job at a time, more only when it adopted others. The read costs what the
    workers and daemons are, not what runs."""
    report = state.pool().status()
    state.emit(report.to_dict(), lambda: status_report(report))
    if not report.healthy:
        click.get_current_context().exit(1)


def _print_event(state: CliState, entry: dict[str, str]) -> None:
    doc = event_json(entry)
    click.echo(json.dumps(doc, sort_keys=True) if state.as_json else event_line(doc))
    sys.stdout.flush()  # an event as it comes, into a pipe or a file too


@click.command()
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new events until Ctrl-C (JSON lines with --json).")
@click.option("--job", "job_id", metavar="JOB", help="Only this job's events.")
@click.option("--count", type=click.IntRange(0, EVENTS_MAXLEN), default=20, show_default=True,
              help="How many of the newest events to show first.")
@pool_command
def events(state: CliState, follow: bool, job_id: str | None, count: int) -> None:
    """Job transitions (and queue pauses), oldest first."""
    pool = state.pool()
    if job_id is not None:
        pool.get(job_id)  # an unknown job is an error, not an empty stream
    backlog, newest = pool.tail_events(job_id, count)
    if not follow:
        if state.as_json:
            state.emit([event_json(e) for e in backlog], lambda: None)
        elif backlog:
            click.echo("\n".join(event_line(event_json(e)) for e in backlog))
        else:
            click.echo("no events", err=True)
        return
    try:
        for entry in backlog:
            _print_event(state, entry)
        for entry in pool.follow_events(job_id, after=newest):
            _print_event(state, entry)
    except KeyboardInterrupt:
        return  # Ctrl-C is how a follow ends: exit 0, no "Aborted!"


@click.command()
@click.option("--evict-stale", is_flag=True, help="Also stop and fail live jobs past the stale limit.")
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@pool_command
def reconcile(state: CliState, evict_stale: bool, dry_run: bool) -> None:
    """Reconcile running rows against ground truth once (the operator's sweep)."""
    run = load("jobpool.supervisor", "reconcile", "reconcile")
    report = run(state.pool().store, evict_stale=evict_stale, dry_run=dry_run)
    doc = report.to_dict()
    state.emit(doc, lambda: report.line() + ("\n" + decisions_table(doc["decisions"])
                                               if doc["decisions"] else ""))


#: Ids `prune` prints per state (--json has them all).
SHOWN_IDS = 100


@click.command()
@click.option("--dry-run", is_flag=True, help="Count what would go (listing the first); remove nothing.")
@pool_command
def prune(state: CliState, dry_run: bool) -> None:
    """Remove finished jobs past retention now, with everything they left.

    Each terminal state keeps its newest JOBPOOL_KEEP_<STATE> jobs and none older than
    JOBPOOL_KEEP_<STATE>_SECS (0 turns a cap off); the supervisor does the same a little each sweep.
    Queued, running and paused jobs are never touched."""
    report = state.pool().prune(dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"

    def text() -> str:
        lines = [f"{s}: {verb} {report.counts[s]} (keeping {report.caps[s]})" for s in report.caps]
        for s in report.caps:
            lines += [f"  {s} {i}" for i in report.ids[s][:SHOWN_IDS]]
            if len(report.ids[s]) > SHOWN_IDS:
                lines.append(f"  ... and {len(report.ids[s]) - SHOWN_IDS} more {s} (--json lists them all)")
        return "\n".join(lines)
    state.emit(report.to_dict(), text)


@click.command("forget-daemon")
@click.argument("daemon_id", metavar="DAEMON_ID")
@click.option("--note", default="", help="Why, kept with the declaration (e.g. the ticket).")
@click.option("--undo", is_flag=True,
              help="Withdraw the declaration instead: its jobs are judged from its own inventory again.")
@pool_command
def forget_daemon_command(state: CliState, daemon_id: str, note: str, undo: bool) -> None:
    """Declare a Docker daemon gone for good (its host destroyed): the jobs recorded on it run again.

    DAEMON_ID is a job's daemon_id as `jobpool show JOB` prints it (`status` names it too, with this command,
    for daemons holding slots on stale evidence). Refused while that daemon's workers still publish its
    inventory, and for an id neither published within a week nor recorded on a running job. Only for a
    daemon that will never run its containers again: one that comes back may run them beside their new
    attempts. A daemon that publishes again lifts the declaration itself (`status` then names it for a week);
    --undo withdraws it by hand."""
    if undo:
        at = unforget_daemon(state.pool(), daemon_id, actor="cli", note=note)
        state.emit({"daemon_id": daemon_id, "at": at, "undone": True},
                   lambda: f"daemon {daemon_id} no longer declared gone; its jobs are judged from its own "
                           "inventory again")
        return
    at = forget_daemon(state.pool(), daemon_id, actor="cli", note=note)
    state.emit({"daemon_id": daemon_id, "at": at},
               lambda: f"daemon {daemon_id} declared gone; the next sweeps judge its jobs absent")


@click.command("forget-collision")
@click.argument("daemon_id", metavar="DAEMON_ID")
@click.option("--note", default="", help="What was fixed, kept in the pool's events (e.g. the ticket).")
@pool_command
def forget_collision_command(state: CliState, daemon_id: str, note: str) -> None:
    """Clear the report that two Docker daemons share identity DAEMON_ID, once fixed.

    Two daemons on one kernel with one identity (a data root copied onto a second daemon) are reported by
    the processes that compare their marks, and the report stands, whatever becomes of those processes:
    no worker on that identity claims, publishes or stops anything, and no supervisor judges a job recorded
    on it (`status` names it, unhealthy). Fix it first: give one of the daemons an identity of its own
    (remove its `jobpool-daemon-identity` volume while no job runs there, restart its jobpool processes);
    then clear it. A collision still there is found and reported again. Refused for an identity with no
    standing report."""
    at = forget_collision(state.pool(), daemon_id, actor="cli", note=note)
    state.emit({"daemon_id": daemon_id, "at": at},
               lambda: f"collision on daemon identity {daemon_id} cleared; its workers claim again once "
                       "their marks agree")


@click.command()
@click.option("--dry-run", is_flag=True, help="Say what it would do; change nothing.")
@pool_command
def migrate(state: CliState, dry_run: bool) -> None:
    """Bring the pool's Redis to the layout of keys and rows this jobpool writes.

    Run it once per pool when the CHANGELOG says an upgrade needs it, after the supervisors are upgraded
    (docs/architecture.md, "Upgrades"). Idempotent and resumable: run again, it does nothing more, and one
    that stopped part way resumes. A pool newer than this jobpool is refused, unchanged."""
    from ..migrate import migrate as run  # here: no other command needs it

    done = run(state.pool().store, dry_run=dry_run)
    state.emit(done.to_dict(), done.line)


COMMANDS = (slots, limit, status, events, reconcile, prune, forget_daemon_command,
            forget_collision_command, migrate)
