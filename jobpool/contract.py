"""The cross-layer contract: every name and number that more than one side of jobpool must agree on.

Workers write these (container labels, the environment of a job), the supervisor reads them back (it finds
a container by its labels alone), the Lua scripts judge by them (the tempfail exit code, the slot ceiling,
the state names), and jobs rely on them (docs/architecture.md, 'The container contract'). A name spelt two
ways on two sides fails silently: a label renamed on the worker side makes every probe answer "absent", the
one mistake that could hand a slot to a second writer. So each is defined here once and imported; the Lua
scripts, which cannot import, get the values they use prepended as generated constants (`lua_constants`,
loaded by jobpool/store/runner.py).
"""

from __future__ import annotations

import enum
import re

# ---- container labels: how the supervisor finds a job's container without its worker ---------------------

#: Every label jobpool sets starts with this; a job spec may not set one (jobpool/spec.py).
LABEL_PREFIX = "jobpool."
LABEL_POOL = "jobpool.pool"
LABEL_JOB = "jobpool.job_id"
LABEL_ATTEMPT = "jobpool.attempt"
LABEL_BOOT = "jobpool.boot_id"

# ---- the environment a job is started with -------------------------------------------------------------

ENV_JOB_ID = "JOBPOOL_JOB_ID"
ENV_ATTEMPT = "JOBPOOL_ATTEMPT"
ENV_POOL = "JOBPOOL_POOL"
#: A directory that survives the job's attempts (a volume per job for Docker), removed when the job ends.
ENV_CHECKPOINT_DIR = "JOBPOOL_CHECKPOINT_DIR"

# ---- exits, limits, states -----------------------------------------------------------------------------

