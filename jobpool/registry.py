"""Loads the Lua scripts once per client and maps their status codes to typed exceptions.

Each ``scripts/<op>.lua`` is one atomic operation; ``scripts/_lib.lua`` (shared helpers) is prepended at load
time, never at call time, and before it the constants the scripts share with Python (`contract.lua_constants`,
from jobpool/contract.py; the enqueue script also gets RQ's constant job hash fields, `rqjob.lua_template`),
so a script's text, and so its SHA, is fixed for the life of the process.
redis-py's `register_script` reloads a script on NOSCRIPT, so a Redis restart needs no special handling.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import redis
from redis.commands.core import Script

from . import contract, errors, rqjob

SCRIPT_NAMES = (
    "enqueue", "promote", "claim", "adopt", "heartbeat", "set_container", "finish",
    "pause_job", "resume_job", "cancel", "pause_queue", "resume_queue", "set_slots", "evict",
    "reconcile_apply", "drop_ghost", "prune",
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
    -1: "no job {arg} in this pool " + errors.NOT_FOUND_HINT.replace("{", "{{").replace("}", "}}"),
    -2: "{op}: not allowed while the job is {arg}",
    -3: "{op}: this worker no longer owns the job",
    -4: "{op}: the job changed since it was looked at (now {arg})",
    -5: "a job {arg} exists already",
    -6: "{op}: bad argument {arg}",
}


#: Error replies that say the server cannot serve now (not that the data is bad): `RedisUnavailable`.
#: redis-py turns some into their own classes (and strips the code from the message); the rest keep it.
_SERVER_STATE_CLASSES: tuple[type[redis.RedisError], ...] = (
    redis.exceptions.ReadOnlyError, redis.exceptions.OutOfMemoryError, redis.exceptions.NoScriptError,
    redis.exceptions.NoPermissionError, redis.exceptions.AuthenticationError, redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError, redis.exceptions.MasterDownError, redis.exceptions.ExecAbortError,
)
_SERVER_STATE_CODES = ("READONLY", "OOM", "BUSY", "LOADING", "MASTERDOWN", "NOREPLICAS", "CLUSTERDOWN",
                       "TRYAGAIN", "MISCONF", "NOSCRIPT", "NOAUTH", "NOPERM", "WRONGPASS")


def wrap_redis_error(exc: redis.RedisError, what: str) -> errors.JobpoolError:
    """The typed error for a redis-py error met while doing `what`: unreachable or a server that cannot
    serve is `RedisUnavailable`; an error reply about the data (WRONGTYPE, a script that failed on a value it
    read) is `CorruptRow`, so one bad row is that row's error and not "Redis is away"."""
    if isinstance(exc, redis.ConnectionError):
        return errors.RedisUnavailable(f"redis unreachable: {exc}")
    if isinstance(exc, redis.TimeoutError):
        return errors.RedisUnavailable(f"redis timed out: {exc}")
    if isinstance(exc, redis.DataError):
        return errors.InvalidArgument(f"{what}: {exc}")
    text = str(exc)
    server_state = isinstance(exc, _SERVER_STATE_CLASSES) or text.startswith(_SERVER_STATE_CODES)
    if isinstance(exc, redis.ResponseError) and not server_state:
        return errors.CorruptRow(f"{what}: redis refused it on the stored data: {text}")
    return errors.RedisUnavailable(f"redis refused {what}: {text}")


def call_redis(fn: Callable[..., Any], /, *args: Any, what: str | None = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, a redis-py call, with any error it raises mapped by `wrap_redis_error`: how
    the API, the status report and the CLI read Redis, so a caller handles `JobpoolError` alone. `what`
    names the operation in the message (default: the method's name). The reply is `Any`: redis-py types
    replies as bytes or str whatever the client, and jobpool's clients decode them (api.connect)."""
    try:
        return fn(*args, **kwargs)
    except redis.RedisError as exc:
        raise wrap_redis_error(exc, what or str(getattr(fn, "__name__", "a read"))) from None


#: Constant blocks only some scripts need, generated from Python like the contract's (name -> generator).
SCRIPT_CONSTANTS: dict[str, Callable[[], str]] = {"enqueue": rqjob.lua_template}


def script_text(name: str) -> str:
    """The text loaded as script `name`: the contract's constants, _lib.lua, the script's own generated
    constants (`SCRIPT_CONSTANTS`), then the script itself."""
    pkg = resources.files("jobpool") / "scripts"
    own = SCRIPT_CONSTANTS[name]() if name in SCRIPT_CONSTANTS else ""
    return (contract.lua_constants() + (pkg / "_lib.lua").read_text() + "\n" + own
            + (pkg / f"{name}.lua").read_text())


def _decode(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):  # one pass, recursing only into a nested list (most replies are flat)
        return [v.decode() if type(v) is bytes else _decode(v) if type(v) is list else v for v in value]
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
    """The registered scripts of one Redis client; call as ``scripts.run("claim", keys, args)``.

    `default_slots` is the limit a pool without a stored one uses (`Settings.max_concurrent_jobs`) and
    `events_maxlen` the event stream's cap (`Settings.events_maxlen`): they go to every script as two extra,
    last ARGV, which _lib.lua takes off before the script reads its own, so Lua and Python never hold two
    copies of a default.
    """

    def __init__(self, client: redis.Redis, default_slots: int,
                 events_maxlen: int = contract.EVENTS_MAXLEN) -> None:
        self.client = client
        self.default_slots = int(default_slots)
        self.events_maxlen = int(events_maxlen)
        self._scripts: dict[str, Script] = {
            name: client.register_script(script_text(name)) for name in SCRIPT_NAMES
        }

    def run(self, op: str, keys: Sequence[str], args: Sequence[Any],
            client: redis.Redis | None = None) -> list[Any]:
        """Run a script; returns its reply decoded, or raises the mapped exception. `client` (default: the
        one the scripts were registered on) is another client of the same server: jobpool/submit.py runs
        enqueue on a per-thread single-connection client."""
        script = self._scripts[op]
        conn = client or self.client
        try:
            # What redis-py's `Script.__call__` does, without its per-call tuple copies and import: EVALSHA,
            # and on NOSCRIPT (a restarted or flushed server) load the script through the same client and
            # run it again.
            try:
                reply = conn.execute_command("EVALSHA", script.sha, len(keys), *keys, *args,
                                             self.default_slots, self.events_maxlen)
            except redis.exceptions.NoScriptError:
                script.sha = conn.script_load(script.script)
                reply = conn.execute_command("EVALSHA", script.sha, len(keys), *keys, *args,
                                             self.default_slots, self.events_maxlen)
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, op) from None
        reply = _decode(reply)
        raise_for_code(op, reply)
        return reply
