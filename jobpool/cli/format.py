"""Human output for the CLI: aligned tables, relative times, one-line events, the status report.

Kept apart from the commands so they read as "validate, call the API, print". Nothing here touches
Redis or judges anything: the health rules are the status report's (jobpool/status/health.py). No job's env
values ever reach this module's output: only `Job.to_dict()` (which redacts them) and env *names*.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import click

from ..contract import ENV_CHECKPOINT_DIR
from ..digits import ascii_whole
from ..models import Job, JobState
from ..status import StatusReport, ago
from ..waiting import until_words, utc_text, wait_note
from .durations import format_duration

STATE_COLOURS = {
    JobState.WAITING: "blue",
    JobState.RUNNING: "cyan",
    JobState.SUCCEEDED: "green",
    JobState.FAILED: "red",
    JobState.PAUSED: "yellow",
}


def clock(ms: int | str | None) -> str:
    """Local wall-clock time of an event, to the second (relative times say nothing in a stream)."""
    if ms in (None, ""):
        return "-"
    try:
        secs = int(ms) / 1000
    except (TypeError, ValueError):
        return str(ms)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(secs))


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], styles: Sequence[str | None] = ()) -> str:
    """Columns padded to their widest cell; `styles` colours whole rows (click drops it off a terminal)."""
    rows = [list(r) for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [click.style(line(headers), bold=True)]
    for i, r in enumerate(rows):
        colour = styles[i] if i < len(styles) else None
        out.append(click.style(line(r), fg=colour) if colour else line(r))
    return "\n".join(out)


def pairs(items: Sequence[tuple[str, str]]) -> str:
    """'key   value' lines, keys aligned."""
    width = max((len(k) for k, _ in items), default=0)
    return "\n".join(f"{k.ljust(width)}  {v}".rstrip() for k, v in items)


def command_text(job: Job) -> str:
    return shlex.join(job.spec.command)


def job_note(job: Job, now_ms: int) -> str:
    """What a reader of `ls` most needs to know beyond the state (`Job.notes`; for a waiting job what it
    waits for and until when: `waiting.wait_note`)."""
    return ", ".join([*job.notes(), *filter(None, [wait_note(job, now_ms)])])


def jobs_table(jobs: Sequence[Job], now_ms: int) -> str:
    rows = [
        [j.id, j.state.value, str(j.spec.priority), str(j.attempt), shorten(j.spec.image, 30),
         shorten(command_text(j), 40), ago(j.created_at, now_ms), job_note(j, now_ms)]
        for j in jobs
    ]
    styles = [STATE_COLOURS.get(j.state) for j in jobs]
    return table(["ID", "STATE", "PRIO", "ATT", "IMAGE", "COMMAND", "CREATED", "NOTE"], rows, styles)


def retries_text(job: Job) -> str:
    """A job's retries: how many used of how many, the first delay, the exit codes retried."""
    s = job.spec
    if not s.retries:
        return "none"
    on = f", on exit {', '.join(map(str, s.retry_on))} or a timeout" if s.retry_on else ""
    return (f"{job.retries_used} of {s.retries} used (first delay {format_duration(s.retry_delay)}, doubled "
            f"per retry{on})")


