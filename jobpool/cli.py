"""`jobpool`: the admin CLI, one click group over `Pool` (and, lazily, the worker, supervisor and `up`).

Every command validates its input before it connects, so a refused command writes nothing. Errors are one
line on stderr: exit 2 for bad input (flags, arguments, a bad ``JOBPOOL_*`` value, a refused job spec),
exit 1 for failures (unknown job, illegal transition, Redis unreachable, an unhealthy `status`).
With ``--json`` each command prints exactly one JSON document on stdout (`events --follow`: JSON lines).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click
import redis

from . import errors
from .api import Pool
from .cli_format import (
    event_json,
    event_line,
    job_details,
    jobs_table,
    orphan_stop_line,
    status_report,
)
from .config import Settings
from .models import Job, JobState
from .registry import wrap_redis_error
from .spec import ENV_NAME, build_spec
from .status import ago

#: Bad input: refused before anything was written, so a usage error (exit 2), not a failure (exit 1).
USAGE_ERRORS = (errors.ConfigError, errors.InvalidSpec, errors.InvalidArgument)

HELP = """Admin CLI for a jobpool: long container jobs under a hard, fleet-wide concurrency limit.

Global options may also come from JOBPOOL_REDIS_URL and JOBPOOL_POOL, and may be given after the command
too (`jobpool ls --json`). Exit codes: 0 ok, 1 failure (or `status` unhealthy), 2 bad input.

\b
Shell completion (bash; zsh and fish likewise, with zsh_source / fish_source):
  eval "$(_JOBPOOL_COMPLETE=bash_source jobpool)"
"""


class Failure(click.ClickException):
    """One line on stderr (``Error: …``) and the given exit code; never a traceback."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class CliState:
    """The global options, merged from the group and the command, and the pool built from them once."""

    redis_url: str | None = None
    pool_name: str | None = None
    as_json: bool = False
    _settings: Settings | None = field(default=None, repr=False)
    _pool: Pool | None = field(default=None, repr=False)

    def merge(self, redis_url: str | None, pool_name: str | None, as_json: bool) -> None:
        self.redis_url = redis_url or self.redis_url
        self.pool_name = pool_name or self.pool_name
        self.as_json = self.as_json or as_json

    def settings(self) -> Settings:
        """Settings from ``JOBPOOL_*`` and the flags; a bad value is a usage error naming the variable."""
        if self._settings is None:
            self._settings = Settings.from_env(redis_url=self.redis_url, pool=self.pool_name)
        return self._settings

    def pool(self) -> Pool:
        """The pool (no round trip yet: redis-py connects on first use); closed when the CLI exits."""
        if self._pool is None:
            self._pool = Pool.from_settings(self.settings())
            self._pool.actor = "cli"
            click.get_current_context().find_root().call_on_close(self._pool.close)
        return self._pool

    def emit(self, doc: Any, human: Callable[[], str | None]) -> None:
        """Print `doc` as JSON, or the human text `human()` gives (None prints nothing)."""
        if self.as_json:
            click.echo(json.dumps(doc, sort_keys=True))
        else:
            text = human()
            if text is not None:
                click.echo(text)


def _global_options(group: bool) -> list[Callable[[Any], Any]]:
    """The options every command shares; read from the environment at group level only, so a flag given
    before the command is never overridden by the environment after it."""
    return [
        click.option("--redis-url", envvar="JOBPOOL_REDIS_URL" if group else None, metavar="URL",
                     help="Redis holding the pool [env JOBPOOL_REDIS_URL; default redis://127.0.0.1:6379/0]."),
        click.option("--pool", "pool_name", envvar="JOBPOOL_POOL" if group else None, metavar="NAME",
                     help="Pool name [env JOBPOOL_POOL; default 'default']."),
        click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout."),
    ]


