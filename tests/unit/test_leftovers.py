"""Which ended containers the supervisor may remove (supervisor/volumes.py): only those of an attempt that is
over, so an exit nobody has recorded yet is never taken away from the worker or the supervisor judging it."""

from __future__ import annotations

import pytest

from jobpool.supervisor.volumes import _attempt_over


@pytest.mark.parametrize(("row", "attempt", "over"), [
    ([None, None], "3", True),              # no row: pruned, or never anyone's
    (["running", "3"], "3", False),         # the attempt runs: its exit is not recorded yet
    (["running", "4"], "3", True),          # a later attempt runs: this one was judged
    (["queued", "3"], "3", True),           # handed back or recovered: judged
    (["paused", "3"], "3", True),
    (["succeeded", "3"], "3", True),
    (["queued", "2"], "3", False),          # the row is behind the container (a Redis rollback): keep
    (["running", "2"], "3", False),
    (["failed", "2"], "3", True),           # an ended job is never judged again
    (["running", "3"], "x", False),         # a label that is not an attempt number: keep
])
def test_attempt_over(row: list[str | None], attempt: str, over: bool) -> None:
    assert _attempt_over(row, attempt) is over