def job_details(job: Job, now_ms: int, waiting: Sequence[str] = ()) -> str:
    """Every field a human asks about; env *names* only (values may be secrets); for a queued or waiting job,
    what holds it back (`Pool.why_waiting`)."""
    s = job.spec

    def when(ms: int | None) -> str:
        return f"{ago(ms, now_ms)} ({clock(ms)})" if ms is not None else "-"

    items = [
        ("id", job.id),
        ("state", click.style(job.state.value, fg=STATE_COLOURS.get(job.state))),
        ("attempt", f"{job.attempt} (recoveries used: {job.recovery_attempts})"),
        ("image", s.image),
        ("command", command_text(job)),
        ("env", (", ".join(sorted(s.env)) + "  (values hidden)") if s.env else "-"),
        ("workdir", s.workdir or "-"),
        ("user", s.user or "-"),
        ("network", s.network),
        ("init", "yes" if s.init else "no (the command runs as PID 1)"),
        ("checkpoint", "yes" if s.checkpoint else f"no (no {ENV_CHECKPOINT_DIR}, no affinity)"),
        ("cpus", f"{s.cpus:g}" if s.cpus is not None else "-"),
        ("memory", s.memory or "-"),
        ("labels", ", ".join(f"{k}={v}" for k, v in sorted(s.labels.items())) or "-"),
        ("mounts", ", ".join(s.mounts) or "-"),
        ("priority", str(s.priority)),
        ("slots", str(s.slots)),
        ("uses", ", ".join(f"{n}={a}" for n, a in sorted(s.uses.items())) or "-"),
        ("group", s.group or "-"),
        ("timeout", format_duration(s.timeout) + " per attempt" if s.timeout is not None else "-"),
        ("retries", retries_text(job)),
        ("after", ", ".join(job.after) or "-"),
    ]
    if job.wait_until is not None:
        items.append(("wait until", f"{utc_text(job.wait_until)} ({until_words(job.wait_until, now_ms)}; "
                                    f"{clock(job.wait_until)} local)"))
    if job.schedule:
        tick = f", tick {utc_text(job.tick)}" if job.tick is not None else ""
        items.append(("schedule", job.schedule + tick))
    items += [
        ("created", when(job.created_at)),
        ("promoted", when(job.promoted_at)),
        ("claimed", when(job.claimed_at)),
        ("heartbeat", when(job.heartbeat_at)),
        ("finished", when(job.finished_at)),
        ("exit code", str(job.exit_code) if job.exit_code is not None else "-"),
        ("error reason", job.error_reason or "-"),
        ("owner boot", job.owner_boot or "-"),
        ("container", job.container_id or "-"),
        ("daemon", job.daemon_id or "-"),
        ("affinity", job.affinity or "-"),
    ]
    if job.pause_requested:
        items.append(("pause requested", "yes"))
    if job.cancel_requested:
        items.append(("cancel requested", "yes"))
    items += [("waiting for", line) for line in waiting]
    return pairs(items)


