"""What each dashboard page shows, read through the pool's public API only (jobpool/operations.py; no Redis
reads of its own): the status report (`Pool.status`, the one source the CLI and the metrics read too), pages
of jobs (`Pool.page`), one job (`Pool.get`, `Pool.events`, `Pool.logs`) and the events feed
(`Pool.tail_events`).

A job's env values never leave this module: a job is shown from `Job.to_dict()`, which keeps the names and
redacts the values (jobpool/models.py).
"""

from __future__ import annotations

import shlex
import time
from typing import Any

from ..logtail import LOG_TAIL_BYTES
from ..models import Job, JobState
from ..operations import PoolOperations
from ..status import ago
from ..waiting import wait_note
from .charts import history_charts

#: Jobs on one page of the jobs list; running jobs shown on the overview (the rest a page at a time, from
#: its link); jobs named per daemon held on stale evidence (`/api/status` has them all).
PAGE_SIZE = 25
OVERVIEW_RUNNING = 20
DAEMON_JOBS = 20
#: Events on the feed, and the most of one job's history its page shows (its newest).
FEED_EVENTS = 100
JOB_EVENTS = 500

STATES = [s.value for s in JobState]


def clock(ms: Any) -> str:
    """Local wall-clock time to the second, or '-'."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(ms) / 1000))
    except (TypeError, ValueError, OverflowError, OSError):
        return "-"


MS_PER_SEC = 1000


def duration(ms: Any) -> str:
    """'1 h 4 min', '12 s', '350 ms' for a span in milliseconds; '-' for none."""
    if ms is None:
        return "-"
    ms = max(int(ms), 0)  # a time a little in the future: another clock than the Redis server's
    if ms < MS_PER_SEC:
        return f"{ms} ms"
    secs = ms // MS_PER_SEC
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if secs >= size:
            rest = (secs % size) // subsize
            return f"{secs // size} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{secs} s"


def job_row(job: Job, now_ms: int) -> dict[str, Any]:
    """A job as a list row: what `ls` shows, plus times relative to `now_ms`."""
    doc = job.to_dict()
    notes = job.notes(exit_code=False)  # the list shows the exit code in its own column
    notes += filter(None, [wait_note(job, now_ms)])  # a waiting job: what it waits for, until when
    since = job.finished_at or job.claimed_at or job.promoted_at or job.created_at
    return {**doc, "command_text": shlex.join(job.spec.command), "image": job.spec.image,
            "note": ", ".join(notes), "since": ago(since, now_ms), "created": ago(job.created_at, now_ms)}


def overview(pool: PoolOperations) -> dict[str, Any]:
    report = pool.status()
    ctx: dict[str, Any] = {"report": report, "summary": report.to_dict(), "running": [], "now": report.now_ms,
                           "daemon_jobs": DAEMON_JOBS}
    if report.reachable and report.now_ms is not None:
        ctx["running"] = [job_row(j, report.now_ms) for j in pool.page("running", 0, OVERVIEW_RUNNING).jobs]
        ctx["charts"] = history_charts(pool.trends())
    return ctx


def jobs_page(pool: PoolOperations, state: str, offset: int) -> dict[str, Any]:
    page = pool.page(state, offset, PAGE_SIZE)
    now = pool.now_ms()
    return {"page": page, "jobs": [job_row(j, now) for j in page.jobs], "state": page.state.value,
            "counts": pool.stats()["counts"], "states": STATES, "page_size": PAGE_SIZE}


def job_detail(pool: PoolOperations, job_id: str) -> dict[str, Any]:
    job = pool.get(job_id)  # NotFound for an unknown id: the caller's 404
    now = pool.now_ms()
    history, _ = pool.tail_events(job_id, JOB_EVENTS)
    doc = job_row(job, now)
    held = job.state in (JobState.QUEUED, JobState.WAITING)
    times = [("created", job.created_at), ("promoted", job.promoted_at), ("claimed", job.claimed_at),
             ("last heartbeat", job.heartbeat_at), ("finished", job.finished_at)]
    if job.wait_until is not None:
        times.insert(1, ("wait until", job.wait_until))
    return {"job": doc, "spec": doc["spec"], "env_names": sorted(job.spec.env),
            "events": history, "log": pool.logs(job_id)[-LOG_TAIL_BYTES:], "now": now,
            "waiting": pool.why_waiting(job.id) if held else [], "times": times,
            "can_pause": job.state in (JobState.QUEUED, JobState.WAITING, JobState.RUNNING),
            "can_resume": job.state is JobState.PAUSED, "can_cancel": not job.state.terminal,
            "can_retry": job.state in (JobState.FAILED, JobState.CANCELLED)}


def events_feed(pool: PoolOperations) -> dict[str, Any]:
    entries, _ = pool.tail_events(None, FEED_EVENTS)
    entries.reverse()  # newest first
    return {"events": entries}
