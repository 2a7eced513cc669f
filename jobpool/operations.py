"""`PoolOperations`: the public operations of a pool as its user surfaces call them (the CLI, jobpool/cli/;
the dashboard, jobpool/dashboard/).

They are `Pool`'s own methods (jobpool/api.py), named here so that a surface depends on what it calls
rather than on the class: only the place that makes a pool (`Pool.from_settings` in cli/app.py and
dashboard/server.py) names `Pool`. What a surface does below the public API (an operator's sweep, stopping
an orphan, declaring a daemon gone) takes the pool's `store` (jobpool/store/calls.py).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

if TYPE_CHECKING:
    from .browse import JobPage
    from .config import Settings
    from .models import Job, JobState
    from .retention import PruneReport
    from .schedules import Schedule
    from .status import StatusReport
    from .store.calls import Store
    from .store.orderreads import LimitUse
    from .trends import TrendPoint


class PoolOperations(Protocol):
    """A pool as its user surfaces see it: its settings, who it acts as, its store, and the public API."""

    settings: Settings
    #: Who is recorded in events for its actions ("cli", "dashboard:<client>", ...).
    actor: str
    store: Store

    def enqueue(self, image: str, command: Sequence[str], env: dict[str, str] | None = None,
                coalesce: bool = False, coalesce_key: str | None = None, **spec: Any) -> Job: ...

    def retry(self, job_id: str) -> Job: ...

    def enqueue_many(self, specs: Iterable[Mapping[str, Any]],
                     batch_size: int = ...) -> builtins.list[Job]: ...

    def get(self, job_id: str, coalesced: bool = False) -> Job: ...

    def list(self, state: str | JobState | None = None, limit: int = 100) -> builtins.list[Job]: ...

    def page(self, state: str | JobState, offset: int = 0, limit: int = 50) -> JobPage: ...

    @overload
    def logs(self, job_id: str, follow: Literal[False] = False) -> str: ...

    @overload
    def logs(self, job_id: str, follow: Literal[True]) -> Iterator[str]: ...

    def slots(self) -> tuple[int, int]: ...

    def stats(self) -> dict[str, Any]: ...

    def trends(self) -> builtins.list[TrendPoint]: ...

    def tail_events(self, job_id: str | None = None,
                    count: int = 20) -> tuple[builtins.list[dict[str, str]], str]: ...

    def follow_events(self, job_id: str | None = None, after: str | None = None,
                      block_secs: float = 1.0) -> Iterator[dict[str, str]]: ...

    def prune(self, dry_run: bool = False) -> PruneReport: ...

    def now_ms(self) -> int: ...

    def boot_is_live(self, boot_id: str) -> bool: ...

    def status(self) -> StatusReport: ...

    def cancel(self, job_id: str, reason: str = "") -> Job: ...

    def pause(self, job_id: str | None = None, reason: str = "") -> Job | None: ...

    def resume(self, job_id: str | None = None, anywhere: bool = False) -> Job | None: ...

    def set_slots(self, n: int) -> int: ...

    def set_limit(self, name: str, n: int) -> int | None: ...

    def remove_limit(self, name: str) -> int: ...

    def limits(self) -> builtins.list[LimitUse]: ...

    def why_waiting(self, job_id: str) -> builtins.list[str]: ...

    def add_schedule(self, name: str, *, cron: str | None = None, every: float | None = None, tz: str = "UTC",
                     misfire: str = "once", overlap: str = "skip", replace: bool = False,
                     **job: Any) -> Schedule: ...

    def schedules(self) -> builtins.list[Schedule]: ...

    def remove_schedule(self, name: str) -> None: ...

    def pause_schedule(self, name: str) -> Schedule: ...

    def resume_schedule(self, name: str) -> Schedule: ...
