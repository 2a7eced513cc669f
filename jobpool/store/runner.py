"""Loads the Lua scripts once per client and maps their status codes to typed exceptions.

Each ``scripts/<op>.lua`` is one atomic operation. Before it, at load time and never at call time, come the
definitions it uses of the shared helpers (``scripts/_lib.lua``) and of the constants the scripts share with
Python (`contract.lua_constants`, from jobpool/contract.py; RQ's constant job hash fields,
`rqjob.lua_template`, for the scripts that write RQ's hash): jobpool/store/luatext.py makes that text, so a
script's text, and so its SHA, is fixed for the life of the process.
A script is called by its SHA (EVALSHA); one that meets NOSCRIPT (a restarted or flushed server, a new
primary) is loaded through the same client and run again, so a Redis restart needs no special handling. On a
single-connection client (the enqueue's, jobpool/submit.py) the call is sent and read on its connection
directly (`_held_call`), without redis-py's per-command layers; its failures are the same.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.commands.core import Script

from .. import contract, errors
from . import schema
from .luatext import script_text, shape

log = logging.getLogger("jobpool")

#: How long a script refused with READONLY (its primary demoted) is sent again while Sentinel moves the
#: primary: a forced failover takes about a second, one after a crash the sentinels' down-after time.
FAILOVER_RETRY_SECS = 15.0
#: How many times one `Scripts.run_many` loads a script the server does not have (NOSCRIPT).
_SCRIPT_LOADS = 2
#: What redis-py's Sentinel connection raises, having dropped its connection, when a primary it reached
#: answers READONLY (redis/sentinel.py: the next connection asks the sentinels again).
_DEMOTED_TEXT = "The previous master is now a slave"


def demoted(exc: redis.RedisError) -> bool:
    """A refusal by a replica (READONLY): nothing of the script was applied."""
    return isinstance(exc, redis.ReadOnlyError) or (
        isinstance(exc, redis.ConnectionError) and _DEMOTED_TEXT in str(exc))

SCRIPT_NAMES = (
    "enqueue", "promote", "claim", "adopt", "heartbeat", "set_container", "finish",
    "pause_job", "resume_job", "cancel", "pause_queue", "resume_queue", "set_slots", "evict",
    "reconcile_apply", "drop_ghost", "prune", "inventory_lead", "publish_inventory",
    "push_command", "take_commands", "command_done", "forget_daemon", "unforget_daemon",
    "daemon_mark", "daemon_mark_round", "daemon_collision", "daemon_mark_index", "daemon_unmark", "give_back",
    "forget_collision", "forget_rq_failure",
    "limit", "time_out", "release_waiting",
    "retry_job", "schedule_set", "schedule_remove", "schedule_pause", "schedule_skip", "set_schema",
    "trend_sample", "log_append",
)

#: The one table from script status codes to exceptions (codes are documented in scripts/_lib.lua).
ERROR_CODES: dict[int, type[errors.JobpoolError]] = {
    -1: errors.NotFound,
    -2: errors.InvalidState,
    -3: errors.NotOwner,
    -4: errors.Conflict,
    -5: errors.AlreadyExists,
    -6: errors.InvalidArgument,
    -7: errors.InvalidSpec,
}

_MESSAGES = {
    -1: "no job {arg} in this pool " + errors.NOT_FOUND_HINT.replace("{", "{{").replace("}", "}}"),
    -2: "{op}: not allowed while the job is {arg}",
    -3: "{op}: this worker no longer owns the job",
    -4: "{op}: the job changed since it was looked at (now {arg})",
    -5: "a job {arg} exists already",
    -6: "{op}: bad argument {arg}",
    -7: "{op}: refused: {arg}",
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


def reopen(conn: Any) -> None:
    """Drop a single-connection client's connection and open it again through `connect()`, the method a
    Sentinel-managed connection overrides to ask the sentinels where the primary is now (redis-py's own
    reconnect inside a command goes back to the address it had). A failure leaves it closed: the next call
    then fails typed."""
    conn.disconnect()
    try:
        conn.connect()
    except redis.RedisError:
        conn.disconnect()


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
    replies as bytes or str whatever the client, and jobpool's clients decode them (redisurl.connect)."""
    try:
        return fn(*args, **kwargs)
    except redis.RedisError as exc:
        raise wrap_redis_error(exc, what or str(getattr(fn, "__name__", "a read"))) from None


try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # redis-py packs in Python then, and so does `_held_call`
    _hiredis_pack = None  # type: ignore[assignment]  # None says: not installed