def _apply(options: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    def decorate(fn: Any) -> Any:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def pool_command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command the shared options and call it with the merged `CliState` first."""

    @functools.wraps(fn)
    def wrapper(*args: Any, redis_url: str | None, pool_name: str | None, as_json: bool,
                **kwargs: Any) -> Any:
        state = click.get_current_context().ensure_object(CliState)
        state.merge(redis_url, pool_name, as_json)
        return fn(state, *args, **kwargs)

    decorated: Callable[..., Any] = _apply(_global_options(group=False))(wrapper)
    return decorated


class JobpoolGroup(click.Group):
    """Turns every jobpool error into one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            try:
                return super().invoke(ctx)
            except redis.RedisError as exc:  # met outside the API (a process command): mapped the same way
                raise wrap_redis_error(exc, ctx.invoked_subcommand or "jobpool") from None
        except USAGE_ERRORS as exc:
            raise Failure(str(exc), exit_code=2) from None
        except errors.JobpoolError as exc:
            raise Failure(str(exc)) from None
        except Exception as exc:
            # The process commands may meet an unreachable Docker daemon; docker-py is imported lazily by
            # them, so it is recognised by module rather than imported here for every admin command.
            if type(exc).__module__.partition(".")[0] == "docker":
                raise Failure(f"docker: {exc}") from None
            raise


@click.group(cls=JobpoolGroup, help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@_apply(_global_options(group=True))
@click.version_option(package_name="jobpool", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, pool_name: str | None, as_json: bool) -> None:
    ctx.obj = CliState(redis_url=redis_url, pool_name=pool_name, as_json=as_json)


main = cli


# ---- input parsing -----------------------------------------------------------------------------------

def _pairs(kind: str, key_ok: Callable[[str], bool], key_rule: str) -> Callable[..., dict[str, str]]:
    def parse(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
        out: dict[str, str] = {}
        for item in values:
            key, sep, value = item.partition("=")
            if not sep:
                raise click.BadParameter(f"{item!r} is not {kind}=VALUE", ctx, param)
            if not key_ok(key):
                raise click.BadParameter(f"{key!r} in {item.split('=')[0]!r}=… is not {key_rule}", ctx, param)
            out[key] = value
        return out

    return parse


_parse_env = _pairs("NAME", lambda k: bool(ENV_NAME.fullmatch(k)), "a variable name (letters, digits, '_')")
_parse_labels = _pairs("KEY", lambda k: bool(k) and "\x00" not in k, "a label key")


# ---- jobs --------------------------------------------------------------------------------------------

@cli.command(context_settings={"allow_interspersed_args": False})
@click.option("--coalesce", is_flag=True, help="Return the queued job with an identical spec, if any.")
@click.option("--coalesce-key", metavar="K", help="Coalesce on this key instead of the whole spec.")
@click.option("--env", "env", multiple=True, metavar="K=V", callback=_parse_env,
              help="Environment variable for the job (repeatable). Values are never printed.")
@click.option("--workdir", metavar="DIR", help="Absolute working directory in the container.")
@click.option("--user", metavar="USER", help="User (name or uid[:gid]) to run as.")
@click.option("--memory", metavar="M", help="Memory limit, e.g. 512m or 2g.")
@click.option("--cpus", type=float, metavar="C", help="CPU limit, e.g. 1.5.")
@click.option("--label", "labels", multiple=True, metavar="K=V", callback=_parse_labels,
              help="Container label (repeatable); the jobpool. prefix is reserved.")
@click.argument("image")
@click.argument("command", nargs=-1, required=True)
@pool_command
def enqueue(state: CliState, image: str, command: tuple[str, ...], coalesce: bool, coalesce_key: str | None,
            env: dict[str, str], workdir: str | None, user: str | None, memory: str | None,
            cpus: float | None, labels: dict[str, str]) -> None:
    """Queue IMAGE running CMD; prints the job id.

    Options go before IMAGE: everything after it is the command (a `--` there is optional).
    """
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise click.UsageError("missing the command to run after IMAGE")
    if coalesce_key is not None and not coalesce_key:
        raise click.BadParameter("must not be empty", param_hint="'--coalesce-key'")
    fields: dict[str, Any] = {"image": image, "command": list(command), "env": env, "labels": labels}
    fields.update({k: v for k, v in (("workdir", workdir), ("user", user), ("memory", memory),
                                     ("cpus", cpus)) if v is not None})
    build_spec(fields, state.settings().bind_roots)  # refuse a bad spec before connecting
    job = state.pool().enqueue(coalesce=coalesce, coalesce_key=coalesce_key, **fields)
    state.emit(job.to_dict(), lambda: job.id)
    if job.coalesced and not state.as_json:
        click.echo(f"coalesced: an identical job was already queued; this is its id ({job.state.value})",
                   err=True)


@cli.command("ls")
@click.option("--state", "job_state", type=click.Choice([s.value for s in JobState]),
              help="Only jobs in this state.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True,
              help="At most this many jobs.")
@pool_command
def ls_(state: CliState, job_state: str | None, limit: int) -> None:
    """List jobs: one state in queue order, or the newest of every state."""
    pool = state.pool()
    jobs = pool.list(job_state, limit=limit)
    if state.as_json:
        state.emit([j.to_dict() for j in jobs], lambda: None)
        return
    if not jobs:
        click.echo("no jobs" + (f" {job_state}" if job_state else ""))
        return
    click.echo(jobs_table(jobs, pool.now_ms()))


@cli.command()
@click.argument("job_id", metavar="JOB")
@pool_command
def show(state: CliState, job_id: str) -> None:
    """Everything about one job (env values are never shown)."""
    pool = state.pool()
    job = pool.get(job_id)
    state.emit(job.to_dict(), lambda: job_details(job, pool.now_ms()))


@cli.command()
@click.argument("job_id", metavar="JOB")
@pool_command
def logs(state: CliState, job_id: str) -> None:
    """The last 64 KiB of a job's output, kept after its container is gone."""
    text = state.pool().logs(job_id)
    if state.as_json:
        state.emit({"id": job_id, "log": text}, lambda: None)
    elif text:
        click.echo(text, nl=not text.endswith("\n"))
    else:
        click.echo(f"(no output recorded for {job_id})", err=True)


def _print_event(state: CliState, entry: dict[str, str]) -> None:
    doc = event_json(entry)
    click.echo(json.dumps(doc, sort_keys=True) if state.as_json else event_line(doc))


@cli.command()
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new events until Ctrl-C (JSON lines with --json).")
@click.option("--job", "job_id", metavar="JOB", help="Only this job's events.")
@click.option("--count", type=click.IntRange(0, 100_000), default=20, show_default=True,
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


# ---- control -----------------------------------------------------------------------------------------

def _job_outcome(pool: Pool, job: Job, verb: str, done_state: JobState, requested: bool) -> str:
    if job.state is done_state:
        return f"{done_state.value} {job.id}"
    if requested:
        line = f"{verb} requested for {job.id} (it is {job.state.value}; its worker acts on the request)"
        if job.owner_boot and not pool.boot_is_live(job.owner_boot):
            line += f"\nwarning: its worker boot {job.owner_boot} is gone; the supervisor recovers the job"
        return line
    return f"{job.id} is {job.state.value}"


def _stop_orphan(pool: Pool, job: Job) -> dict[str, Any] | None:
    """A cancelled running job whose owner boot is gone has nobody to stop it: stop it by container label
    (DESIGN §5; the supervisor's `stop_orphan` never signals a pid). None when there was nothing to do."""
    if not (job.state is JobState.RUNNING and job.cancel_requested and job.owner_boot):
        return None
    if pool.boot_is_live(job.owner_boot):
        return None
    try:
        from jobpool.supervisor import stop_orphan
    except ImportError as exc:
        return {"action": "unavailable", "containers": [],
                "detail": f"the supervisor is not in this build ({exc})"}
    done = stop_orphan(pool, job)
    return {"action": done.action, "containers": list(done.containers), "detail": done.detail}


@cli.command()
@click.argument("job_id", metavar="JOB")
@click.option("--reason", default="", metavar="TEXT", help="Recorded in the job's events.")
@pool_command
def cancel(state: CliState, job_id: str, reason: str) -> None:
    """Cancel a job; a running one is asked to stop (the request survives crashes).

    When the job's worker is gone, its container is stopped by label here.
    """
    pool = state.pool()
    job = pool.cancel(job_id, reason=reason)
    owner = job.owner_boot
    stop = _stop_orphan(pool, job)
    if stop is not None:
        job = pool.get(job_id)
    doc = job.to_dict() if stop is None else {**job.to_dict(), "orphan_stop": stop}
    state.emit(doc, lambda: _job_outcome(pool, job, "cancel", JobState.CANCELLED, job.cancel_requested
                                         and stop is None))
    if stop is not None and not state.as_json:
        line = orphan_stop_line(stop, owner, job.state.value)
        if line:
            click.echo(line, err=line.startswith("warning"))


def _queue_doc(pool: Pool) -> dict[str, Any]:
    stats = pool.stats()
    return {k: stats[k] for k in ("pool", "queue_paused", "paused_by", "paused_reason", "paused_since")}


def _queue_line(doc: dict[str, Any], now_ms: int) -> str:
    if not doc["queue_paused"]:
        return f"promotion running for pool {doc['pool']}"
    why = f": {doc['paused_reason']}" if doc["paused_reason"] else ""
    return f"promotion paused for pool {doc['pool']} (since {ago(doc['paused_since'], now_ms)}){why}"


@cli.command()
@click.argument("job_id", metavar="[JOB]", required=False)
@click.option("--reason", default="", metavar="TEXT", help="Recorded with the pause.")
@pool_command
def pause(state: CliState, job_id: str | None, reason: str) -> None:
    """Pause one job, or with no JOB the whole queue's promotion (reconciling goes on)."""
    pool = state.pool()
    if job_id is None:
        pool.pause(None, reason=reason)
        doc = _queue_doc(pool)
        state.emit(doc, lambda: _queue_line(doc, pool.now_ms()))
        return
    job = pool.pause(job_id, reason=reason)
    assert job is not None
    state.emit(job.to_dict(), lambda: _job_outcome(pool, job, "pause", JobState.PAUSED, job.pause_requested))


@cli.command()
@click.argument("job_id", metavar="[JOB]", required=False)
@pool_command
def resume(state: CliState, job_id: str | None) -> None:
    """Resume one paused job (it keeps its place), or with no JOB the queue's promotion."""
    pool = state.pool()
    if job_id is None:
        pool.resume(None)
        doc = _queue_doc(pool)
        state.emit(doc, lambda: _queue_line(doc, pool.now_ms()))
        return
    job = pool.resume(job_id)
    assert job is not None
    state.emit(job.to_dict(), lambda: f"resumed {job.id} ({job.state.value})")


@cli.command(context_settings={"ignore_unknown_options": True})  # so `slots -1` reaches the range check
@click.argument("n", type=click.IntRange(0, 100_000), required=False)
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


# ---- health ------------------------------------------------------------------------------------------

@cli.command()
@pool_command
def status(state: CliState) -> None:
    """Slots, queue, workers and the supervisor; exits 1 when the pool is unhealthy."""
    report = state.pool().status()
    state.emit(report.to_dict(), lambda: status_report(report))
    if not report.healthy:
        click.get_current_context().exit(1)


# ---- processes: in cli_process.py, registered on this group when it is imported ---------------------------

from . import cli_process  # noqa: E402,F401  (registers worker, supervisor, up, reconcile)

if __name__ == "__main__":
    # Run as `python -m jobpool.cli`, this file is `__main__`, a second copy: the process commands register
    # on the importable `jobpool.cli`, so that is the group to run.
    from jobpool.cli import main as _main

    _main()
