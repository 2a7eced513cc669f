"""Spans and moments as people type them: `90s`, `10m`, `2h`, `1d`, `1h30m` or plain seconds; an ISO-8601
time with its zone. The one parser every option that takes a duration uses (`enqueue --timeout`,
`--retry-delay`, `--in`; `schedule add --every`), so they all read `10m` alike and refuse alike.

A duration is whole seconds, as the job spec stores them (jobpool/spec.py): a fraction or a unit smaller
than a second would be rounded behind the user's back, so it is refused. Units are lower case (`m` is
minutes; an upper-case `M` could be read as months), largest first, each at most once.

A moment must name its zone (`Z`, or an offset such as `+02:00`): a time without one names a different
moment on every host that reads it, and the Python API refuses a naive datetime for the same reason
(jobpool/submit.py `not_before_ms`). So `--at 2026-12-03T02:00` is refused, saying how to add the zone,
rather than guessed to be local time or UTC.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable

import click

from ..contract import MAX_TIME_SECS
from ..digits import shown

#: Seconds per unit, largest first: the order a duration's parts must come in.
UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
#: One part of a duration: up to nine ASCII digits and a unit.
_PART = re.compile(r"([0-9]{1,9})([dhms])")
_DIGITS = re.compile(r"[0-9]{1,12}")
#: What every refusal of a duration says it should look like.
RULE = "a duration such as 90s, 10m, 2h, 1d, 1h30m or plain seconds"


def parse_duration(text: str, low: int = 0, high: int = MAX_TIME_SECS) -> int:
    """`text` as whole seconds from `low` to `high`; `ValueError` saying what is wrong (the text is quoted,
    and cut when long)."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not {RULE}")
    if text.startswith("-"):
        raise ValueError(f"{shown(text)}: a duration is never negative")
    if _DIGITS.fullmatch(text):
        secs = int(text)
    else:
        secs, pos, seen = 0, 0, -1
        while pos < len(text):
            m = _PART.match(text, pos)
            order = list(UNITS).index(m.group(2)) if m else -1
            if m is None or order <= seen:
                raise ValueError(f"{shown(text)} is not {RULE}")
            secs += int(m.group(1)) * UNITS[m.group(2)]
            seen, pos = order, m.end()
        if pos == 0:
            raise ValueError(f"{shown(text)} is not {RULE}")
    if not low <= secs <= high:
        raise ValueError(f"{shown(text)} is out of range: from {format_duration(low)} to "
                         f"{format_duration(high)}")
    return secs


def format_duration(secs: int | float) -> str:
    """Whole seconds as `parse_duration` reads them back: '1h30m', '2d', '45s', '0s'."""
    rest = max(int(secs), 0)
    parts = []
    for unit, size in UNITS.items():
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts) or "0s"


def parse_moment(text: str) -> datetime.datetime:
    """An ISO-8601 date and time with its zone (`2026-12-03T02:00:00Z`, `2026-12-03 02:00+01:00`) as an aware
    datetime; `ValueError` for anything else, a time without a zone included."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{text!r} is not an ISO-8601 time")
    iso = text.strip()
    if iso[-1:] in ("Z", "z"):  # Python 3.10's fromisoformat reads '+00:00' only
        iso = iso[:-1] + "+00:00"
    try:
        moment = datetime.datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(f"{shown(text)} is not an ISO-8601 time such as 2026-12-03T02:00:00Z") from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{shown(text)} names no time zone: add one (Z for UTC, or an offset such as "
                         "+02:00)")
    return moment


def duration_option(low: int = 0, high: int = MAX_TIME_SECS) -> Callable[..., int | None]:
    """A click option's callback reading a duration (`parse_duration`) as whole seconds from `low` to `high`
    (None when the option is not given); a bad one is click's usage error naming the option."""

    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
        if value is None:
            return None
        try:
            return parse_duration(value, low, high)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None

    return convert


def moment_option(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime.datetime | None:
    """A click option's callback reading a moment (`parse_moment`) as an aware datetime (None when the
    option is not given)."""
    if value is None:
        return None
    try:
        return parse_moment(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
