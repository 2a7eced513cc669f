"""Whole numbers typed by people or read back from Redis, parsed so that bad text is one clear error.

`str.isdigit()` is true for characters `int()` refuses (superscripts such as "²", other scripts' digits),
and `int()` refuses a string of more than a few thousand digits with its own ValueError; either one let
through becomes a traceback (a bare 500 on the dashboard). So a whole number here is ASCII digits only, no
longer than its upper bound's, checked before `int()` runs.
"""

from __future__ import annotations

from typing import Any

from .errors import InvalidArgument

_ASCII_DIGITS = frozenset("0123456789")
#: How much of a refused value an error line repeats (a 5,000-digit value is not one clear line).
_SHOWN_CHARS = 40


def ascii_whole(text: Any, max_digits: int = 18) -> int | None:
    """`text` as a whole number when it is 1..`max_digits` ASCII digits, else None."""
    if not isinstance(text, str) or not 0 < len(text) <= max_digits or not _ASCII_DIGITS.issuperset(text):
        return None
    return int(text)


def shown(text: str) -> str:
    """`text` as an error line may repeat it: quoted, and cut when long."""
    if len(text) <= _SHOWN_CHARS:
        return repr(text)
    return f"{text[:_SHOWN_CHARS]!r}... ({len(text)} characters)"


def parse_whole(name: str, text: str, low: int, high: int) -> int:
    """`text` as a whole number from `low` to `high`, or InvalidArgument naming `name`."""
    value = ascii_whole(text, len(str(high)))
    if value is None or not low <= value <= high:
        raise InvalidArgument(f"{name} must be a whole number from {low} to {high}, got {shown(text)}")
    return value
