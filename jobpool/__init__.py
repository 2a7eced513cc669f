"""jobpool: long container jobs under a hard, fleet-wide concurrency limit, coordinated in Redis.

The one import surface: everything a user needs is importable from here.
"""

from .aio import AsyncPool
from .api import Pool
from .config import Settings
from .errors import (
    AlreadyExists,
    ConfigError,
    Conflict,
    CorruptRow,
    InvalidArgument,
    InvalidSpec,
    InvalidState,
    JobpoolError,
    JobTimeout,
    NotFound,
    NotOwner,
    NotReplicated,
    PoolTooNew,
    RedisUnavailable,
)
from .fleet.gone import forget_daemon, gone_daemons, unforget_daemon
from .fleet.markrecords import forget_collision
from .models import Job, JobState
from .schedules import Schedule
from .spec import JobSpec

__all__ = [
    # the API
    "Pool", "Job", "JobSpec", "JobState", "Settings", "forget_daemon", "gone_daemons", "unforget_daemon",
    "forget_collision", "Schedule", "AsyncPool",
    # errors
    "JobpoolError", "ConfigError", "InvalidSpec", "InvalidArgument", "NotFound", "InvalidState",
    "NotOwner", "Conflict", "AlreadyExists", "CorruptRow", "RedisUnavailable", "NotReplicated",
    "JobTimeout", "PoolTooNew",
]

