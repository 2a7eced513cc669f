"""The exceptions jobpool raises: one root, one class per thing a caller may want to handle.

Redis connection failures are wrapped as `RedisUnavailable` (``from None``) so callers never need to import
redis-py to handle "the pool is unreachable".
"""

from __future__ import annotations


class JobpoolError(Exception):
    """Root of every error jobpool raises on purpose.

    An error `Pool.enqueue_many` raises once it has begun sending batches says what stands, on the exception
    as in its message (jobpool/submit.py): `enqueued`, how many of the input's first jobs are queued (a job
    that coalesced into a queued job counts), and `unknown`, the ids of the jobs after them whose batch was
    sent but whose outcome Redis could not be asked (a lost reply, then no Redis) or could still change
    (`NotReplicated`): all of them were enqueued or none. A caller resumes from item `enqueued` once it has
    looked for those ids (`Pool.get`, `jobpool show <id>`). Any other error leaves `enqueued` None and
    `unknown` empty."""

    #: How many of `enqueue_many`'s input's first jobs are enqueued; None for an error from elsewhere.
    enqueued: int | None = None
    #: The ids of the batch after those whose outcome is unknown, in input order; () when it is known.
    unknown: tuple[str, ...] = ()


class ConfigError(JobpoolError, ValueError):
    """A setting (an environment variable or flag) is out of range; the message names it."""


class InvalidSpec(JobpoolError, ValueError):
    """A job spec was refused before anything was written. In a batch (`Pool.enqueue_many`), `index` is the
    refused spec's position in the input (from 0) and the message starts with it; `reason` is the message
    without it."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message if index is None else f"spec {index}: {message}")
        self.reason = message
        self.index = index


class NotFound(JobpoolError, LookupError):
    """No job with that id in this pool: never there, or a finished job pruned after its retention."""


#: What every "no such job" says: a finished job is removed once past retention (jobpool/retention.py), so
#: an id that worked last week may be gone for that reason alone.
NOT_FOUND_HINT = "(never enqueued, or finished and pruned past retention: JOBPOOL_KEEP_*)"


def no_job(job_id: object) -> str:
    return f"no job {job_id} in this pool {NOT_FOUND_HINT}"


class InvalidState(JobpoolError):
    """The transition is not legal from the job's current state (resume a running job, cancel a finished
    one)."""

    def __init__(self, message: str, state: str | None = None) -> None:
        super().__init__(message)
        self.state = state


class NotOwner(JobpoolError):
    """A fenced write came from a (boot, attempt) that no longer owns the row; nothing was written."""


class Conflict(JobpoolError):
    """A compare-and-set failed: the row changed after the evidence was read. Nothing was written."""


class AlreadyExists(JobpoolError):
    """A job with that id exists already."""


class CorruptRow(JobpoolError):
    """A job row (or another of the pool's keys) holds something jobpool cannot read: edited by hand, or
    written by another program. `job_id` and `field` say where, when known. Readers skip such rows; a script
    that meets one leaves it alone or takes it out of the queue, and says so in the event stream."""

    def __init__(self, message: str, job_id: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.field = field


class RedisUnavailable(JobpoolError, ConnectionError):
    """Redis could not be reached or answered with a server error."""


class NotReplicated(RedisUnavailable):
    """A state change the primary applied but fewer replicas than JOBPOOL_REDIS_WAIT_REPLICAS acknowledged
    in time: a failover now could lose it, so it is not acknowledged (handle it as a lost reply)."""


class JobTimeout(JobpoolError, TimeoutError):
    """`Pool.wait` gave up before the job reached the state waited for."""


class PoolTooNew(JobpoolError):
    """The pool's Redis holds a layout of keys and rows newer than this release knows
    (jobpool/store/schema.py): nothing was written; upgrade jobpool on this host."""


class InvalidArgument(JobpoolError, ValueError):
    """An argument to an API call is out of range (a negative slot count, an empty id)."""
