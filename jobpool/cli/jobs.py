"""The job commands: `enqueue`, `ls`, `show`, `logs`, `cancel`, `pause`, `resume` (a queue pause too),
`retry`."""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import click

from .. import errors
from ..cancel import stop_if_orphaned
from ..contract import ENV_CHECKPOINT_DIR, MAX_AFTER, MAX_LIMIT, MAX_PRIORITY, MAX_RETRIES, MAX_SLOTS
from ..models import Job, JobState
from ..operations import PoolOperations
from ..spec import ENV_NAME, build_spec
from ..status import ago
from ..waiting import wait_note
from .app import CliState, Failure, pool_command
from .durations import duration_option, moment_option
from .format import job_details, jobs_table, orphan_stop_line
from .jobfile import enqueue_file

# ---- input parsing ---------------------------------------------------------------------------------------

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


def _parse_uses(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, int]:
    """`--uses NAME[=AMOUNT]`, repeatable: the named limits a job holds units of (1 by default). The name
    itself is checked with the rest of the spec (`build_spec`)."""
    out: dict[str, int] = {}
    for item in values:
        name, sep, amount = item.partition("=")
        if name in out:
            raise click.BadParameter(f"{name!r} is named twice", ctx, param)
        if not sep:
            out[name] = 1
            continue
        if not amount.isascii() or not amount.isdigit() or not 1 <= int(amount) <= MAX_LIMIT:
            raise click.BadParameter(f"{item!r}: the amount must be a whole number from 1 to {MAX_LIMIT}",
                                     ctx, param)
        out[name] = int(amount)
    return out
_parse_labels = _pairs("KEY", lambda k: bool(k) and "\x00" not in k, "a label key")


#: The highest exit code a process can have.
MAX_EXIT_CODE = 255


