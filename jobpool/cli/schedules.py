"""The schedule commands: `jobpool schedule` (the list), `schedule add`, `schedule rm`, `schedule pause` and
`schedule resume` (jobpool/schedules.py; docs/architecture.md, "Schedules").

`schedule add` takes the spec options of `enqueue` (cli/jobs.py), its time limit and retries included, as the
very same option objects, so a flag and its help are defined once; the options of what a job waits for
(`--at`, `--in`, `--after`, `--coalesce`, `--from-file`) are not a schedule's: a tick's job is queued at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from ..schedules import MISFIRES, OVERLAPS, Schedule, check_name, check_timing
from ..spec import build_spec
from .app import CliState, pool_command
from .durations import duration_option, format_duration
from .format import clock, table
from .jobs import TimeOptions, enqueue

#: `enqueue`'s options that `schedule add` shares, by parameter name (cli/jobs.py).
SPEC_OPTIONS = ("env", "workdir", "user", "memory", "cpus", "labels", "no_init", "no_checkpoint", "priority",
                "weight", "uses", "group", "timeout", "retries", "retry_delay", "retry_on")


class _NameFirst(click.Command):
    """`schedule add NAME [options] IMAGE COMMAND...`: NAME comes before the options, and everything after
    IMAGE is the command (no option is read there, as with `enqueue`). Click reads options only before the
    first argument when arguments may not be interspersed, so NAME is moved to just after the options."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and not args[0].startswith("-"):
            rest = args[1:]
            at = _options_end(self, rest)
            at += rest[at:at + 1] == ["--"]  # after a `--` that ends the options, as click reads it
            args = [*rest[:at], args[0], *rest[at:]]
        return super().parse_args(ctx, args)


def _options_end(command: click.Command, args: Sequence[str]) -> int:
    """Where the options at the start of `args` end: the first argument that is neither an option nor an
    option's value."""
    takes_value = {name for p in command.params if isinstance(p, click.Option) and not p.is_flag
                   and not p.count for name in (*p.opts, *p.secondary_opts)}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return i
        if not arg.startswith("-") or arg == "-":
            return i
        i += 2 if arg in takes_value else 1
    return i


def _when(s: Schedule) -> str:
    if s.every is not None:
        return "every " + format_duration(s.every)
    return f"{s.cron}" + ("" if s.tz == "UTC" else f" ({s.tz})")


def _schedules_table(schedules: list[Schedule]) -> str:
    if not schedules:
        return "no schedules"
    rows = [[s.name, _when(s), "paused" if s.paused else "active", clock(s.last_fire), s.last_job or "-",
             clock(s.next_fire)] for s in schedules]
    return table(["NAME", "WHEN", "STATE", "LAST FIRE", "LAST JOB", "NEXT FIRE"], rows)


@click.group("schedule", invoke_without_command=True)
@pool_command
def schedule(state: CliState) -> None:
    """List the schedules (with no subcommand), or add, remove, pause or resume one.

    A schedule makes a job at each tick of a cron expression or every interval; the supervisors fire each
    tick once, however many run.
    """
    if click.get_current_context().invoked_subcommand is None:
        _list(state)


@schedule.command("ls")
@pool_command
def ls_(state: CliState) -> None:
    """List the schedules: when each ticks, its last fire and job, its next fire."""
    _list(state)


def _list(state: CliState) -> None:
    found = state.pool().schedules()
    state.emit([s.to_dict() for s in found], lambda: _schedules_table(found))


@schedule.command("add", cls=_NameFirst, context_settings={"allow_interspersed_args": False})
@click.option("--cron", metavar="EXPR",
              help="Tick at these times: a cron expression (5 fields; a 6th is seconds), in --tz.")
@click.option("--every", callback=duration_option(1), metavar="DURATION",
              help="Tick every DURATION (90s, 10m, 2h), on its multiples since the epoch.")
@click.option("--tz", default="UTC", show_default=True, metavar="ZONE",
              help="The time zone of --cron (an IANA name: Europe/Paris).")
