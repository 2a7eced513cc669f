"""Loads the Lua scripts once per client and maps their status codes to typed exceptions.

Each ``scripts/<op>.lua`` is one atomic operation; ``scripts/_lib.lua`` (shared helpers) is prepended at load
time, never at call time, so a script's text, and so its SHA, is fixed for the life of the process.
redis-py's `register_script` reloads a script on NOSCRIPT, so a Redis restart needs no special handling.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import redis

from . import errors

SCRIPT_NAMES = (
    "enqueue", "promote", "claim", "adopt", "heartbeat", "set_container", "finish",
    "pause_job", "resume_job", "cancel", "pause_queue", "resume_queue", "set_slots", "evict",
    "reconcile_apply",
)

#: The one table from script status codes to exceptions (codes are documented in scripts/_lib.lua).
ERROR_CODES: dict[int, type[errors.JobpoolError]] = {
    -1: errors.NotFound,
    -2: errors.InvalidState,
    -3: errors.NotOwner,
    -4: errors.Conflict,
    -5: errors.AlreadyExists,
    -6: errors.InvalidArgument,
}

_MESSAGES = {
    -1: "no job {arg} in this pool",
    -2: "{op}: not allowed while the job is {arg}",
    -3: "{op}: this worker no longer owns the job",
    -4: "{op}: the job changed since it was looked at (now {arg})",
    -5: "a job {arg} exists already",
    -6: "{op}: bad argument {arg}",
}


def script_text(name: str) -> str:
    pkg = resources.files("jobpool") / "scripts"
    return (pkg / "_lib.lua").read_text() + "\n" + (pkg / f"{name}.lua").read_text()


def _decode(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def raise_for_code(op: str, reply: Sequence[Any]) -> None:
    code = int(reply[0])
    if code >= 0:
        return
    arg = reply[1] if len(reply) > 1 else ""
    cls = ERROR_CODES.get(code, errors.JobpoolError)
    message = _MESSAGES.get(code, "{op}: failed with code " + str(code)).format(op=op, arg=arg)
    if cls is errors.InvalidState:
        raise errors.InvalidState(message, state=arg)
    raise cls(message)


class Scripts:
    """The registered scripts of one Redis client; call as ``scripts.run("claim", keys, args)``."""

    def __init__(self, client: redis.Redis) -> None:
        self._scripts: dict[str, Callable[..., Any]] = {
            name: client.register_script(script_text(name)) for name in SCRIPT_NAMES
        }

    def run(self, op: str, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
        """Run a script; returns its reply decoded, or raises the mapped exception."""
        try:
            reply = self._scripts[op](keys=list(keys), args=list(args))
        except redis.ConnectionError as exc:
            raise errors.RedisUnavailable(f"redis unreachable: {exc}") from None
        except redis.TimeoutError as exc:
            raise errors.RedisUnavailable(f"redis timed out: {exc}") from None
        except redis.ResponseError as exc:
            raise errors.RedisUnavailable(f"redis refused {op}: {exc}") from None
        reply = _decode(reply)
        raise_for_code(op, reply)
        return reply
