"""Settings: one frozen dataclass, read from ``JOBPOOL_*`` environment variables (and flags), validated.

A bad value raises `ConfigError` naming the variable, before anything touches Redis.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .contract import EVENTS_MAXLEN, MAX_SLOTS, MAX_TIME_SECS, RESERVE_AFTER_SECS, RETRY_DELAY_MAX_SECS
from .errors import ConfigError
from .store import redisurl
from .store.keys import validate_pool_name

EXECUTORS = ("docker", "subprocess")
#: Written by `jobpool up` in its state directory: how other shells find its Redis with no flags.
STATE_FILE = "up.json"
#: Publishing inventories more often than this is a mistake, not a setting (0 turns them off).
MIN_INVENTORY_SECS = 0.05


@dataclass(frozen=True)
class _Bound:
    env: str
    kind: type
    low: float
    high: float


# field name -> (env var, type, low, high). Everything numeric is bounded: a typo should fail loudly.
_NUMERIC: dict[str, _Bound] = {
    "max_concurrent_jobs": _Bound("JOBPOOL_MAX_CONCURRENT_JOBS", int, 0, MAX_SLOTS),
    "heartbeat_secs": _Bound("JOBPOOL_HEARTBEAT_SECS", float, 0.05, 3600),
    "lease_secs": _Bound("JOBPOOL_LEASE_SECS", float, 0.2, 86400),
    "sweep_interval_secs": _Bound("JOBPOOL_SWEEP_INTERVAL_SECS", float, 0.05, 86400),
    "job_stale_seconds": _Bound("JOBPOOL_JOB_STALE_SECONDS", float, 1, 365 * 86400),
    "drain_timeout_secs": _Bound("JOBPOOL_DRAIN_TIMEOUT_SECS", int, 1, 86400),
    "recovery_budget": _Bound("JOBPOOL_RECOVERY_BUDGET", int, 0, 1000),
    "claim_grace_secs": _Bound("JOBPOOL_CLAIM_GRACE_SECS", float, 0.1, 86400),
    "probe_timeout_secs": _Bound("JOBPOOL_PROBE_TIMEOUT_SECS", float, 0.1, 600),
    "stop_grace_secs": _Bound("JOBPOOL_STOP_GRACE_SECS", float, 0, 3600),
    "events_maxlen": _Bound("JOBPOOL_EVENTS_MAXLEN", int, 100, 100_000_000),
    # Order and limits: how long a queued job may be passed over before it gets a reservation.
    "reserve_after_secs": _Bound("JOBPOOL_RESERVE_AFTER_SECS", float, 0, 30 * 86400),
    # Time and dependencies: the longest retry delay, and how often a supervisor looks at what is due.
    "retry_delay_max_secs": _Bound("JOBPOOL_RETRY_DELAY_MAX_SECS", int, 0, MAX_TIME_SECS),
    "timer_interval_secs": _Bound("JOBPOOL_TIMER_INTERVAL_SECS", float, 0.05, 60),
    "trend_secs": _Bound("JOBPOOL_TREND_SECS", int, 1, 3600),
    # Retention of finished jobs (jobpool/retention.py): 0 turns a cap off.
    "keep_succeeded": _Bound("JOBPOOL_KEEP_SUCCEEDED", int, 0, 100_000_000),
    "keep_failed": _Bound("JOBPOOL_KEEP_FAILED", int, 0, 100_000_000),
    "keep_cancelled": _Bound("JOBPOOL_KEEP_CANCELLED", int, 0, 100_000_000),
    "keep_succeeded_secs": _Bound("JOBPOOL_KEEP_SUCCEEDED_SECS", int, 0, 100 * 365 * 86400),
    "keep_failed_secs": _Bound("JOBPOOL_KEEP_FAILED_SECS", int, 0, 100 * 365 * 86400),
    "keep_cancelled_secs": _Bound("JOBPOOL_KEEP_CANCELLED_SECS", int, 0, 100 * 365 * 86400),
    # Durability across a failover (jobpool/store/runner.py): 0 replicas = do not wait.
    "redis_wait_replicas": _Bound("JOBPOOL_REDIS_WAIT_REPLICAS", int, 0, 16),
    "redis_wait_timeout_secs": _Bound("JOBPOOL_REDIS_WAIT_TIMEOUT_SECS", float, 0.01, 60),
    # Per-daemon inventories (jobpool/workers/inventory.py): how often; 0 turns publishing off.
    "inventory_secs": _Bound("JOBPOOL_INVENTORY_SECS", float, 0, 3600),
    "inventory_stale_secs": _Bound("JOBPOOL_INVENTORY_STALE_SECS", float, 0.2, 86400),
    # The worker's check of its own host (jobpool/workers/hostcheck.py): how often while it passes.
    "host_check_secs": _Bound("JOBPOOL_HOST_CHECK_SECS", float, 0.05, 3600),
}


@dataclass(frozen=True)
class Settings:
    """Everything a pool, worker or supervisor is configured by. Construct with `from_env`."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    pool: str = "default"
    #: Written to Redis only when the pool has no limit yet; after that `set_slots` owns it.
    max_concurrent_jobs: int = 1
    heartbeat_secs: float = 5.0
    lease_secs: float = 30.0
    sweep_interval_secs: float = 30.0
    job_stale_seconds: float = 86400.0
    drain_timeout_secs: int = 10
    recovery_budget: int = 1
    executor: str = "docker"
    claim_grace_secs: float = 60.0
    probe_timeout_secs: float = 10.0
    #: How long a stopped container gets between its stop signal and SIGKILL.
    stop_grace_secs: float = 10.0
    #: About how many entries the pool's event stream keeps (each job's own history is kept in its row).
    events_maxlen: int = EVENTS_MAXLEN
    #: A queued job passed over (others started while it could not) this long gets a reservation: nothing of
    #: its priority or lower starts ahead of it any more (docs/architecture.md, "Order and limits").
    reserve_after_secs: float = RESERVE_AFTER_SECS
    #: No retry waits longer than this (seconds): a job's retry delay doubles per retry up to it.
    retry_delay_max_secs: int = RETRY_DELAY_MAX_SECS
    #: How often each supervisor queues the waiting jobs that are due and fires the schedules that are due
    #: (jobpool/supervisor/timers.py): a schedule's tick fires within about this much of its time.
    timer_interval_secs: float = 0.25
    #: The span of one point of the pool's history (jobpool/trends.py): it keeps TREND_POINTS of them
    #: (contract.py), a day of minutes by default.
    trend_secs: int = 60
    #: Finished jobs kept, per terminal state: the newest N, and none older than the age (seconds); 0 = no
    #: cap of that kind. Failures are kept longer: they are what someone comes back to look at.
    keep_succeeded: int = 10_000
    keep_failed: int = 10_000
    keep_cancelled: int = 10_000
    keep_succeeded_secs: int = 7 * 86400
    keep_failed_secs: int = 30 * 86400
    keep_cancelled_secs: int = 7 * 86400
    #: Each state change waits until this many replicas have it (Redis WAIT), at most the timeout; a change
    #: that fewer acknowledge is reported as not acknowledged (RedisUnavailable), like a lost reply.
    redis_wait_replicas: int = 0
    redis_wait_timeout_secs: float = 1.0
    #: How often the workers on one Docker daemon publish its inventory (its jobpool containers) to Redis, so
    #: a supervisor attached to another daemon can judge them (docs/architecture.md, "Many hosts"); 0 = off.
    inventory_secs: float = 5.0
    #: An inventory older than this is no evidence: its rows are "unknown".
    inventory_stale_secs: float = 30.0
    #: How often a worker probes its checkpoint root (or state directory) while it passes; every second
    #: while it fails, when the worker holds its claims (jobpool/workers/hostcheck.py).
    host_check_secs: float = 5.0
    #: Host directories under which job specs may bind-mount; none by default.
    bind_roots: tuple[str, ...] = field(default_factory=tuple)
    #: A directory every Docker host sees at this same path on shared storage (NFS and the like) under which
    #: each job's checkpoint is kept (`<root>/<pool>/<job id>`, bind-mounted); '' = a Docker volume on the
    #: daemon that ran the attempt, which then gets the job's next attempt ("Checkpoint affinity").
    checkpoint_root: str = ""
    #: Where the subprocess executor keeps checkpoints and `jobpool up` keeps its Redis.
    state_dir: str = ".jobpool"
    #: The secret that turns the dashboard's actions on (jobpool/dashboard/auth.py); empty = read-only.
    #: Kept out of repr and comparisons so that it is never printed or logged with the settings.
    dashboard_token: str = field(default="", repr=False, compare=False)
    #: The port the supervisor serves `/metrics` on (jobpool/exporter.py); None: metrics are off.
    metrics_port: int | None = None
    #: The address it binds: this machine only by default (the figures name jobs and workers).
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        validate_pool_name(self.pool)
        _check_redis_url(self.redis_url)
        for name, b in _NUMERIC.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{b.env}: {value!r} is not a number")
            if b.kind is int and value != int(value):
                raise ConfigError(f"{b.env}: {value!r} is not a whole number")
            if not b.low <= value <= b.high:
                raise ConfigError(f"{b.env}: {value!r} is out of range ({b.low:g} to {b.high:g})")
        if self.executor not in EXECUTORS:
            raise ConfigError(f"JOBPOOL_EXECUTOR: {self.executor!r} is not one of {', '.join(EXECUTORS)}")
        if self.lease_secs < 2 * self.heartbeat_secs:
            raise ConfigError(
                f"JOBPOOL_LEASE_SECS: {self.lease_secs:g} must be at least twice JOBPOOL_HEARTBEAT_SECS "
                f"({self.heartbeat_secs:g}), or one late heartbeat would look like a dead worker"
            )
        if self.inventory_secs and self.inventory_secs < MIN_INVENTORY_SECS:
            raise ConfigError(f"JOBPOOL_INVENTORY_SECS: {self.inventory_secs:g} is below "
                              f"{MIN_INVENTORY_SECS:g} (0 turns inventories off)")
        if self.inventory_secs and self.inventory_stale_secs < 2 * self.inventory_secs:
            raise ConfigError(
                f"JOBPOOL_INVENTORY_STALE_SECS: {self.inventory_stale_secs:g} must be at least twice "
                f"JOBPOOL_INVENTORY_SECS ({self.inventory_secs:g}), or one late inventory is no evidence"
            )
        for root in self.bind_roots:
            if not os.path.isabs(root):
                raise ConfigError(f"JOBPOOL_BIND_ROOTS: {root!r} is not an absolute path")
        if self.checkpoint_root and (not os.path.isabs(self.checkpoint_root) or ":" in self.checkpoint_root):
            raise ConfigError(f"JOBPOOL_CHECKPOINT_ROOT: {self.checkpoint_root!r} is not an absolute path "
                              "(without ':')")
        _check_token(self.dashboard_token)
        _check_metrics(self.metrics_port, self.metrics_host)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, follow_up: bool = True,
                 **overrides: Any) -> Settings:
        """Read ``JOBPOOL_*`` variables; keyword overrides (from flags) win; None overrides are ignored.
        With no Redis URL given, that of the `jobpool up` running from the state directory, unless
        `follow_up` is off (`up` itself); its state file naming a stack that is gone raises
        `up.follow.StackGone` (a `ConfigError`)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        if "JOBPOOL_REDIS_URL" in env:
            values["redis_url"] = env["JOBPOOL_REDIS_URL"]
        elif overrides.get("redis_url") is None and follow_up:
            found = _url_from_up_state(env.get("JOBPOOL_STATE_DIR") or cls.state_dir)
            if found:
                values["redis_url"] = found
        for name, var in (("pool", "JOBPOOL_POOL"), ("executor", "JOBPOOL_EXECUTOR"),
                          ("state_dir", "JOBPOOL_STATE_DIR")):
            if var in env:  # set, even empty: validated as given
                values[name] = env[var]
        for name, var in (("dashboard_token", "JOBPOOL_DASHBOARD_TOKEN"),
                          ("checkpoint_root", "JOBPOOL_CHECKPOINT_ROOT")):
            if env.get(var):  # empty means unset
                values[name] = env[var]
        values.update(_metrics_from_env(env))
        if env.get("JOBPOOL_BIND_ROOTS"):
            values["bind_roots"] = tuple(r for r in env["JOBPOOL_BIND_ROOTS"].split(":") if r)
        for name, b in _NUMERIC.items():
            raw = env.get(b.env)
            if raw is None or raw == "":
                continue
            try:
                values[name] = b.kind(raw) if b.kind is float else int(raw, 10)
            except ValueError:
                what = "whole number" if b.kind is int else "number"
                raise ConfigError(f"{b.env}: {raw!r} is not a {what}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


#: A dashboard token shorter than this is refused: it is all that stands between a browser and the actions.
MIN_TOKEN_CHARS = 16
#: And so is one an attacker would guess in fewer tries than 2**MIN_TOKEN_BITS, as zxcvbn estimates them:
#: it counts a token made of words, names, dates, keyboard walks, repeats or sequences by those parts, not
#: by its length, so `correct horse battery` (three common words) is refused where 48 hex digits pass.
MIN_TOKEN_BITS = 64
#: zxcvbn reads no further than this (its matching grows with the length); a strong prefix is a strong token.
_TOKEN_ESTIMATE_CHARS = 72


def token_bits(token: str) -> float:
    """log2 of the guesses zxcvbn estimates an attacker needs for `token` (its first 72 characters)."""
    import zxcvbn  # type: ignore[import-untyped]  # ships no type information; imported only with a token set

    guesses_log10 = float(zxcvbn.zxcvbn(token[:_TOKEN_ESTIMATE_CHARS])["guesses_log10"])
    return guesses_log10 * math.log2(10)


def _check_token(token: Any) -> None:
    """Refuse a weak or malformed token by name; the message never repeats the value (it is a secret)."""
    if not isinstance(token, str):
        raise ConfigError("JOBPOOL_DASHBOARD_TOKEN: must be text")
    if not token:
        return
    if len(token) < MIN_TOKEN_CHARS or not token.isprintable() or token.strip() != token:
        raise ConfigError(f"JOBPOOL_DASHBOARD_TOKEN: must be at least {MIN_TOKEN_CHARS} printable characters "
                          "with no surrounding spaces (the value is not shown)")
    if token_bits(token) < MIN_TOKEN_BITS:
        raise ConfigError(f"JOBPOOL_DASHBOARD_TOKEN: too easy to guess (under {MIN_TOKEN_BITS} bits: words, "
                          "repeats or sequences count for little); make a random one, e.g. "
                          "`openssl rand -hex 24` (the value is not shown)")


def _check_redis_url(url: Any) -> None:
    """Refuse a URL no client could be made from (bad port, broken host, an option redis-py does not take, a
    malformed redis+sentinel:// URL) or that redis-py would read as another database than it says, now, by
    name, rather than as a TypeError at the first connection or writes to the wrong database. The message
    shows the URL with every credential hidden (jobpool/store/redisurl.py `safe`)."""
    try:
        redisurl.check(url)
    except ValueError as exc:
        shown = redisurl.safe(url) if isinstance(url, str) else repr(url)
        raise ConfigError(f"JOBPOOL_REDIS_URL: {shown} {exc}") from None


#: A host name (RFC 1123 labels) or an IPv4 address; IPv6 addresses are checked by `ipaddress`.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")
_PORT_RANGE = f"a port number (1 to {redisurl.MAX_PORT})"


def _metrics_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """JOBPOOL_METRICS_PORT (unset or empty: metrics off) and JOBPOOL_METRICS_HOST."""
    values: dict[str, Any] = {}
    raw = env.get("JOBPOOL_METRICS_PORT")
    if raw:
        try:
            values["metrics_port"] = int(raw, 10)
        except ValueError:
            raise ConfigError(f"JOBPOOL_METRICS_PORT: {raw!r} is not {_PORT_RANGE}") from None
    if "JOBPOOL_METRICS_HOST" in env:
        values["metrics_host"] = env["JOBPOOL_METRICS_HOST"]
    return values


def _check_metrics(port: Any, host: Any) -> None:
    """Refuse a metrics port or address that could not be served, by name, before anything starts."""
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                             or not 1 <= port <= redisurl.MAX_PORT):
        raise ConfigError(f"JOBPOOL_METRICS_PORT: {port!r} is not {_PORT_RANGE}")
    if not isinstance(host, str):
        raise ConfigError(f"JOBPOOL_METRICS_HOST: {host!r} is not a host name or address")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST.fullmatch(host):
            raise ConfigError(f"JOBPOOL_METRICS_HOST: {host!r} is not a host name or address") from None


def _url_from_up_state(state_dir: str) -> str | None:
    """The Redis URL of a `jobpool up` running from this state directory, if any, and only while the stack
    its state file names is alive (jobpool/up/follow.py)."""
    from .up.follow import live_url  # here: it reads process identities and may ask that Redis

    return live_url(Path(state_dir).absolute() / STATE_FILE)
