"""Every Redis key name jobpool uses, in one place.

All of a pool's keys share the hash tag ``{<pool>}`` so each script touches one cluster slot. RQ's own keys
(its queue list, its job hashes, its queue registry) keep RQ's names, so RQ's workers and `rq info` see them.
"""

from __future__ import annotations

import hashlib
import re

from rq.registry import FailedJobRegistry, FinishedJobRegistry
from rq.results import get_key as rq_results_key

from ..contract import RQ_JOB_PREFIX, RQ_QUEUE_PREFIX
from ..errors import ConfigError

#: Matched whole (`fullmatch`): with `match`, a `$` would let a trailing newline through.
POOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
RQ_QUEUES = "rq:queues"
#: A pool's RQ queue is named this prefix and the pool's name.
RQ_QUEUE_NAME_PREFIX = "jobpool-"
#: How many hex digits of a digest of a daemon's identity name its own queue (`PoolKeys.daemon_queue_name`).
DAEMON_QUEUE_DIGITS = 16
#: The end of a daemon's own queue's name, after its pool's queue name.
DAEMON_QUEUE_SUFFIX = re.compile(rf"\.d-[0-9a-f]{{{DAEMON_QUEUE_DIGITS}}}$")

#: The state indexes, one sorted set each; every job is in exactly one.
STATE_INDEX_NAMES = ("queued", "waiting", "running", "paused", "succeeded", "failed", "cancelled")
#: Each state's index, as a pool key name (POOL_KEY_NAMES): what `PoolKeys.state_index` gives and what a
#: script's STATE_INDEX places (jobpool/store/luatext.py).
STATE_INDEX_KEYS = {"queued": "queued", "waiting": "waiting", "running": "running", "paused": "paused_jobs",
                    "succeeded": "succeeded", "failed": "failed", "cancelled": "cancelled"}
#: The pool keys a script may name on its header's `Pool keys:` line (scripts/_lib.lua says what each
#: holds), as `PoolKeys.named` gives them: attributes of PoolKeys, and RQ's registry of queues.
POOL_KEY_NAMES = ("config", "paused", "queued", "running", "coalesce", "events", "rq_queue", "rq_queues",
                  "seq", "paused_jobs", "succeeded", "failed", "cancelled", "metrics", "ready", "blocked",
                  "passed", "wake", "fair", "limits", "limit_used", "holds", "waiting", "dependents", "deps",
                  "schedules", "schedule_ticks", "schedule_next", "running_by", "running_daemons",
                  "running_on", "last_sweep", "trends")


def worker_name(pool: str, boot_id: str) -> str:
    """The RQ worker name of a jobpool worker boot: how an RQ job's `worker_name` leads back to the boot
    whose record says whether that worker lives (supervisor/adoption.py)."""
    return f"jobpool-{pool}-{boot_id[:12]}"


def validate_pool_name(name: str) -> str:
    if not isinstance(name, str) or not POOL_NAME.fullmatch(name):
        raise ConfigError(
            f"JOBPOOL_POOL: {name!r} is not a pool name (1-64 of letters, digits, '_', '.', '-')"
        )
    return name