#: EX_TEMPFAIL (sysexits.h): the job's "interrupted at a unit-of-work boundary, resumable". Found by the
#: supervisor it hands the job back to its place, no recovery budget spent (scripts/reconcile_apply.lua).
EXIT_TEMPFAIL = 75
#: The largest fleet-wide slot limit accepted anywhere (settings, the API, `jobpool slots`, set_slots.lua).
MAX_SLOTS = 100_000
#: A job's priority is a whole number from -MAX_PRIORITY to MAX_PRIORITY, higher first (default 0).
MAX_PRIORITY = 1000
#: How many units of one named limit a job may ask for, and the most a limit may be set to.
MAX_LIMIT = 1_000_000
#: A limit's or a group's name: letters, digits and ``_ . : / @ -``, at most LIMIT_NAME_MAX_CHARS; a limit may
#: also be a pattern, such a name (not empty) followed by ``*``. The scripts separate fields by other
#: characters (scripts/_lib.lua "Order and limits").
LIMIT_NAME_CHARS = "A-Za-z0-9_.:/@-"
LIMIT_NAME_MAX_CHARS = 128
#: The most retries a job may ask for, and the longest time limit, retry delay or delayed start (seconds).
MAX_RETRIES = 1000
MAX_TIME_SECS = 366 * 86400
#: A job's first retry waits this long by default (seconds), each retry after it twice the one before.
RETRY_DELAY_SECS = 10
#: The default of JOBPOOL_RETRY_DELAY_MAX_SECS: no retry waits longer.
RETRY_DELAY_MAX_SECS = 3600
#: The most jobs one job may wait for (`after`).
MAX_AFTER = 256
#: The layout of keys and rows this release writes and reads (jobpool/store/schema.py): raised by a release
#: that changes it, with its step in jobpool/migrate.py. 1: jobpool 0.1.0's, which recorded none.
SCHEMA_VERSION = 1
#: The default of JOBPOOL_RESERVE_AFTER_SECS: a queued job passed over this long gets a reservation.
RESERVE_AFTER_SECS = 300
#: About how many entries the pool's event stream keeps by default (XADD MAXLEN ~ in scripts/_lib.lua; the
#: setting JOBPOOL_EVENTS_MAXLEN, config.py).
EVENTS_MAXLEN = 100_000
#: The most bytes of an event's free text (its reason, evidence and actor, each): a longer one is cut on a
#: UTF-8 boundary and ends with a mark saying how many bytes went ("…(N bytes cut)"; scripts/_lib.lua
#: `bounded_text`), in the stream and in the job's history alike. The API refuses a reason or evidence of more
#: than half of it (jobpool/api.py), so what a caller gives is kept whole even with the words a script puts
#: before it; only the texts jobpool writes itself (a launch error, a probe's evidence) are ever cut.
EVENT_TEXT_MAX_BYTES = 8192
#: How much of a job's own history its row keeps (scripts/_lib.lua `trim_history`): all of it up to this size,
#: which holds every event of an ordinary job's life many times over. A job that goes on changing state for
#: ever (pause and resume) keeps its first HISTORY_HEAD_EVENTS events and its newest, and one event between
#: them, reason REASON_HISTORY_TRIMMED, saying how many events were dropped there, their stream ids and times.
HISTORY_MAX_BYTES = 65_536
#: The events at the start of a job's history that are never dropped: its enqueue and, for a job that ran,
#: its first promotion and claim.
HISTORY_HEAD_EVENTS = 3
#: The reason of the one event in a job's history that stands for the events dropped from it.
REASON_HISTORY_TRIMMED = "history_trimmed"
#: The key in an RQ job's meta that carries the attempt it dispatches (written by the scripts on promotion,
#: read by the worker before it claims).
RQ_META_ATTEMPT = "jobpool_attempt"
#: How the RQ job id of an adoption request begins, before `<job id>-` (jobpool/supervisor/adoption.py);
#: the prune script checks a request's hash is the job's by it (scripts/prune.lua).
ADOPT_RQ_PREFIX = "jobpool-adopt-"
#: RQ's key of a job hash, before the RQ job id (RQ's own naming; jobpool/store/keys.py).
RQ_JOB_PREFIX = "rq:job:"
#: RQ's prefix of a queue's list key (RQ's name): a job's `origin` is its queue's key less this.
RQ_QUEUE_PREFIX = "rq:queue:"
#: The largest inventory of one Docker daemon a publisher may write (its containers as JSON;
#: jobpool/fleet/inventory.py, scripts/publish_inventory.lua): a publisher with more leaves entries out and
#: says the inventory is incomplete.
INVENTORY_MAX_BYTES = 1_000_000
#: The most commands routed to one daemon that wait for its workers (jobpool/daemoncommands.py); the oldest
#: go.
COMMANDS_MAX = 512

# ---- how an attempt ended when its own process did not end it (jobpool/exits.py) -------------------

#: The exit code Docker records when the exit status could not be read (containerd's "unknown exit status"):
#: a restarted daemon that finds a container's shim gone records it. A job may also exit 255 itself.
EXIT_UNKNOWN = 255
#: error_reason of a job whose container the kernel's OOM killer ended (Docker's State.OOMKilled): failed,
#: since only more memory (the spec's `memory`) or less use makes it pass.
REASON_OOM_KILLED = "oom_killed"
#: error_reason of an attempt stopped for running longer than its spec's `timeout` (retried while retries are
#: left, as a failed exit is).
REASON_TIMEOUT = "timeout"
#: error_reason of a job cancelled because a job it waited for (`after`) failed or was cancelled.
REASON_DEPENDENCY_FAILED = "dependency_failed"
#: error_reason of an attempt whose exit a restart of its daemon recorded as EXIT_UNKNOWN: the job's own exit
#: was lost; recovered as a crash (recovery budget), not failed.
REASON_RESTART_LOST_EXIT = "daemon_restart_lost_exit"
#: error_reason of an attempt that a daemon running without live-restore stopped as it restarted: recovered
#: as a crash.
REASON_RESTART_STOPPED = "daemon_restart_stopped_container"
#: error_reason of an attempt whose container a reboot of its host ended (it started before the host's
#: current boot, and the daemon started since recorded its end): recovered as a crash.
REASON_HOST_REBOOTED = "host_rebooted"
#: error_reason of an attempt whose container a removal under it killed (`docker rm -f`: Docker marks it
#: as being removed, then kills it) and could not finish, leaving it `dead` (a file Docker could not delete):
#: the kill was the removal's, not the job's; recovered as a crash.
REASON_CONTAINER_REMOVED = "container_removed"