def _held_call(conn: Any, command: tuple[Any, ...], meanwhile: Callable[[], None] | None = None) -> Any:
    """`command` on the connection `conn` of a single-connection client that one thread alone uses
    (store/threadclients.py), sent and read with the Connection's own public methods: what `execute_command`
    does for it less its layers (the retry wrapper, the argument filtering, the response callbacks, none of
    which applies to EVALSHA; its lock, which guards a client shared by threads), a measurable share of an
    enqueue's client CPU (bench/enqueue.py; BENCHMARKS.md).

    A failure does what `execute_command` does with the Retry jobpool's clients have (redisurl.connect:
    redis-py's default, no retries): a ConnectionError or TimeoutError drops the connection (the next call
    connects again; a Sentinel-managed one asks the sentinels) and is raised; an error reply is raised and
    keeps it. The command is never sent again here, whatever Retry a caller's client was given: the reply
    that was lost may have been applied (Scripts.run).

    The command is packed by hiredis itself when it is installed (jobpool's dependency `redis[hiredis]`):
    the bytes redis-py's own packer makes then (its HiredisRespSerializer calls the same function), without
    its per-argument Python pass, which cost a fifth of an enqueue's client instructions.

    `meanwhile`, when given, runs once the command is sent and before its reply is read: the caller's own
    work overlaps the server's (`Scripts.run`). If it raises, the connection is dropped, as for a lost reply:
    an unread reply must never be taken for the next command's."""
    try:
        if _hiredis_pack is None:
            packed = conn.pack_command(*command)
        else:
            try:
                packed = [_hiredis_pack(command)]
            except TypeError as exc:  # what redis-py's packer raises for an argument it cannot send
                raise redis.DataError(exc) from None
        conn.send_packed_command(packed)
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException:
                conn.disconnect()
                raise
        return conn.read_response()
    except (redis.ConnectionError, redis.TimeoutError):
        conn.disconnect()
        raise
    finally:
        # A maintenance notice (redis-py 6.3 on) can ask for a new connection after any command: as in
        # execute_command. Older redis-py has no such notice, nor the method.
        if getattr(conn, "should_reconnect", _never)():
            conn.disconnect()
            conn.connect()


def _never() -> bool:
    return False


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    """`fn`, run by the first call only."""
    left = [fn]

    def run() -> None:
        if left:
            left.pop()()
    return run


def decode_reply(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):  # one pass, recursing only into a nested list (most replies are flat)
        return [v.decode() if type(v) is bytes else decode_reply(v) if type(v) is list else v for v in value]
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


def _typed(op: str, reply: Any) -> list[Any] | errors.JobpoolError:
    """One reply of `Scripts.run_many`: decoded, or the typed exception its code or error reply maps to; one
    that says Redis cannot serve is raised."""
    if isinstance(reply, redis.RedisError):
        error = wrap_redis_error(reply, op)
        if isinstance(error, errors.RedisUnavailable):
            raise error from None
        return error
    decoded: list[Any] = decode_reply(reply)
    try:
        raise_for_code(op, decoded)
    except errors.JobpoolError as exc:
        return exc
    return decoded


def script_settings(default_slots: int, events_maxlen: int, reserve_after_secs: float,
                    retry_delay_max_secs: int) -> dict[str, tuple[int, ...]]:
    """Each script's settings, in the order its header names them (`Settings:`, luatext.shape), as sent after
    its own ARGV: what `Scripts` and the asyncio store (store/asyncstore.py) append."""
    values = {"default_slots": int(default_slots), "events_maxlen": int(events_maxlen),
              "reserve_after_ms": max(0, round(reserve_after_secs * 1000)),
              "retry_delay_max_ms": max(0, int(retry_delay_max_secs) * 1000)}
    return {name: tuple(values[s] for s in shape(name).settings) for name in SCRIPT_NAMES}