class PoolKeys:
    """Key names for one pool."""

    def __init__(self, pool: str) -> None:
        self.pool = validate_pool_name(pool)
        self.prefix = f"jobpool:{{{pool}}}:"
        p = self.prefix
        self.config = p + "config"
        self.paused = p + "paused"
        self.queued = p + "queued"
        self.running = p + "running"
        self.coalesce = p + "coalesce"
        self.events = p + "events"
        self.seq = p + "seq"
        self.paused_jobs = p + "state:paused"
        self.succeeded = p + "state:succeeded"
        self.failed = p + "state:failed"
        self.cancelled = p + "state:cancelled"
        self.boots = p + "boots"
        self.last_sweep = p + "last_sweep"
        #: The pool's history: one point per `Settings.trend_secs`, in a field per position of a ring of
        #: TREND_POINTS (contract.py), so a fixed size whatever the load (jobpool/trends.py,
        #: scripts/trend_sample.lua). Never removed by retention: it is no job's.
        self.trends = p + "trends"
        #: The pool's counters and histogram buckets (jobpool/metrics.py): a fixed, bounded set of fields,
        #: incremented by the scripts as they make each transition and by the supervisor after each sweep.
        #: Never removed by retention: it is no job's.
        self.metrics = p + "metrics"
        #: Every Docker daemon whose inventory was published lately: daemon identity -> when last (ms, Redis
        #: time). Bounded by the daemons of the fleet (entries older than a week are trimmed by the script).
        self.inventories = p + "inventories"
        #: daemon identity -> JSON {at, actor, note}: daemons an operator declared gone for good
        #: (scripts/forget_daemon.lua). Grows only by such declarations.
        self.gone_daemons = p + "gone_daemons"
        #: Declarations lifted, by a daemon that published again or by hand (scripts/unforget_daemon.lua):
        #: JSON records scored by when (ms), kept a week (jobpool/fleet/gone.py), shown by `status`.
        self.returned_daemons = p + "returned_daemons"
        #: The random id of the `jobpool up` stack that started this Redis (jobpool/up/stack.py), also in its
        #: state file: how another shell tells that Redis from another one on the same port
        #: (jobpool/up/follow.py).
        self.up_stack = p + "up_stack"
        #: Every process that marked its Docker daemon (jobpool/fleet/daemonmark.py): process id -> its last
        #: refresh (ms, Redis time). Bounded by the fleet (entries long expired are trimmed by the script).
        self.daemon_marks = p + "daemon_marks"
        #: Who holds the turn to index the records of processes that do not index their own (an earlier
        #: release's: scripts/daemon_mark.lua, daemon_mark_index.lua): its process id, for a period.
        self.daemon_marks_scan = p + "daemon_marks_scan"
        #: Daemon identities two Docker daemons were found to share (jobpool/fleet/daemonmark.py): identity ->
        #: JSON {line, at, by}, written by scripts/daemon_collision.lua when a process concludes a collision,
        #: removed only by an operator (scripts/forget_collision.lua). Bounded by the fleet's identities.
        self.shared_daemons = p + "shared_daemons"
        # Order and limits (scripts/_lib.lua "Order and limits"; docs/architecture.md).
        #: The queued jobs that may be promoted, by order (priority band, then turn): `queued` less parked.
        self.ready = p + "ready"
        #: Queued jobs that cannot start now, parked under what they wait for (members, compared as text).
        self.blocked = p + "blocked"
        #: Jobs passed over, by when first: where the reservation is taken from.
        self.passed = p + "passed"
        #: Ranges of `blocked` to wake, each with where its reading stopped.
        self.wake = p + "wake"
        #: Fair share's turns: per priority the turn reached, per group with jobs queued its newest turn.
        self.fair = p + "fair"
        #: The named limits: name or pattern (a prefix and '*') -> size.
        self.limits = p + "limits"
        #: Units in use: per name, and per definition ('=' + the name or pattern).
        self.limit_used = p + "limit_used"
        #: What each running job holds beyond one plain slot: id -> 'weight|uses'.
        self.holds = p + "holds"
        # Time and dependencies (scripts/_lib.lua "Time and dependencies"; docs/architecture.md).
        #: The waiting jobs' index: id -> when to look at it again (ms; +inf: only jobs it waits for hold it).
        self.waiting = p + "state:waiting"
        #: Who waits for whom: members '<dependency id> <dependent id>' (every score 0, compared as text), so
        #: one job's dependents are one range. A job named here as a dependency is never pruned.
        self.dependents = p + "dependents"
        #: Per waiting dependent: '<id>' -> how many of its dependencies have not succeeded yet, and
        #: 'x:<id>' -> the first of them that failed or was cancelled.
        self.deps = p + "deps"
        #: Schedules: name -> JSON definition (jobpool/schedules.py writes it through its scripts).
        self.schedules = p + "schedules"
        #: Per schedule, its last tick fired or skipped: name -> 'tick ms|job id|at ms'.
        self.schedule_ticks = p + "schedule_ticks"
        #: Per schedule, when its next tick is due: name -> ms.
        self.schedule_next = p + "schedule_next"
        # Where the running jobs are (scripts/_lib.lua `place_running`; docs/architecture.md "Status at
        # scale"): what `status` reports per worker and per daemon, kept by the scripts, so that reading it
        # costs what the workers and daemons are, not what runs.
        #: 'b:<boot>' -> the running ids it owns (space-separated); 'j:<id>' -> '<owner> <daemon>' as placed.
        self.running_by = p + "running_by"
        #: Daemon identity -> how many running rows are on it (claimed there, or promoted to wait for it).
        self.running_daemons = p + "running_daemons"
        #: '<daemon> <id>' for each of those rows, every score 0: one daemon's rows are one range.
        self.running_on = p + "running_on"
        self.rq_queue_name = RQ_QUEUE_NAME_PREFIX + pool
        self.rq_queue = RQ_QUEUE_PREFIX + self.rq_queue_name
        self.rq_intermediate = self.rq_queue + ":intermediate"
        #: RQ's registries of finished and failed deliveries (RQ's names, from RQ itself).
        self.rq_finished = FinishedJobRegistry.key_template.format(self.rq_queue_name)
        self.rq_failed = FailedJobRegistry.key_template.format(self.rq_queue_name)
        self.rq_queues = RQ_QUEUES

    def named(self, names: tuple[str, ...]) -> list[str]:
        """The keys of `names` (POOL_KEY_NAMES), in that order: what a script's `Pool keys:` line asks for."""
        return [getattr(self, name) for name in names]

    def state_index(self, state: str) -> str:
        return str(getattr(self, STATE_INDEX_KEYS[state]))

    def job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def lease(self, job_id: str) -> str:
        return f"{self.prefix}lease:{job_id}"

    def job_log(self, job_id: str) -> str:
        """A job's live log: what its attempts printed while they ran (stream; scripts/log_append.lua)."""
        return f"{self.prefix}joblog:{job_id}"

    def log_watch(self, job_id: str) -> str:
        """Present (string + TTL) while someone reads a job's live log: its worker then sends it every
        second (jobpool/livelogs.py keeps it; heartbeat.lua reads it)."""
        return f"{self.prefix}logwatch:{job_id}"

    def adoption(self, job_id: str) -> str:
        """The RQ job id of the latest adoption request for a job (supervisor/adoption.py)."""
        return f"{self.prefix}adopt:{job_id}"

    def inventory(self, daemon_id: str) -> str:
        """One Docker daemon's latest inventory (hash + TTL; jobpool/fleet/inventory.py)."""
        return f"{self.prefix}inventory:{daemon_id}"

    def inventory_lead(self, daemon_id: str) -> str:
        """Which worker boot publishes a daemon's inventory (string + TTL, renewed by its holder)."""
        return f"{self.prefix}inventory_lead:{daemon_id}"

    def commands(self, daemon_id: str) -> str:
        """Commands routed to one Docker daemon's workers (list + TTL; jobpool/daemoncommands.py)."""
        return f"{self.prefix}commands:{daemon_id}"

    def daemon_queue_name(self, daemon_id: str) -> str:
        """The RQ queue only the workers on one Docker daemon listen on (adoption requests for that daemon).
        Named by a digest of the identity: RQ's key names must not hold the identity's ':'."""
        digest = hashlib.sha256(daemon_id.encode()).hexdigest()[:DAEMON_QUEUE_DIGITS]
        return f"{self.rq_queue_name}.d-{digest}"

    def daemon_queue(self, daemon_id: str) -> str:
        """The RQ list key of `daemon_queue_name`: where a job with an affinity to that daemon is pushed
        (scripts/_lib.lua, promote_candidates)."""
        return RQ_QUEUE_PREFIX + self.daemon_queue_name(daemon_id)

    def daemon_mark(self, process_id: str) -> str:
        """One process that marked its Docker daemon (hash + TTL; jobpool/fleet/daemonmark.py)."""
        return f"{self.prefix}daemon_mark:{process_id}"

    def daemon_mark_v(self, process_id: str) -> str:
        """The `v` of a process's mark record, kept apart (string + TTL, as long as the record;
        scripts/_lib.lua `write_mark`): what a process comparing marks reads of its peers each period, in
        one MGET."""
        return f"{self.prefix}daemon_mark_v:{process_id}"

    def daemon_marks_of(self, daemon_id: str) -> str:
        """The processes that marked a daemon of identity `daemon_id`, scored by when their record expires
        (zset; scripts/daemon_mark.lua): what a process comparing marks reads."""
        return f"{self.prefix}daemon_marks_of:{daemon_id}"

    def boot(self, boot_id: str) -> str:
        return f"{self.prefix}boot:{boot_id}"

    def boot_json(self, boot_id: str) -> str:
        """The same boot record as one JSON string, written and expiring with `boot` (store/workerio.py): a
        status read takes a thousand of them in one MGET (store/statusreads.py)."""
        return f"{self.prefix}boot_json:{boot_id}"

    @staticmethod
    def rq_job(job_id: str) -> str:
        return RQ_JOB_PREFIX + job_id

    @staticmethod
    def rq_results(job_id: str) -> str:
        """RQ's stream of a job's delivery results (RQ's name)."""
        return str(rq_results_key(job_id))

    def leftovers(self, job_id: str) -> list[str]:
        """Every key a finished job may leave, its row first, in the order scripts/prune.lua takes them."""
        return [self.job(job_id), self.rq_job(job_id), self.rq_results(job_id), self.lease(job_id),
                self.adoption(job_id), self.job_log(job_id)]