class JobState(str, enum.Enum):
    """A job's state as stored in its row's `state` field and named by its state index
    (jobpool/store/keys.py)."""

    QUEUED = "queued"
    #: Held by time (a delayed start, a retry's delay) or by the jobs it waits for: holds no slot.
    WAITING = "waiting"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

# ---- the pool's counters (the `metrics` hash, jobpool/store/keys.py; served by jobpool/metrics.py) -------

#: The reasons a transition is counted under (`jobpool_transitions_total{reason}`): every reason jobpool
#: itself writes. A label value must come from a bounded set, so scripts/_lib.lua counts `exit_code_<N>` as
#: `exit_code_nonzero`, a reason with a detail after a colon (`launch_failed: ...`) by the word before it, and
#: anything else (a free-text reason given to `Pool.evict`) as `other`. The job's own row keeps the real one.
METRIC_REASONS = (
    "enqueued", "promoted", "claimed", "adopted", "redispatched", "dropped_corrupt_row", "dropped_ghost",
    "cancel", "cancel_requested", "pause", "pause_requested", "pause_withdrawn", "resume",
    "affinity_released",
    "queue_paused", "queue_resumed", "slots_set", "limit_set", "limit_removed", "pruned",
    "exit_0", "exit_code_nonzero", "shutdown_handback", "pause_withdrawn_handback", REASON_OOM_KILLED,
    REASON_RESTART_LOST_EXIT, REASON_RESTART_STOPPED, REASON_HOST_REBOOTED, REASON_CONTAINER_REMOVED,
    "launch_failed", "host_fault",
    "bad_spec", "retry", "wait_over", REASON_DEPENDENCY_FAILED, REASON_TIMEOUT, "retried", "schedule_skipped",
    "schedule_set", "schedule_removed", "schedule_paused", "schedule_resumed",
    "evicted", "stale_evicted",
    "orphan_reconciled_no_container", "orphan_reconciled_dead_pid", "orphan_reconciled_never_started",
    "container_exited", "lost_dispatch", "stop_routed", "remote_stopped", "remote_stop_failed",
    "stray_stopped", "daemon_forgotten", "daemon_back", "daemon_unforgotten",
    "daemon_collision", "daemon_collision_cleared", REASON_HISTORY_TRIMMED, "other",
)
#: Upper bounds (seconds) of `jobpool_job_duration_seconds`, from enqueue to the terminal state: jobs run for
#: minutes to hours. The scripts count each job in the first bucket that holds it (+Inf past the last).
JOB_DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400)
#: The pool's history (jobpool/trends.py): how many points it keeps, one per `Settings.trend_secs` (a day
#: of minutes by default), so its size is fixed whatever the load; and how many of the jobs that ended in a
#: point's span, per terminal state, are read for its wait and run time percentiles (a bounded sample).
TREND_POINTS = 1440
TREND_SAMPLE_JOBS = 200
#: A running job's live log (jobpool/livelogs.py, workers/livelog.py, scripts/log_append.lua). Its worker
#: reads what the job printed every `LIVE_LOG_POLL_SECS` while someone follows it (a reader keeps the job's
#: `logwatch` key for `LIVE_LOG_WATCH_SECS`, and the heartbeat tells the worker), else every
#: `LIVE_LOG_IDLE_SECS`: so a job nobody watches costs Redis one append in ten seconds, not ten. A read
#: takes at most `LIVE_LOG_READ_LINES` lines and sends at most `LIVE_LOG_RATE_BYTES` of them per second it
#: covers, in one fenced append: a job that prints faster costs its worker and Redis no more, and what was
#: not sent is said to be dropped, in the log itself. The stream keeps about the newest `LIVE_LOG_CAP_BYTES`
#: (one append more at most), and lives `LIVE_LOG_LINGER_SECS` after the attempt's last append (its row's
#: log tail is the record of a finished job), or until the job's row is pruned.
LIVE_LOG_POLL_SECS = 1.0
LIVE_LOG_IDLE_SECS = 10.0
LIVE_LOG_WATCH_SECS = 10.0
LIVE_LOG_READ_LINES = 256
LIVE_LOG_RATE_BYTES = 16 * 1024
LIVE_LOG_CAP_BYTES = 256 * 1024
LIVE_LOG_LINGER_SECS = 600
#: Upper bounds (milliseconds) of `jobpool_sweep_duration_seconds`, written by the supervisor after a sweep.
SWEEP_DURATION_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)

