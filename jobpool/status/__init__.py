"""A pool's status as one typed report, and the health rules that judge it: what `Pool.status()` returns.

The CLI's `status`, the Python API and anything that serves a dashboard or metrics read this one report, so
they cannot disagree about what "healthy" means. It is read, never written: the facts come from the keys the
scripts, the workers' boot records and the supervisor's last-sweep record keep (docs/architecture.md, "The
Redis data model"). `to_dict()` is the JSON form `jobpool status --json` prints.

Three parts, by role: the report's types (`report`), the health rules (`health`), and its reading from Redis
(`read`); this package's names are the ones its readers use.
"""

from .health import SWEEP_GRACE_INTERVALS, judge
from .read import MAX_BOOTS, WORKER_JOBS, read_status
from .report import (
    Daemons,
    Health,
    Promotion,
    Queue,
    ReturnedDaemon,
    Slots,
    StaleDaemon,
    StatusReport,
    Sweep,
    UnknownHeld,
    Waiting,
    Worker,
    Workers,
    ago,
    coarse_span,
    safe_url,
)

__all__ = ["MAX_BOOTS", "SWEEP_GRACE_INTERVALS", "WORKER_JOBS", "Daemons", "Health", "Promotion", "Queue",
           "ReturnedDaemon", "Slots", "StaleDaemon", "StatusReport", "Sweep", "UnknownHeld", "Waiting",
           "Worker", "Workers", "ago", "coarse_span", "judge", "read_status", "safe_url"]
