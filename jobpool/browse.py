"""Paging through one state's jobs: what a reader that shows jobs a page at a time asks `Pool` for (the
dashboard, jobpool/dashboard/). Mixed into `Pool` (jobpool/api.py), so it is one more method of the one API.

A page is one read of the state's index (the same order `Pool.list` gives: queued and paused in queue
order, running by promotion, finished newest first) and one pipelined read of its rows; a job that moved on
or was pruned between the two is left out, so a page may be short. Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import errors
from .models import TERMINAL, Job, JobState
from .store.calls import Store

#: The most jobs on one page, and the furthest offset a caller may ask for.
MAX_PAGE = 1000
MAX_OFFSET = 100_000_000


@dataclass(frozen=True)
class JobPage:
    """One page of a state's jobs, and where it sits among them (`total` as counted with the page)."""

    state: JobState
    jobs: tuple[Job, ...]
    total: int
    offset: int
    limit: int

    @property
    def has_previous(self) -> bool:
        return self.offset > 0

    @property
    def has_next(self) -> bool:
        return self.offset + self.limit < self.total

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state.value, "total": self.total, "offset": self.offset, "limit": self.limit,
                "jobs": [j.to_dict() for j in self.jobs]}


def _whole(name: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise errors.InvalidArgument(f"{name} must be a whole number from {low} to {high}, got {value!r}")
    return value


class Browsing:
    """`Pool.page`; the attributes below are Pool's."""

    store: Store

    if TYPE_CHECKING:
        def _rows(self, ids: Iterable[str]) -> list[Job]: ...

    def page(self, state: str | JobState, offset: int = 0, limit: int = 50) -> JobPage:
        """Jobs `offset` to `offset + limit` of one state, in `list`'s order, and how many are in it."""
        try:
            st = JobState(state)
        except ValueError:
            names = ", ".join(s.value for s in JobState)
            raise errors.InvalidArgument(f"unknown state {state!r} (one of {names})") from None
        _whole("offset", offset, 0, MAX_OFFSET)
        _whole("limit", limit, 1, MAX_PAGE)
        total, ids = self.store.state_page(st.value, offset, limit, newest_first=st in TERMINAL)
        return JobPage(st, tuple(self._rows(ids)), total, offset, limit)