# ---- what the Lua scripts get of this --------------------------------------------------------------------

#: Lua name -> value, each given to the scripts that name it as ``local NAME = value``
#: (jobpool/store/luatext.py).
LUA_CONSTANTS: dict[str, int | str | tuple[int | str, ...]] = {
    "EXIT_TEMPFAIL": EXIT_TEMPFAIL,
    "SCHEMA_VERSION": SCHEMA_VERSION,
    "MAX_SLOTS": MAX_SLOTS,
    "MAX_PRIORITY": MAX_PRIORITY,
    "MAX_LIMIT": MAX_LIMIT,
    "LIMIT_NAME_CHARS": LIMIT_NAME_CHARS,
    "LIMIT_NAME_MAX_CHARS": LIMIT_NAME_MAX_CHARS,
    "EVENTS_MAXLEN": EVENTS_MAXLEN,
    "EVENT_TEXT_MAX_BYTES": EVENT_TEXT_MAX_BYTES,
    "HISTORY_MAX_BYTES": HISTORY_MAX_BYTES,
    "HISTORY_HEAD_EVENTS": HISTORY_HEAD_EVENTS,
    "REASON_HISTORY_TRIMMED": REASON_HISTORY_TRIMMED,
    "RQ_META_ATTEMPT": RQ_META_ATTEMPT,
    "RQ_QUEUE_KEY_PREFIX": RQ_QUEUE_PREFIX,
    "ADOPT_RQ_PREFIX": ADOPT_RQ_PREFIX,
    "INVENTORY_MAX_BYTES": INVENTORY_MAX_BYTES,
    "COMMANDS_MAX": COMMANDS_MAX,
    "REASON_OOM_KILLED": REASON_OOM_KILLED,
    "REASON_TIMEOUT": REASON_TIMEOUT,
    "REASON_DEPENDENCY_FAILED": REASON_DEPENDENCY_FAILED,
    "METRIC_REASONS": METRIC_REASONS,
    "JOB_DURATION_BUCKETS": JOB_DURATION_BUCKETS,
    "TREND_POINTS": TREND_POINTS,
}
_LUA_STRING = re.compile(r"[A-Za-z0-9_.:/@-]*")


def _lua_literal(value: int | str | tuple[int | str, ...]) -> str:
    if isinstance(value, tuple):  # a Lua array (a sequence: ipairs reads it)
        return "{" + ", ".join(_lua_literal(v) for v in value) + "}"
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"no Lua literal for {value!r}")
    if isinstance(value, int):
        return str(value)
    if not _LUA_STRING.fullmatch(value):  # nothing that would need escaping
        raise ValueError(f"not a plain Lua string: {value!r}")
    return f"'{value}'"


def lua_constants() -> str:
    """The Lua block of `LUA_CONSTANTS`, before scripts/_lib.lua in the shared text jobpool/store/luatext.py
    selects each script's definitions from."""
    lines = ["-- Generated from jobpool/contract.py (LUA_CONSTANTS) when the scripts are loaded."]
    lines += [f"local {name} = {_lua_literal(value)}" for name, value in LUA_CONSTANTS.items()]
    return "\n".join(lines) + "\n"
