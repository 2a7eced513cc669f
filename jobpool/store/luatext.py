"""The text each Lua script is loaded as: the shared definitions it uses, then the script itself.

Every script is one EVALSHA, and Redis runs a script's whole text on every call: each `local function` of the
shared library (scripts/_lib.lua) and each constant table (jobpool/contract.py's block, RQ's job hash fields)
is made again each time, whether the script calls it or not. The library made whole can cost a short script
more server time than its own work, so a script is loaded with only the definitions it reaches: those its own
text names, then those theirs name, and so on.

The selection errs only on the side of keeping: a definition is kept when its name appears anywhere in kept
text as a word, comments and strings included, and Lua has no way to name a local other than by its word. A
definition left out would be a nonexistent global to Redis, which refuses such a read with an error; the
tests load and run every script (tests/unit/test_luatext.py checks the split and the closure).

A script is given only the pool keys and settings its header names (`Pool keys:`, `Settings:`; scripts/
_lib.lua says what they are): `shape` reads those lines, and the loaded text starts with the names that
place them (`prelude`). The header must name exactly what the loaded text reaches, so it is checked against
that text here, at load, and a script that reaches an unnamed key, or names one it never reaches, is refused.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from dataclasses import dataclass
from importlib import resources

from .. import contract, rqjob
from .keys import POOL_KEY_NAMES, STATE_INDEX_KEYS

#: A block comment that starts a line (the shared text has no other long bracket: `definitions` refuses one).
_BLOCK_COMMENT = re.compile(r"^--\[\[.*?\]\]\n?", re.DOTALL | re.MULTILINE)
_LONG_BRACKET = re.compile(r"--\[|\[\[|\[=")
#: A top-level definition starts a line with `local`. The shared text's rule, which `definitions` enforces:
#: nothing else starts a line at column 0 but a comment, a function's closing `end` or a table's `}`.
_TOP = re.compile(r"^local ", re.MULTILINE)
_DEFINES = re.compile(r"local\s+(?:function\s+(\w+)|([\w\s,]+?)\s*=)")
_WORD = re.compile(r"[A-Za-z_]\w*")
_LINE_COMMENT = re.compile(r"--[^\n]*")
_POOL_KEY_USE = re.compile(r"\bK_([A-Z_]+)\b")

#: The settings a script may name, as `Settings:` spells them, and the Lua name each is given.
SETTING_NAMES = {"default_slots": "DEFAULT_SLOTS", "events_maxlen": "STREAM_MAXLEN",
                 "reserve_after_ms": "RESERVE_AFTER_MS", "retry_delay_max_ms": "RETRY_DELAY_MAX_MS"}


@dataclass(frozen=True)
class Shape:
    """What a script takes besides its own KEYS and ARGV, in order: the pool keys after its KEYS (names of
    store/keys.py's POOL_KEY_NAMES) and the settings after its ARGV (`SETTING_NAMES`)."""

    pool_keys: tuple[str, ...]
    settings: tuple[str, ...]


@dataclass(frozen=True)
class Definition:
    """One top-level `local` statement of the shared text: the names it defines and its text."""

    names: frozenset[str]
    text: str


def definitions(shared: str) -> list[Definition]:
    """The shared text's top-level definitions, in order (block comments dropped: they say, never do)."""
    body = _BLOCK_COMMENT.sub("", shared)
    if m := _LONG_BRACKET.search(body):  # a long string or comment could hide or fake a line's start
        raise ValueError(f"a long bracket the split does not read: {body[m.start():m.start() + 60]!r}")
    starts = [m.start() for m in _TOP.finditer(body)]
    head = body[:starts[0]] if starts else body
    if any(line.strip() and not line.startswith("--") for line in head.split("\n")):
        raise ValueError("the shared Lua text has a statement before its first top-level `local`")
    out = []
    for start, end in zip(starts, [*starts[1:], len(body)], strict=True):
        text = body[start:end]
        m = _DEFINES.match(text)
        if m is None:
            raise ValueError(f"a top-level `local` defines nothing readable: {text[:60]!r}")
        names = [m.group(1)] if m.group(1) else [n.strip() for n in m.group(2).split(",")]
        for line in text.split("\n")[1:]:  # a statement of its own here would go or stay with this one
            if line[:1] not in ("", " ", "-", "}") and line.rstrip() != "end":
                raise ValueError(f"a line at column 0 that is no definition, comment or `end`: {line[:60]!r}")
        code = [line for line in text.split("\n") if line.strip() and not line.startswith("--")]
        if code[0].startswith("local function ") and code[-1].rstrip() != "end":  # cut by a `local` in it
            raise ValueError(f"function {names[0]} does not end at column 0 before the next definition")
        out.append(Definition(frozenset(names), text))
    return out


def needed(defs: list[Definition], script: str) -> str:
    """The definitions of `defs` that `script` reaches, in their order, as one text."""
    words = set(_WORD.findall(script))
    keep = [False] * len(defs)
    changed = True
    while changed:  # later definitions may name earlier ones: repeat until nothing is added
        changed = False
        for i in range(len(defs) - 1, -1, -1):
            if not keep[i] and defs[i].names & words:
                keep[i], changed = True, True
                words.update(_WORD.findall(defs[i].text))
    return "".join(d.text for d, k in zip(defs, keep, strict=True) if k)


def _header_names(script: str, label: str, allowed: Collection[str]) -> tuple[str, ...]:
    header = script.split("]]", 1)[0]
    # A line of names, continued on the lines after it that start with a space.
    found = re.findall(rf"^{label}:(.*(?:\n[ \t]+.*)*)", header, re.MULTILINE)
    if label == "Pool keys" and len(found) != 1:
        raise ValueError(f"the header has {len(found)} `{label}:` lines, not one")
    if len(found) > 1:
        raise ValueError(f"the header has {len(found)} `{label}:` lines")
    names = tuple(n for n in (found[0].split() if found else []) if n != "none")
    if unknown := [n for n in names if n not in allowed]:
        raise ValueError(f"`{label}:` names {unknown}, which are not among {sorted(allowed)}")
    if len(set(names)) != len(names):
        raise ValueError(f"`{label}:` names one twice: {names}")
    return names


def _reached(code: str) -> tuple[set[str], set[str]]:
    """The pool keys and settings that `code` (comments dropped) uses."""
    keys = {m.lower() for m in _POOL_KEY_USE.findall(code)}
    if re.search(r"\bSTATE_INDEX\b", code):
        keys |= set(STATE_INDEX_KEYS.values())
    settings = {s for s, lua in SETTING_NAMES.items() if re.search(rf"\b{lua}\b", code)}
    return keys, settings


def prelude(shape: Shape, code: str) -> str:
    """The names a script's text is given first: its own key and argument counts, each pool key's place and
    each setting's value, and STATE_INDEX when `code` uses it."""
    lines = [f"local NKEYS = #KEYS - {len(shape.pool_keys)}", f"local NARGV = #ARGV - {len(shape.settings)}"]
    for i, name in enumerate(shape.pool_keys):
        lines.append(f"local K_{name.upper()} = NKEYS + {i + 1}")
    for i, name in enumerate(shape.settings):
        at = len(shape.settings) - 1 - i
        lines.append(f"local {SETTING_NAMES[name]} = tonumber(ARGV[#ARGV - {at}])")
    if re.search(r"\bSTATE_INDEX\b", code):
        pairs = ", ".join(f"{state} = K_{key.upper()}" for state, key in STATE_INDEX_KEYS.items())
        lines.append(f"local STATE_INDEX = {{{pairs}}}")
    return "\n".join(lines) + "\n"


@functools.cache
def _shared() -> str:
    """The text every script's definitions are taken from: the contract's constants, RQ's job hash fields
    (jobpool/rqjob.py, for `rq_record`), then scripts/_lib.lua."""
    return (contract.lua_constants() + rqjob.lua_template()
            + (resources.files("jobpool") / "scripts" / "_lib.lua").read_text() + "\n")


def _own(name: str) -> str:
    return (resources.files("jobpool") / "scripts" / f"{name}.lua").read_text()


@functools.cache
def shape(name: str) -> Shape:
    """The pool keys and settings script `name` takes, from its header, checked against what its loaded
    text reaches (`checked_shape`)."""
    return checked_shape(name, _own(name))


def checked_shape(name: str, script: str) -> Shape:
    """The `Shape` the header of `script` (the text of script `name`) names; ValueError when it names a key or
    setting the loaded text (what it reaches of the shared text, and itself) never uses, or misses one it
    does."""
    declared = Shape(_header_names(script, "Pool keys", POOL_KEY_NAMES),
                     _header_names(script, "Settings", SETTING_NAMES))
    code = _BLOCK_COMMENT.sub("", needed(definitions(_shared()), script) + script)
    keys, settings = _reached(_LINE_COMMENT.sub("", code))
    for what, named, used in (("Pool keys", set(declared.pool_keys), keys),
                              ("Settings", set(declared.settings), settings)):
        if named != used:
            raise ValueError(f"{name}.lua: its `{what}:` line names {sorted(named)}, its text reaches "
                             f"{sorted(used)}")
    return declared


@functools.cache
def script_text(name: str) -> str:
    """The text loaded as script `name`: what it reaches of the contract's constants, RQ's job hash fields
    and scripts/_lib.lua, in that order, each preceded by the `prelude` of its
    `shape`, then the script itself. Fixed for the life of the process, and so is its SHA."""
    script = _own(name)
    body = needed(definitions(_shared()), script) + script
    return prelude(shape(name), _LINE_COMMENT.sub("", _BLOCK_COMMENT.sub("", body))) + body