def _parse_retry_on(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    """`--retry-on 3,4`: the exit codes retried, each a whole number from 1 to 255."""
    if value is None:
        return None
    codes = []
    for item in value.split(","):
        code = item.strip()
        if not code.isascii() or not code.isdigit() or not 1 <= int(code) <= MAX_EXIT_CODE:
            raise click.BadParameter(f"{item!r} is not an exit code from 1 to {MAX_EXIT_CODE} (a list: 3,4)",
                                     ctx, param)
        codes.append(int(code))
    return codes


# ---- jobs --------------------------------------------------------------------------------------------

@click.command(context_settings={"allow_interspersed_args": False})
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
@click.option("--no-init", "no_init", is_flag=True,
              help="Run CMD as the container's PID 1, with no init to pass it the stop signal.")
@click.option("--no-checkpoint", "no_checkpoint", is_flag=True,
              help=f"The job keeps no checkpoint across attempts: no {ENV_CHECKPOINT_DIR} (no volume), and "
                   "a handed-back job may run on any daemon.")
@click.option("--priority", type=click.IntRange(-MAX_PRIORITY, MAX_PRIORITY), metavar="N",
              help=f"Its place among queued jobs: higher first, -{MAX_PRIORITY}..{MAX_PRIORITY} (default 0).")
@click.option("--slots", "weight", type=click.IntRange(1, MAX_SLOTS), metavar="K",
              help="How many of the pool's slots it holds while it runs (default 1).")
@click.option("--uses", "uses", multiple=True, metavar="NAME[=AMOUNT]", callback=_parse_uses,
              help="Units of a named limit it holds while it runs (repeatable; 1 by default). A name no "
                   "limit covers is refused (see `jobpool limit`).")
@click.option("--group", metavar="G",
              help="Its fair-share group: among queued jobs of equal priority, groups take turns.")
@click.option("--timeout", callback=duration_option(1), metavar="DURATION",
              help="Its time limit per attempt (90s, 10m, 2h, 1d, 1h30m or seconds): an attempt running "
                   "longer is stopped and fails as 'timeout' (retried while --retries are left).")
@click.option("--retries", type=click.IntRange(0, MAX_RETRIES), metavar="N",
              help="Run it again up to N times after a failed exit of its own or a timeout (default 0); a "
                   "crash of its worker or host is recovered apart and spends none.")
@click.option("--retry-delay", "retry_delay", callback=duration_option(), metavar="DURATION",
              help="The first retry's delay (default 10s), doubled for each retry after it, with jitter, at "
                   "most JOBPOOL_RETRY_DELAY_MAX_SECS. Needs --retries.")
@click.option("--retry-on", "retry_on", callback=_parse_retry_on, metavar="CODES",
              help="Retry only these exit codes, comma-separated (3,4; a timeout is retried either way). "
                   "Needs --retries.")
@click.option("--at", "at", callback=moment_option, metavar="TIME",
              help="Start no sooner than TIME, ISO-8601 with its zone (2026-12-03T02:00:00Z, or +01:00): the "
                   "job waits until then. A time without a zone is refused.")
@click.option("--in", "in_", callback=duration_option(), metavar="DURATION",
              help="Start no sooner than DURATION from now (on the Redis server's clock): the job waits.")
@click.option("--after", "after", multiple=True, metavar="JOB",
              help="Start only once JOB has succeeded (repeatable): the job waits; if JOB fails or is "
                   "cancelled, it is cancelled (dependency_failed). JOB must exist.")
@click.option("--from-file", "from_file", type=click.File("rb"), metavar="FILE",
              help="Queue every job of FILE ('-': stdin), in order: JSON lines, one object per job with "
                   "the fields of the Python API's enqueue (image, command, env, coalesce, ...; not_before "
                   "as epoch seconds or ISO-8601 with its zone, after_index: earlier jobs of the file by "
                   "position from 0). All are checked first; one bad line queues nothing. Prints the ids in "
                   "order.")
@click.argument("image", required=False, metavar="IMAGE")
@click.argument("command", nargs=-1, metavar="COMMAND...")
@pool_command
def enqueue(state: CliState, image: str | None, command: tuple[str, ...], coalesce: bool,
            coalesce_key: str | None, env: dict[str, str], workdir: str | None, user: str | None,
            memory: str | None, cpus: float | None, labels: dict[str, str], no_init: bool,
            no_checkpoint: bool, priority: int | None, weight: int | None, uses: dict[str, int],
            group: str | None, timeout: int | None, retries: int | None, retry_delay: int | None,
            retry_on: list[int] | None, at: datetime.datetime | None, in_: int | None, after: tuple[str, ...],
            from_file: BinaryIO | None) -> None:
    """Queue IMAGE running CMD; prints the job id. Or queue every job of a file (--from-file).

    Options go before IMAGE: everything after it is the command (a `--` there is optional). A job given
    --at, --in or --after is `waiting` until its time comes and the jobs it waits for have succeeded, then
    queued at its priority.
    """
    ctx = click.get_current_context()
    times = TimeOptions(timeout, retries, retry_delay, retry_on, at, in_, after)
    if from_file is not None:
        if image is not None or any((coalesce_key, env, workdir, user, memory, cpus, labels, no_init,
                                       no_checkpoint, uses, group, weight, times.given())) \
                or priority is not None:
            raise click.UsageError("--from-file takes every job from the file: no IMAGE, CMD or spec option "
                                   "(--coalesce alone is a default for every line)")
        enqueue_file(state, from_file, coalesce)
        return
    times.check(coalesce or coalesce_key is not None)
    for name, missing in (("image", image is None), ("command", not command)):
        if missing:  # as click says it of a required argument (they are optional only for --from-file)
            raise click.MissingParameter(ctx=ctx, param=next(p for p in ctx.command.params if p.name == name))
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise click.UsageError("missing the command to run after IMAGE")
    if coalesce_key is not None and not coalesce_key:
        raise click.BadParameter("must not be empty", param_hint="'--coalesce-key'")
    fields: dict[str, Any] = {"image": image, "command": list(command), "env": env, "labels": labels}
    fields.update({k: v for k, v in (("workdir", workdir), ("user", user), ("memory", memory),
                                     ("cpus", cpus), ("priority", priority), ("slots", weight),
                                     ("group", group)) if v is not None})
    fields.update(times.spec_fields())
    if uses:
        fields["uses"] = uses
    if no_init:
        fields["init"] = False
    if no_checkpoint:
        fields["checkpoint"] = False
    build_spec(fields, state.settings().bind_roots)  # refuse a bad spec before connecting
    pool = state.pool()
    job = pool.enqueue(coalesce=coalesce, coalesce_key=coalesce_key, **times.holds(pool), **fields)
    state.emit(job.to_dict(), lambda: job.id)
    if job.coalesced and not state.as_json:
        click.echo(f"coalesced: an identical job was already queued; this is its id ({job.state.value})",
                   err=True)


@dataclass(frozen=True)
class TimeOptions:
    """enqueue's options of time and dependencies: the spec's time limit and retries, and what the job waits
    for before it is queued (`Pool.enqueue`'s not_before and after)."""

    timeout: int | None
    retries: int | None
    retry_delay: int | None
    retry_on: list[int] | None
    at: datetime.datetime | None
    in_: int | None
    after: tuple[str, ...]

    def given(self) -> bool:
        return bool(self.after) or any(v is not None for v in (self.timeout, self.retries, self.retry_delay,
                                                               self.retry_on, self.at, self.in_))

    def check(self, coalesce: bool) -> None:
        """Refuse what the options cannot mean together, before anything connects."""
        if not self.retries and (self.retry_delay is not None or self.retry_on is not None):
            raise click.UsageError("--retry-delay and --retry-on say how to retry: they need --retries N "
                                   "(N > 0)")
        if self.at is not None and self.in_ is not None:
            raise click.UsageError("--at and --in both say when to start: give one")
        if coalesce and (self.at is not None or self.in_ is not None or self.after):
            raise click.UsageError("a job that waits (--at, --in, --after) does not coalesce: only queued "
                                   "jobs do")
        if len(set(self.after)) > MAX_AFTER:
            raise click.UsageError(f"--after names {len(set(self.after))} jobs; at most {MAX_AFTER}")

    def spec_fields(self) -> dict[str, Any]:
        return {k: v for k, v in (("timeout", self.timeout), ("retries", self.retries),
                                  ("retry_delay", self.retry_delay), ("retry_on", self.retry_on))
                if v is not None}

    def holds(self, pool: PoolOperations) -> dict[str, Any]:
        """`Pool.enqueue`'s not_before and after. `--in` counts from the clock every wait is judged on, the
        Redis server's, not this host's."""
        holds: dict[str, Any] = {"after": list(self.after)} if self.after else {}
        if self.at is not None:
            holds["not_before"] = self.at
        elif self.in_ is not None:
            holds["not_before"] = (pool.now_ms() + self.in_ * 1000) / 1000
        return holds


@click.command("ls")
@click.option("--state", "job_state", type=click.Choice([s.value for s in JobState]),
              help="Only jobs in this state.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True,
              help="At most this many jobs.")
@pool_command
def ls_(state: CliState, job_state: str | None, limit: int) -> None:
    """List jobs: one state in queue order (waiting: the soonest due first), or the newest of every state."""
    pool = state.pool()
    jobs = pool.list(job_state, limit=limit)
    if state.as_json:
        state.emit([j.to_dict() for j in jobs], lambda: None)
        return
    if not jobs:
        click.echo("no jobs" + (f" {job_state}" if job_state else ""))
        return
    click.echo(jobs_table(jobs, pool.now_ms()))


@click.command()
@click.argument("job_id", metavar="JOB")
@pool_command
def show(state: CliState, job_id: str) -> None:
    """Everything about one job (env values are never shown); for a queued or waiting one, what holds it."""
    pool = state.pool()
    job = pool.get(job_id)
    held = job.state in (JobState.QUEUED, JobState.WAITING)
    waits = pool.why_waiting(job.id) if held else []
    doc = job.to_dict()
    if held:
        doc["waiting_for"] = waits
    state.emit(doc, lambda: job_details(job, pool.now_ms(), waits))


@click.command()
@click.argument("job_id", metavar="JOB")
@click.option("--follow", "-f", is_flag=True,
              help="Print its output as it is printed, from any host, until the job ends or Ctrl-C "
                   "(JSON lines with --json).")
@pool_command
def logs(state: CliState, job_id: str, follow: bool) -> None:
    """A job's output: while it runs, its live log (sent by its worker about every second); once it ended,
    the last 64 KiB, kept after its container is gone."""
    if follow:
        try:
            for line in state.pool().logs(job_id, follow=True):
                click.echo(json.dumps({"id": job_id, "line": line}) if state.as_json else line)
                sys.stdout.flush()  # a line as it comes, into a pipe or a file too
        except KeyboardInterrupt:
            pass  # Ctrl-C is how a follow may end: exit 0, no "Aborted!"
        return
    text = state.pool().logs(job_id)
    if state.as_json:
        state.emit({"id": job_id, "log": text}, lambda: None)
    elif text:
        click.echo(text, nl=not text.endswith("\n"))
    else:
        click.echo(f"(no output recorded for {job_id})", err=True)


# ---- control -----------------------------------------------------------------------------------------

def _job_outcome(pool: PoolOperations, job: Job, verb: str, done_state: JobState, requested: bool) -> str:
    if job.state is done_state:
        return f"{done_state.value} {job.id}"
    if requested:
        line = f"{verb} requested for {job.id} (it is {job.state.value}; its worker acts on the request)"
        if job.owner_boot and not pool.boot_is_live(job.owner_boot):
            line += f"\nwarning: its worker boot {job.owner_boot} is gone; the supervisor recovers the job"
        return line
    return f"{job.id} is {job.state.value}"


def _stop_orphan(pool: PoolOperations, job: Job) -> dict[str, Any] | None:
    """What was done to the container of a cancelled job whose worker is gone (jobpool/cancel.py); None when
    there was nothing to do."""
    try:
        done = stop_if_orphaned(pool.store, job)
    except ImportError as exc:
        return {"action": "unavailable", "containers": [],
                "detail": f"the supervisor is not in this build ({exc})"}
    if done is None:
        return None
    return {"action": done.action, "containers": list(done.containers), "detail": done.detail}


@click.command()
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


def _queue_doc(pool: PoolOperations) -> dict[str, Any]:
    stats = pool.stats()
    return {k: stats[k] for k in ("pool", "queue_paused", "paused_by", "paused_reason", "paused_since")}


def _queue_line(doc: dict[str, Any], now_ms: int) -> str:
    if not doc["queue_paused"]:
        return f"promotion running for pool {doc['pool']}"
    why = f": {doc['paused_reason']}" if doc["paused_reason"] else ""
    return f"promotion paused for pool {doc['pool']} (since {ago(doc['paused_since'], now_ms)}){why}"


@click.command()
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


@click.command()
@click.argument("job_id", metavar="[JOB]", required=False)
@click.option("--anywhere", is_flag=True,
              help="Release JOB's daemon affinity first (its checkpoint's daemon is gone for good).")
@pool_command
def resume(state: CliState, job_id: str | None, anywhere: bool) -> None:
    """Resume one paused job (it keeps its place), or with no JOB the queue's promotion."""
    if anywhere and job_id is None:
        raise click.UsageError("--anywhere needs a JOB")
    pool = state.pool()
    if job_id is None:
        pool.resume(None)
        doc = _queue_doc(pool)
        state.emit(doc, lambda: _queue_line(doc, pool.now_ms()))
        return
    job = pool.resume(job_id, anywhere=anywhere)
    assert job is not None
    state.emit(job.to_dict(), lambda: f"resumed {job.id} ({_state_words(job, pool.now_ms())})"
               + (", runs on any daemon" if anywhere else ""))


def _state_words(job: Job, now_ms: int) -> str:
    """The job's state, and for a waiting one what it waits for (`waiting.wait_note`)."""
    note = wait_note(job, now_ms)
    return f"{job.state.value}: {note}" if note else job.state.value


@click.command()
@click.argument("job_id", metavar="JOB")
@pool_command
def retry(state: CliState, job_id: str) -> None:
    """Run a failed or cancelled job again, as a new attempt with its history kept.

    Its retries and recovery budget are whole again. If it waits for jobs (--after) that have not succeeded
    yet it waits for them again; one of them that failed or was cancelled must be retried first.
    """
    pool = state.pool()
    try:
        job = pool.retry(job_id)
    except errors.InvalidState as exc:
        raise Failure(f"retry: only a failed or cancelled job is retried; {job_id} is {exc.state}") from None
    state.emit(job.to_dict(), lambda: f"retried {job.id} ({_state_words(job, pool.now_ms())})")


COMMANDS = (enqueue, ls_, show, logs, cancel, pause, resume, retry)
