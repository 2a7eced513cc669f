"""No key is built inside Lua: every key a script touches arrives in KEYS (docs/architecture.md,
"Every state change is one Lua script").

A key built from a string inside a script is invisible to Redis Cluster's slot check and to whoever reads
the caller, and is how a script ends up touching keys nobody passed. The check reads each script as loaded
(_lib.lua prepended) and requires the key argument of every `redis.call` to be `KEYS[...]`, a local only
ever assigned `KEYS[...]`, or a parameter of a _lib.lua helper that every caller passes such a value. RQ's
keys (its job hash, queue list and queue set) arrive in KEYS too, as _lib.lua's header says. Scripts never
scan the keyspace or read a whole collection, and each opens with a header naming KEYS, ARGV and Returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources

import fakeredis
import pytest

from jobpool.config import Settings
from jobpool.store.calls import Store
from jobpool.store.keys import POOL_KEY_NAMES, PoolKeys
from jobpool.store.luatext import checked_shape, prelude, script_text, shape
from jobpool.store.runner import SCRIPT_NAMES

SCRIPTS = resources.files("jobpool") / "scripts"
LIB = (SCRIPTS / "_lib.lua").read_text()

#: Commands that take no key. Anything else must name its key first.
KEYLESS = {"TIME"}
#: Commands whose every argument is a key.
ALL_KEYS = {"DEL", "EXISTS", "UNLINK", "TOUCH", "MGET"}
#: Never inside a script: they scan the keyspace or read a whole collection of unbounded size.
FORBIDDEN = {"KEYS", "SCAN", "HSCAN", "SSCAN", "ZSCAN", "SMEMBERS", "HKEYS", "HVALS", "FLUSHALL", "FLUSHDB",
             "RANDOMKEY", "SORT", "SUNION", "SINTER", "SDIFF"}
#: Hashes that are one job's row, or one process's daemon mark record (written whole by _lib.lua's
#: `write_mark`: bounded); HGETALL of anything else (the coalesce map) is unbounded.
BOUNDED_HASH_VARS = {"jkey", "mark_rec"}


def strip_comments(text: str) -> str:
    text = re.sub(r"--\[\[.*?\]\]", "", text, flags=re.S)
    return re.sub(r"--[^\n]*", "", text)


def split_args(text: str, start: int) -> tuple[list[str], int]:
    """The comma-separated arguments of the call whose '(' is at `start`, and the index after its ')'."""
    depth, args, cur, i, quote = 0, [], "", start, ""
    while i < len(text):
        ch = text[i]
        if quote:
            cur += ch
            if ch == "\\":
                cur += text[i + 1]
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
            cur += ch
        elif ch in "([{":
            depth += 1
            if depth > 1:
                cur += ch
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                args.append(cur.strip())
                return [a for a in args if a], i + 1
            cur += ch
        elif ch == "," and depth == 1:
            args.append(cur.strip())
            cur = ""
        else:
            cur += ch
        i += 1
    raise AssertionError(f"unbalanced call at {text[start:start + 60]!r}")


def split_top(expr: str) -> list[str]:
    """An expression list split at top-level commas; ['<complex>'] if it does not close on this line."""
    try:
        return split_args("(" + expr + ")", 0)[0]
    except AssertionError:
        return ["<complex>"]


def is_keys_expr(expr: str) -> bool:
    """`KEYS[<anything balanced>]` and nothing more (no `..`, no call, no suffix), or a slice of KEYS,
    `unpack(KEYS, <from>, <to>)` (daemon_mark_round.lua's MGET of its peers' digests)."""
    if expr.startswith("unpack(KEYS, ") and expr.endswith(")"):
        inner = expr[len("unpack(KEYS, "):-1]
        return inner.count("(") == inner.count(")") and ".." not in inner
    if not expr.startswith("KEYS["):
        return False
    depth = 0
    for i, ch in enumerate(expr[4:], start=4):
        depth += ch == "["
        depth -= ch == "]"
        if depth == 0:
            return i == len(expr) - 1
    return False


@dataclass
class Call:
    func: str | None  # enclosing _lib helper, None at script top level
    callee: str  # "redis.call" or a helper name
    args: list[str]


@dataclass
class Program:
    name: str
    calls: list[Call] = field(default_factory=list)
    params: dict[str, list[str]] = field(default_factory=dict)
    assignments: dict[str, list[str]] = field(default_factory=dict)


def parse(name: str, lib: str, body: str) -> Program:
    """Calls (of redis and of helpers), helper parameters and assignments of one loaded script."""
    prog = Program(name)
    for region, text in (("lib", strip_comments(lib)), ("body", strip_comments(body))):
        for m in re.finditer(r"local\s+function\s+(\w+)\s*\(([^)]*)\)", text):
            prog.params[m.group(1)] = [p.strip() for p in m.group(2).split(",") if p.strip()]
        # One line each ([ \t], never \s: a line of bare words before it must not join the names).
        for m in re.finditer(r"^[ \t]*(?:local[ \t]+)?([\w \t,]+?)[ \t]*=[ \t]*(?!=)(.+)$", text, re.M):
            names = [n.strip() for n in m.group(1).split(",")]
            if not all(re.fullmatch(r"\w+", n) for n in names) or names[0] in ("if", "elseif", "for"):
                continue
            exprs = split_top(m.group(2))
            for i, n in enumerate(names):
                prog.assignments.setdefault(n, []).append(exprs[i] if i < len(exprs) else "<multi>")
        for m in re.finditer(r"for\s+(\w+)\s*=", text):
            prog.assignments.setdefault(m.group(1), []).append("<loop>")
        func_starts = [(m.start(), m.group(1)) for m in re.finditer(r"local\s+function\s+(\w+)", text)]
        callees = "|".join(["redis\\.p?call", *map(re.escape, prog.params)])
        for m in re.finditer(rf"(?<![\w.])({callees})\s*\(", text):
            if text[max(0, m.start() - 15):m.start()].rstrip().endswith("function"):
                continue  # the definition itself
            enclosing = None
            if region == "lib":
                enclosing = next((f for pos, f in reversed(func_starts) if pos < m.start()), None)
            args, _ = split_args(text, m.end() - 1)
            callee = "redis.call" if m.group(1).startswith("redis") else m.group(1)
            prog.calls.append(Call(enclosing, callee, args))
    return prog


def redis_key_args(call: Call) -> tuple[str, list[str]]:
    """(command, the arguments that are keys) of a redis.call."""
    cmd = call.args[0]
    assert re.fullmatch(r"'[A-Z]+'", cmd), f"command name is not a literal: {cmd}"
    cmd = cmd.strip("'")
    if cmd in KEYLESS:
        return cmd, []
    return cmd, call.args[1:] if cmd in ALL_KEYS else call.args[1:2]


def find_key_params(prog: Program) -> set[tuple[str, int]]:
    """(helper, parameter index) pairs used as keys, to a fixed point (a helper passes its key to another)."""
    key_params: set[tuple[str, int]] = set()
    changed = True
    while changed:
        changed = False
        for c in prog.calls:
            if c.func is None:
                continue
            params = prog.params[c.func]
            used = redis_key_args(c)[1] if c.callee == "redis.call" else [
                a for i, a in enumerate(c.args) if (c.callee, i) in key_params]
            for arg in used:
                if arg in params and (c.func, params.index(arg)) not in key_params:
                    key_params.add((c.func, params.index(arg)))
                    changed = True
    return key_params


def command_problems(prog: Program, c: Call) -> list[str]:
    """What a redis.call may never do, whatever its keys: scan, read a whole collection, lack a key."""
    cmd, keys = redis_key_args(c)
    problems = []
    if cmd in FORBIDDEN:
        problems.append(f"{prog.name}: {cmd} is never allowed in a script")
    if cmd in ("ZRANGE", "ZREVRANGE", "LRANGE") and c.args[-1].strip() == "-1":
        problems.append(f"{prog.name}: {cmd} ... -1 reads a whole collection")
    if cmd == "HGETALL" and c.args[1] not in BOUNDED_HASH_VARS:
        problems.append(f"{prog.name}: HGETALL {c.args[1]} is unbounded")
    if cmd not in KEYLESS and not keys:
        problems.append(f"{prog.name}: {cmd} without a key")
    return problems


def check(prog: Program) -> list[str]:
    """Every violation of "keys come from KEYS" (and of the bounded-work rules) in one loaded script."""
    key_vars = {n for n, exprs in prog.assignments.items() if exprs and all(is_keys_expr(e) for e in exprs)}
    key_params = find_key_params(prog)

    def from_keys(arg: str, func: str | None) -> bool:
        if arg == "nil":  # no key at all: a helper given nil for an optional key touches none
            return True
        if is_keys_expr(arg) or arg in key_vars:
            return True
        params = prog.params[func] if func else []
        return arg in params and (func, params.index(arg)) in key_params

    problems = []
    for c in prog.calls:
        if c.callee == "redis.call":
            problems += command_problems(prog, c)
            keys = redis_key_args(c)[1]
        else:
            keys = [a for i, a in enumerate(c.args) if (c.callee, i) in key_params]
        problems += [f"{prog.name}: {c.callee}({', '.join(c.args)}) uses key {arg!r}, not drawn from KEYS"
                     for arg in keys if not from_keys(arg, c.func)]
    return problems


def script_body(name: str) -> str:
    return (SCRIPTS / f"{name}.lua").read_text()


@pytest.mark.parametrize("name", sorted(SCRIPT_NAMES))
def test_every_key_comes_from_keys(name: str) -> None:
    prog = parse(name, LIB, script_body(name))
    assert any(c.callee == "redis.call" for c in prog.calls), "the parser found no redis.call at all"
    assert check(prog) == []


def test_every_helper_key_parameter_was_found() -> None:
    """Helpers that take a job key (`end_running`, `fence`, ...) are checked at their callers."""
    prog = parse("finish", LIB, script_body("finish"))
    called = {c.callee for c in prog.calls}
    assert {"end_running", "fence", "promote_candidates", "verdict_for_exit"} <= called


@pytest.mark.parametrize(("snippet", "why"), [
    ("redis.call('HGET', 'jobpool:{p}:job:' .. ARGV[1], 'x')", "concatenated key"),
    ("local k = 'jobpool:' .. ARGV[1]\nredis.call('DEL', k)", "key built in a local"),
    ("local k = KEYS[14]\nk = ARGV[1]\nredis.call('DEL', k)", "a KEYS local reassigned"),
    ("redis.call('EXISTS', KEYS[14], 'rq:job:' .. ARGV[1])", "second key of a multi-key command"),
    ("redis.call('HSET', KEYS[14] .. ':x', 'a', 1)", "suffix on a KEYS entry"),
    ("set_state('job:' .. ARGV[1], ARGV[1], 'queued', 'running', 1)", "a helper handed a built key"),
    ("end_running(ARGV[1], KEYS[15], ARGV[1], 'failed', '', '', '', 1)", "a helper handed an argument"),
    ("redis.call('KEYS', 'jobpool:*')", "KEYS *"),
    ("redis.call('SCAN', 0)", "SCAN"),
    ("redis.call('ZRANGE', KEYS[3], 0, -1)", "whole queue"),
    ("redis.call('HGETALL', KEYS[5])", "whole coalesce map"),
])
def test_the_checker_catches_violations(snippet: str, why: str) -> None:
    assert check(parse("bad", LIB, snippet)), f"not caught: {why}"


def test_lib_header_describes_every_pool_key() -> None:
    header = LIB.split("]]")[0]
    for name in POOL_KEY_NAMES:
        assert re.search(rf"\b{name}\b", header), f"_lib.lua's header does not describe pool key {name}"


@pytest.mark.parametrize("name", sorted(SCRIPT_NAMES))
def test_each_pool_key_arrives_where_the_script_looks_for_it(name: str) -> None:
    """The store hands a script the keys its header names, after its own, and the loaded text's K_<NAME>
    finds each one there (evaluated by Redis' Lua: fakeredis runs the real interpreter)."""
    store = Store(fakeredis.FakeRedis(decode_responses=True), Settings.from_env({}, pool="p"))
    names = shape(name).pool_keys
    keys = PoolKeys("p")
    own = ["own:1", "own:2"]
    full = [*own, *store.pool_keys(name)]
    assert script_text(name).startswith(prelude(shape(name), script_text(name)))
    places = "return {NKEYS" + "".join(f", KEYS[K_{n.upper()}]" for n in names) + "}"
    got = store.client.eval(prelude(shape(name), "") + places, len(full), *full)
    assert got == [len(own), *(str(getattr(keys, n)) for n in names)]


def test_a_header_must_name_exactly_the_pool_keys_its_text_reaches() -> None:
    heartbeat = (SCRIPTS / "heartbeat.lua").read_text()
    assert checked_shape("heartbeat", heartbeat).pool_keys == ()
    reaches_events = heartbeat + "\nevent(nil, '', '', '', 'x', '', '', 0)\n"
    with pytest.raises(ValueError, match=r"names \[\], its text reaches \['events', 'metrics'\]"):
        checked_shape("heartbeat", reaches_events)
    names_unused = heartbeat.replace("Pool keys: none", "Pool keys: config")
    with pytest.raises(ValueError, match=r"names \['config'\], its text reaches \[\]"):
        checked_shape("heartbeat", names_unused)
    with pytest.raises(ValueError, match="not among"):
        checked_shape("heartbeat", heartbeat.replace("Pool keys: none", "Pool keys: confg"))
    with pytest.raises(ValueError, match="not one"):
        checked_shape("heartbeat", heartbeat.replace("Pool keys: none\n", ""))
    promote = (SCRIPTS / "promote.lua").read_text()
    with pytest.raises(ValueError, match="Settings"):  # it reaches DEFAULT_SLOTS and STREAM_MAXLEN
        checked_shape("promote", promote.replace("default_slots events_maxlen", "events_maxlen"))


def test_settings_arrive_after_the_scripts_own_arguments() -> None:
    """A script's settings follow its own ARGV (runner.Scripts) and the prelude names them from the end."""
    client = fakeredis.FakeRedis(decode_responses=True)
    text = prelude(shape("promote"), "") + "return {NARGV, DEFAULT_SLOTS, STREAM_MAXLEN}"
    assert client.eval(text, 0, "actor", 7, 900, 300_000) == [1, 7, 900]


def _covers(header: str, kind: str, n: int) -> bool:
    for m in re.finditer(rf"{kind}\[(\d+)(?:\.\.(\d*))?\]", header):
        low, dots, high = int(m.group(1)), ".." in m.group(0), m.group(2)
        if n == low or (dots and n >= low and (not high or n <= int(high))):
            return True
    return False


@pytest.mark.parametrize("name", sorted(SCRIPT_NAMES))
def test_each_script_opens_with_a_header(name: str) -> None:
    text = script_body(name)
    assert text.startswith(f"--[[ {name}\n"), "the header block comes first and names the operation"
    header, _, body = text.partition("]]")
    assert re.search(r"^Pool keys: ", header, re.M), "the pool keys it takes (_lib.lua)"
    assert re.search(r"^KEYS", header, re.M), "its own KEYS (or that it has none)"
    assert "ARGV[" in header and "Returns" in header
    for kind in ("KEYS", "ARGV"):
        for n in sorted({int(i) for i in re.findall(rf"{kind}\[(\d+)\]", strip_comments(body))}):
            assert _covers(header, kind, n), f"{name}.lua uses {kind}[{n}]; its header does not describe it"
    last_fixed = max((int(i) for i in re.findall(r"KEYS\[(\d+)\]", strip_comments(body))), default=0)
    if "candidates" in header:
        assert re.search(rf"KEYS\[{last_fixed + 1}\.\.\]\s+promotion candidates", header), (
            "candidates come last, right after the fixed keys")


@pytest.mark.parametrize("name", sorted(SCRIPT_NAMES))
def test_scripts_that_may_promote_say_where_their_candidates_are(name: str) -> None:
    text = script_body(name)
    header, _, body = text.partition("]]")
    m = re.search(r"promote_candidates\((\d+)", strip_comments(body))
    if not m:
        return
    first = int(m.group(1))
    fixed = max((int(i) for i in re.findall(r"KEYS\[(\d+)\]", strip_comments(body))), default=0)
    if first > fixed:
        assert re.search(rf"KEYS\[{first}\.\.\]\s+promotion candidates", header), (
            f"{name}.lua promotes from KEYS[{first}] on; its header does not say so")
    else:  # enqueue: the new job is its own (only) candidate, as job:<id>, rq:job:<id>
        assert re.search(rf"KEYS\[{first}\]\s+job:<id>", header)
        assert re.search(rf"KEYS\[{first + 1}\]\s+rq:job:<id>", header)


def _returned_tables(code: str) -> list[list[str]]:
    """The elements of every `return {...}` in `code` (comments dropped)."""
    return [split_args(code, m.end() - 1)[0] for m in re.finditer(r"\breturn\s*\{", code)]


@pytest.mark.parametrize("name", sorted(SCRIPT_NAMES))
def test_replies_have_one_shape(name: str) -> None:
    """An error reply is {code, detail}; a script that may free a slot replies {0, result, promoted,
    why_stopped, ...} on every success (_lib.lua), so the store reads them all alike."""
    code = strip_comments(script_body(name))
    replies = _returned_tables(code)
    assert replies, "the scan found the script's replies"
    frees = "promote_candidates(" in code
    for reply in replies:
        if reply[0] == "0":
            assert not frees or len(reply) >= 4, f"{name}.lua: {reply} lacks promoted and why_stopped"
        else:
            assert re.fullmatch(r"E_[A-Z_]+|f", reply[0]), f"{name}.lua: {reply} starts with no code"
            assert len(reply) == 2, f"{name}.lua: the error reply {reply} is not {{code, detail}}"


def test_the_reply_scan_catches_a_bare_code() -> None:
    assert _returned_tables("if f ~= 0 then return {f} end") == [["f"]]
    assert _returned_tables("return {0, promoted, why}") == [["0", "promoted", "why"]]