class Scripts:
    """The registered scripts of one Redis client; call as ``scripts.run("claim", keys, args)`` with the keys
    a script takes (its own, then its pool keys: `Store.run` appends those).

    `default_slots` is the limit a pool without a stored one uses (`Settings.max_concurrent_jobs`) and
    `events_maxlen` the event stream's cap (`Settings.events_maxlen`), `reserve_after_secs` how long a queued
    job may be passed over before it gets a reservation (`Settings.reserve_after_secs`),
    `retry_delay_max_secs` the longest retry delay (`Settings.retry_delay_max_secs`): a script whose header
    names them
    (`Settings:`, luatext.shape) gets them after its own ARGV, so Lua and Python never hold two copies of a
    default.
    """

    def __init__(self, client: redis.Redis, default_slots: int,
                 events_maxlen: int = contract.EVENTS_MAXLEN, wait_replicas: int = 0,
                 wait_timeout_secs: float = 1.0,
                 reserve_after_secs: float = contract.RESERVE_AFTER_SECS,
                 retry_delay_max_secs: int = contract.RETRY_DELAY_MAX_SECS) -> None:
        self.client = client
        self.default_slots = int(default_slots)
        self.events_maxlen = int(events_maxlen)
        self.wait_replicas = int(wait_replicas)
        self.wait_timeout_ms = max(1, round(wait_timeout_secs * 1000))
        self._scripts: dict[str, Script] = {
            name: client.register_script(script_text(name)) for name in SCRIPT_NAMES
        }
        #: Each script's settings, in the order its header names them: appended after its own ARGV.
        self._settings = script_settings(self.default_slots, self.events_maxlen, reserve_after_secs,
                                         retry_delay_max_secs)
        #: The pool's config hash and name, set by its store: before a state change, and again once
        #: `schema.RECHECK_SECS` have passed, the pool's layout version is read, and a pool newer than this
        #: release knows is refused (`PoolTooNew`) with nothing written (jobpool/store/schema.py).
        self.config_key: str | None = None
        self.pool = ""
        self._schema_read_at = -math.inf

    def check_schema(self, conn: redis.Redis | None = None, force: bool = False) -> int | None:
        """The pool's layout version, read unless it was read within `schema.RECHECK_SECS` (None then);
        `PoolTooNew` when it is newer than this release knows."""
        if self.config_key is None or (not force and time.monotonic() - self._schema_read_at
                                       < schema.RECHECK_SECS):
            return None
        try:
            raw = (conn or self.client).hget(self.config_key, schema.FIELD)
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, "reading the pool's layout version") from None
        version = schema.refuse_newer(self.pool, raw)
        self._schema_read_at = time.monotonic()
        return version

    def run(self, op: str, keys: Sequence[str], args: Sequence[Any],
            client: redis.Redis | None = None, meanwhile: Callable[[], None] | None = None) -> list[Any]:
        """Run a script; returns its reply decoded, or raises the mapped exception. `client` (default: the
        one the scripts were registered on) is another client of the same server: jobpool/submit.py runs
        enqueue on a per-thread single-connection client, whose connection the call is sent on directly
        (`_held_call`): such a client must be used by one thread only.

        A script sent to a primary that was demoted meets READONLY at its first write, before it changed
        anything (a script's reads come first, and Redis refuses it whole), so it is sent again, with a
        short backoff, until the new primary takes it or `FAILOVER_RETRY_SECS` pass. Any other failure is
        the caller's: a lost reply may have been applied, and only the caller knows how to find out.

        `meanwhile` is work of the caller's that does not depend on this call (enqueue_many: the previous
        batch's Jobs, the next batch's arguments). It runs once: on a single-connection client while the
        server runs the script, otherwise before the call. If it raises, that is raised and the call's
        outcome is unknown, as for a lost reply."""
        conn = client or self.client
        self.check_schema(conn)
        deadline, delay = time.monotonic() + FAILOVER_RETRY_SECS, 0.05
        once = _once(meanwhile) if meanwhile is not None else None  # a call sent again does not run it again
        while True:
            try:
                reply = self._call(op, conn, keys, args, once)
                break
            except redis.RedisError as exc:
                if not demoted(exc) or time.monotonic() + delay > deadline:
                    raise wrap_redis_error(exc, op) from None
                log.info("%s: the primary was demoted (%s); sending it again", op, exc)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                single = getattr(conn, "connection", None)  # a single-connection client (jobpool/submit.py)
                if single is not None:
                    reopen(single)
        decoded: list[Any] = decode_reply(reply)
        raise_for_code(op, decoded)
        return decoded

    def run_many(self, op: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]],
                 ) -> list[list[Any] | errors.JobpoolError]:
        """Script `op` once per (keys, args) in `calls`, all sent down one pipeline: one round trip for the
        lot, each call still its own atomic step with its own reply. A call's script code or error reply (a
        value it could not read) is that call's typed exception, in its place.

        Calls a server refused whole are sent again, as `run` sends one again: those met by NOSCRIPT once the
        script is loaded, and those a demoted primary refused (READONLY) until the new primary takes them or
        `FAILOVER_RETRY_SECS` pass. Anything else that says Redis cannot serve (unreachable, a WAIT short of
        its replicas) fails the whole call with `RedisUnavailable`: which of them ran is then unknown, as for
        one lost reply, so each must be a compare-and-set its caller can judge again."""
        self.check_schema()
        script = self._scripts[op]
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        deadline, delay, loads = time.monotonic() + FAILOVER_RETRY_SECS, 0.05, 0
        while todo:
            try:
                for i, reply in zip(todo, self._pipelined(op, [calls[i] for i in todo]), strict=True):
                    replies[i] = reply
            except redis.RedisError as exc:
                if not demoted(exc) or time.monotonic() + delay > deadline:
                    raise wrap_redis_error(exc, op) from None
                replies = [exc if i in todo else r for i, r in enumerate(replies)]
            lost = [i for i in todo if isinstance(replies[i], redis.exceptions.NoScriptError)]
            if lost and loads < _SCRIPT_LOADS:
                loads += 1
                script.sha = call_redis(self.client.script_load, script.script, what=op)
            elif lost:
                lost = []  # lost again as soon as loaded: left as they are (RedisUnavailable)
            refused = [i for i in todo if isinstance(replies[i], redis.RedisError) and demoted(replies[i])]
            if refused and time.monotonic() + delay <= deadline:
                log.info("%s: the primary was demoted (%s); sending %d calls again", op, replies[refused[0]],
                         len(refused))
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            else:
                refused = []
            todo = sorted(lost + refused)
        return [_typed(op, reply) for reply in replies]

    def _pipelined(self, op: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """One EVALSHA of `op` per call down one pipeline (then WAIT, when asked for): the raw replies, an
        error reply in its place; redis-py's error when the pipeline as a whole failed."""
        script, settings = self._scripts[op], self._settings[op]
        pipe = self.client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args, *settings)
        if self.wait_replicas:
            pipe.wait(self.wait_replicas, self.wait_timeout_ms)
        got = list(pipe.execute(raise_on_error=False))
        if self.wait_replicas:
            acked = got.pop()
            if isinstance(acked, Exception) or int(acked) < self.wait_replicas:
                raise errors.NotReplicated(
                    f"{op}: applied on the primary but acknowledged by {acked} of {self.wait_replicas} "
                    f"replicas within {self.wait_timeout_ms} ms, so a failover now could lose it")
        return got

    def _call(self, op: str, conn: redis.Redis, keys: Sequence[str], args: Sequence[Any],
              meanwhile: Callable[[], None] | None = None) -> Any:
        """One EVALSHA. `meanwhile` (from `run`: it does its work on its first call only) runs before the
        call on a pooled client, or once the command is sent on a single-connection one."""
        script = self._scripts[op]
        full = (*args, *self._settings[op])
        single = None if self.wait_replicas else getattr(conn, "connection", None)
        if meanwhile is not None and single is None:  # nothing to overlap with: the caller's work first
            meanwhile()
        if self.wait_replicas:
            return self._call_and_wait(script, conn, keys, full)
        # What redis-py's `Script.__call__` does, without its per-call tuple copies and import: EVALSHA, and
        # on NOSCRIPT (a restarted or flushed server, a new primary) load the script through the same client
        # and run it again (`meanwhile` has done its work by then).
        send: Callable[..., Any] = (conn.execute_command if single is None
                                    else (lambda *cmd: _held_call(single, cmd, meanwhile)))
        try:
            return send("EVALSHA", script.sha, len(keys), *keys, *full)
        except redis.exceptions.NoScriptError:
            script.sha = conn.script_load(script.script)
            return send("EVALSHA", script.sha, len(keys), *keys, *full)

    def _call_and_wait(self, script: Script, conn: redis.Redis, keys: Sequence[str],
                       full: Sequence[Any]) -> Any:
        # WAIT counts the writes sent on its own connection: the script and it go down one pipeline (which
        # loads the script first when the server lacks it).
        pipe = conn.pipeline(transaction=False)
        script(keys=list(keys), args=list(full), client=pipe)
        pipe.wait(self.wait_replicas, self.wait_timeout_ms)
        reply, acked = pipe.execute()
        if int(acked) < self.wait_replicas:
            raise errors.NotReplicated(
                f"applied on the primary but acknowledged by {acked} of {self.wait_replicas} replicas "
                f"within {self.wait_timeout_ms} ms, so a failover now could lose it")
        return reply
