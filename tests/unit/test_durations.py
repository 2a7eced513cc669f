"""jobpool/cli/durations.py: the one parser of durations and moments every CLI option taking one uses, and the
words jobpool/waiting.py says a waiting job's time in. Pure functions: no Redis."""

from __future__ import annotations

import datetime
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobpool.cli.durations import format_duration, parse_duration, parse_moment
from jobpool.contract import MAX_TIME_SECS
from jobpool.waiting import until_words, utc_text


@pytest.mark.parametrize(("text", "secs"), [
    ("90s", 90), ("10m", 600), ("2h", 7200), ("1d", 86400), ("1h30m", 5400), ("1d2h3m4s", 93784),
    ("45", 45), ("0", 0), ("0s", 0), ("366d", MAX_TIME_SECS), ("007m", 420),
])
def test_durations_people_type(text: str, secs: int) -> None:
    assert parse_duration(text) == secs


@pytest.mark.parametrize(("text", "why"), [
    ("", "is not a duration such as 90s"),
    ("h", "is not a duration"),
    ("10x", "is not a duration"),
    ("1.5h", "is not a duration"),  # whole seconds only: no fraction rounded behind the user's back
    ("10M", "is not a duration"),  # minutes are 'm'; an 'M' could be read as months
    ("1m1h", "is not a duration"),  # largest unit first
    ("5m5m", "is not a duration"),  # each unit once
    ("1h 30m", "is not a duration"),
    (" 10m", "is not a duration"),
    ("\uff11\uff10m", "is not a duration"),  # full-width digits: ASCII only
    ("-5m", "a duration is never negative"),
    ("-1", "a duration is never negative"),
    ("367d", "is out of range: from 0s to 366d"),
    ("9" * 50, "... (50 characters)"),  # a long refusal is cut, not repeated whole
])
def test_bad_durations_are_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_duration(text)


def test_a_duration_has_the_bounds_its_option_gives() -> None:
    assert parse_duration("1s", low=1) == 1
    with pytest.raises(ValueError, match=r"'0' is out of range: from 1s to 366d"):
        parse_duration("0", low=1)
    with pytest.raises(ValueError, match=r"from 0s to 1h"):
        parse_duration("61m", high=3600)


@given(st.integers(min_value=0, max_value=MAX_TIME_SECS))
def test_a_formatted_duration_reads_back_the_same(secs: int) -> None:
    assert parse_duration(format_duration(secs)) == secs


@pytest.mark.parametrize(("text", "utc"), [
    ("2026-12-03T02:00:00Z", "2026-12-03T02:00:00Z"),
    ("2026-12-03T02:00:00z", "2026-12-03T02:00:00Z"),
    ("2026-12-03 02:00+01:00", "2026-12-03T01:00:00Z"),
    ("2026-12-03T02:00:00.250-05:30", "2026-12-03T07:30:00Z"),
])
def test_moments_name_their_zone(text: str, utc: str) -> None:
    moment = parse_moment(text)
    assert moment.utcoffset() is not None
    assert utc_text(int(moment.timestamp() * 1000)) == utc


@pytest.mark.parametrize(("text", "why"), [
    ("2026-12-03T02:00:00", "names no time zone: add one (Z for UTC, or an offset such as +02:00)"),
    ("2026-12-03", "names no time zone"),
    ("tomorrow", "is not an ISO-8601 time such as 2026-12-03T02:00:00Z"),
    ("2026-13-03T02:00Z", "is not an ISO-8601 time"),
    ("", "is not an ISO-8601 time"),
])
def test_a_moment_without_a_zone_or_unreadable_is_refused(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_moment(text)


def test_the_words_of_a_wait() -> None:
    now = int(datetime.datetime(2026, 12, 3, tzinfo=datetime.timezone.utc).timestamp() * 1000)
    assert until_words(now + 400, now) == "in 1 s"
    assert until_words(now + 59_000, now) == "in 59 s"
    assert until_words(now + 10 * 60_000 + 5, now) == "in 10 min"
    assert until_words(now + 3 * 3600_000, now) == "in 3 h"
    assert until_words(now + 2 * 86400_000, now) == "in 2 d"
    assert until_words(now, now) == until_words(now - 5, now) == "due now"
    assert utc_text(now) == "2026-12-03T00:00:00Z"