def event_json(entry: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = dict(entry)
    at = out.get("at")
    at_ms = ascii_whole(at)
    if at_ms is not None:
        out["at"] = at_ms
    return out


def event_line(entry: Mapping[str, Any]) -> str:
    move = f"{entry.get('from') or '-'} -> {entry.get('to') or '-'}" if entry.get("to") else ""
    parts = [clock(entry.get("at")), entry.get("job") or "(queue)", move, entry.get("reason", ""),
             f"by {entry['actor']}" if entry.get("actor") else "", entry.get("evidence", "")]
    return "  ".join(p for p in parts if p)


def decisions_table(decisions: Sequence[Mapping[str, Any]]) -> str:
    """A reconcile report's per-row verdicts (`Decision.to_dict()`)."""
    rows = [[d["job_id"], str(d["attempt"]), d["verdict"]["kind"], d["expected"] or "-", d["outcome"] or "-",
             shorten(d["verdict"].get("evidence") or d["verdict"].get("reason") or "", 60)]
            for d in decisions]
    return table(["JOB", "ATT", "VERDICT", "EXPECTED", "OUTCOME", "EVIDENCE"], rows)


ORPHAN_STOP_LINES = {
    "stopped": "its worker boot {boot} is gone: stopped {n} container(s) by label; the job is now {state}",
    "owner_alive": "its worker still holds the lease and honours the request",
    "routed": "its worker boot {boot} is gone and its container runs on another daemon: {detail}; the job "
              "ends cancelled once it has stopped",
    "not_running": "",
    "manual_stop_needed": "warning: its worker boot {boot} is gone and it ran as a subprocess, which "
                          "jobpool never signals from another boot: stop it by hand ({detail}); "
                          "the job is now {state}",
    "unknown": "warning: its worker boot {boot} is gone and Docker could not be asked ({detail}); "
               "the request is persisted and the supervisor acts on it",
    "unavailable": "warning: its worker boot {boot} is gone and {detail}: nothing stopped it",
}


def orphan_stop_line(stop: Mapping[str, Any], owner_boot: str, state: str) -> str:
    """What `cancel` did about a job whose worker is gone ('' when there is nothing to say)."""
    template = ORPHAN_STOP_LINES.get(stop["action"], "{action}: {detail}")
    return template.format(boot=owner_boot, n=len(stop["containers"]), state=state, **stop)


def status_report(report: StatusReport) -> str:
    """The human form of `status` (its JSON form is `report.to_dict()`)."""
    items: list[tuple[str, str]] = [("pool", report.pool), ("redis", f"{report.redis_url}  "
                                    + ("reachable" if report.reachable else "UNREACHABLE"))]
    now = report.now_ms or 0
    if report.slots is not None:
        items.append(("slots", f"{report.slots.used}/{report.slots.max} used"))
    items += [("limit", f"{u.name} {u.used}/{u.size} used") for u in report.limits]
    if report.counts:
        c, q = report.counts, report.queue
        head = (f" (the oldest enqueued {ago(now - q.oldest_wait_ms, now)})"
                if q is not None and q.oldest_wait_ms is not None else "")
        waits = report.waiting
        due = ("" if waits is None or not waits.count else
               f" (the next due {until_words(waits.next_due_ms, now)})" if waits.next_due_ms is not None
               else " (on the jobs they wait for)")
        items.append(("jobs", f"{c['queued']} queued{head}, {c.get('waiting', 0)} waiting{due}, "
                              f"{c['paused']} paused, {c['running']} running"))
    if report.promotion is not None:
        p = report.promotion
        why = f": {p.reason}" if p.reason else ""
        paused = click.style("PAUSED", fg="yellow") + f" by {p.by or '?'} {ago(p.since, now)}{why}"
        items.append(("promotion", paused if p.paused else "running"))
    if report.workers is not None:
        w = report.workers
        draining = f" ({w.draining} draining)" if w.draining else ""
        stale = f", {w.stale} gone" if w.stale else ""
        items.append(("workers", f"{w.live} live{draining}{stale}"))
        for boot in w.boots:
            where = " ".join(f"{k}={v}" for k, v in (("host", boot.host), ("pid", boot.pid)) if v)
            more = boot.running - len(boot.jobs)
            running = (f"  running {', '.join(boot.jobs)}" + (f" and {more} more" if more > 0 else "")
                       if boot.jobs else "")
            hold = ("  " + click.style(f"NOT CLAIMING: {boot.cannot_claim}", fg="yellow")
                    if boot.cannot_claim else "")
            beat = ago(boot.heartbeat_ms, now)
            # Its daemon's restart would stop its job (jobpool/status/health.py, `_live_restore_notes`).
            label = "SWARM NODE: DRAIN BEFORE A DAEMON RESTART" if boot.swarm else "NO LIVE-RESTORE"
            bare = ("  " + click.style(label, fg="yellow")) if boot.live_restore is False else ""
            items.append(("", f"{boot.id}  {where}  heartbeat {beat}{running}{hold}{bare}"))
    if report.reachable:
        sweep = report.last_sweep
        items.append(("last sweep", "never (no supervisor has run)" if sweep is None else
                      f"{ago(sweep.at, now)}, {sweep.rows if sweep.rows is not None else '?'} rows"))
        items.append(("unknowns", f"{report.unknown}" + ("  (probe could not tell; slots kept)"
                                                         if report.unknown else "")))
        for held in sweep.unknown_jobs if sweep else ():
            items.append(("", f"{held.job}  {held.reason}: {held.evidence}"))
        items.append(("strays", f"{len(report.strays)}" + ("  (running outside any slot; being stopped)"
                                                          if report.strays else "")))
        for stray in report.strays:
            items.append(("", f"{stray.job_id}  attempt {stray.attempt}  container {stray.container_id[:12]} "
                              f"on {stray.daemon_id} since {ago(stray.since_ms, now)}: {stray.reason}"))
    if report.daemons is not None and report.daemons.gone:
        items.append(("gone daemons", ", ".join(report.daemons.gone) + "  (declared: jobpool forget-daemon)"))
    health = (click.style("OK", fg="green") if report.healthy
              else click.style("UNHEALTHY", fg="red", bold=True))
    items.append(("health", health))
    lines = [pairs(items)]
    lines += [f"  - {r}" for r in report.health.reasons]
    lines += [f"  ! {w}" for w in report.health.warnings]
    return "\n".join(lines)
