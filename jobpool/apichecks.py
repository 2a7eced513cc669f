"""The checks of the public API's input, shared by `Pool` (jobpool/api.py) and `AsyncPool` (jobpool/aio.py),
so both refuse the same input with the same typed error, before anything is sent."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from . import errors
from .contract import EVENT_TEXT_MAX_BYTES
from .models import Job, JobState
from .spec import utf8_size

log = logging.getLogger("jobpool")

#: The most jobs a caller may ask for in one read: generous, but finite, so a huge number is a clear
#: InvalidArgument and never a Redis overflow.
MAX_LIST = 1_000_000
#: A reason or evidence text: stored in rows and events, so bounded; half of what the scripts keep of an
#: event's text (contract.py), so what a caller gives is recorded whole.
MAX_TEXT_BYTES = EVENT_TEXT_MAX_BYTES // 2
#: The longest job id a lookup takes; a longer one is not found.
MAX_JOB_ID_CHARS = 128
#: `wait` polls at least once a day.
MAX_WAIT_INTERVAL_SECS = 86400


def check_id(job_id: Any) -> str:
    """A job id as a lookup takes it; anything else is no job (`NotFound`), never sent."""
    if (not isinstance(job_id, str) or not job_id or len(job_id) > MAX_JOB_ID_CHARS
            or any(c in job_id for c in " {}:\n")):
        raise errors.NotFound(errors.no_job(repr(job_id)))
    return job_id


def check_text(name: str, value: Any) -> str:
    """A reason or evidence: a string of at most MAX_TEXT_BYTES in UTF-8."""
    if not isinstance(value, str):
        raise errors.InvalidArgument(f"{name} must be a string, got {value!r}")
    try:
        size = utf8_size(name, value)
    except errors.InvalidSpec as exc:
        raise errors.InvalidArgument(str(exc)) from None
    if size > MAX_TEXT_BYTES:
        raise errors.InvalidArgument(f"{name} is longer than {MAX_TEXT_BYTES} bytes")
    return value


def check_count(name: str, value: Any, high: int) -> int:
    """A whole number from 1 to `high`."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
        raise errors.InvalidArgument(f"{name} must be a whole number from 1 to {high}, got {value!r}")
    return value


def check_state(state: Any) -> JobState:
    """One job state, by name or as a `JobState`."""
    try:
        return JobState(state)
    except ValueError:
        states = ", ".join(s.value for s in JobState)
        raise errors.InvalidArgument(f"unknown state {state!r} (one of {states})") from None


def check_states(given: Any) -> set[JobState]:
    """Job states to wait for: one state, or an iterable of them (names or `JobState`)."""
    items = [given] if isinstance(given, str) else given
    try:
        wanted = {JobState(s) for s in items}
    except (TypeError, ValueError):
        names = ", ".join(s.value for s in JobState)
        raise errors.InvalidArgument(f"states must be job states ({names}), got {given!r}") from None
    if not wanted:
        raise errors.InvalidArgument("states must name at least one job state")
    return wanted


def check_wait_args(timeout: Any, interval: Any, interval_name: str) -> None:
    """`wait`'s timeout (0 or more seconds) and how often it reads the job (above 0, at most a day)."""
    for name, value, low_ok in (("timeout", timeout, True), (interval_name, interval, False)):
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)
                or value < 0 or (value == 0 and not low_ok)
                or (name == interval_name and value > MAX_WAIT_INTERVAL_SECS)):
            raise errors.InvalidArgument(f"{name} must be a number of seconds above "
                                         f"{'or at ' if low_ok else ''}0, got {value!r}")


def jobs_of(ids: Sequence[str], rows: Sequence[Any], pool: str) -> list[Job]:
    """`_rows` from the rows as read (the asyncio API reads them itself: jobpool/aio.py)."""
    jobs = []
    for job_id, row in zip(ids, rows, strict=True):
        if not row:
            continue
        try:
            if isinstance(row, Exception):
                raise errors.CorruptRow(f"job {job_id}: its row is unreadable ({row})", job_id)
            jobs.append(Job.from_row(row, job_id=job_id))
        except errors.CorruptRow as exc:
            log.warning("pool %s: skipping a corrupt row: %s", pool, exc)
    return jobs