@click.option("--misfire", type=click.Choice(MISFIRES), default="once", show_default=True,
              help="Ticks missed while no supervisor ran: fire the latest once, or skip them all.")
@click.option("--overlap", type=click.Choice(OVERLAPS), default="skip", show_default=True,
              help="A tick while the last job still waits or runs: make no job (skip), or one (queue).")
@click.option("--replace", is_flag=True, help="Replace the schedule NAME if there is one.")
@click.argument("name", metavar="NAME")
@click.argument("image", metavar="IMAGE")
@click.argument("command", nargs=-1, required=True, metavar="COMMAND...")
@pool_command
def add(state: CliState, name: str, image: str, command: tuple[str, ...], cron: str | None, every: int | None,
        tz: str, misfire: str, overlap: str, replace: bool, **shared: Any) -> None:
    """Add schedule NAME: a job running IMAGE with COMMAND at each tick (--cron or --every).

    Options go between NAME and IMAGE: everything after IMAGE is the command (a `--` there is optional). The
    first tick is the first after now.
    """
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise click.UsageError("missing the command to run after IMAGE")
    times = TimeOptions(shared["timeout"], shared["retries"], shared["retry_delay"], shared["retry_on"], None,
                        None, ())
    times.check(False)
    fields = {**_spec_fields(shared), **times.spec_fields(), "image": image, "command": list(command)}
    # Refused before connecting, as enqueue refuses a bad spec.
    check_name(name)
    check_timing(cron, every, tz)
    build_spec(fields, state.settings().bind_roots)
    made = state.pool().add_schedule(name, cron=cron, every=every, tz=tz, misfire=misfire, overlap=overlap,
                                     replace=replace, **fields)
    state.emit(made.to_dict(), lambda: f"{made.name}: {_when(made)}, next fire {clock(made.next_fire)}"
               + (" (paused)" if made.paused else ""))


def _spec_fields(shared: dict[str, Any]) -> dict[str, Any]:
    """The spec fields of `enqueue`'s shared options but its time options (as cli/jobs.py's `enqueue` makes
    them)."""
    fields: dict[str, Any] = {"env": shared["env"], "labels": shared["labels"]}
    fields.update({k: shared[p] for k, p in (("workdir", "workdir"), ("user", "user"), ("memory", "memory"),
                                             ("cpus", "cpus"), ("priority", "priority"), ("slots", "weight"),
                                             ("group", "group")) if shared[p] is not None})
    if shared["uses"]:
        fields["uses"] = shared["uses"]
    if shared["no_init"]:
        fields["init"] = False
    if shared["no_checkpoint"]:
        fields["checkpoint"] = False
    return fields


add.params[:0] = [p for p in enqueue.params if p.name in SPEC_OPTIONS]


@schedule.command("rm")
@click.argument("name", metavar="NAME")
@pool_command
def rm(state: CliState, name: str) -> None:
    """Remove schedule NAME; the jobs it made stay."""
    check_name(name)
    state.pool().remove_schedule(name)
    state.emit({"name": name, "removed": True}, lambda: f"removed schedule {name}")


@schedule.command("pause")
@click.argument("name", metavar="NAME")
@pool_command
def pause(state: CliState, name: str) -> None:
    """Pause schedule NAME: none of its ticks fire until it is resumed."""
    check_name(name)
    done = state.pool().pause_schedule(name)
    state.emit(done.to_dict(), lambda: f"paused schedule {name}")


@schedule.command("resume")
@click.argument("name", metavar="NAME")
@pool_command
def resume(state: CliState, name: str) -> None:
    """Resume schedule NAME from its first tick after now (the ticks of its pause never fire)."""
    check_name(name)
    done = state.pool().resume_schedule(name)
    state.emit(done.to_dict(), lambda: f"resumed schedule {name}, next fire {clock(done.next_fire)}")


COMMANDS = (schedule,)
