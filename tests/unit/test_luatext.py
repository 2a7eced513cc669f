"""jobpool/store/luatext.py: each script is loaded with the shared definitions it reaches, and with nothing it
needs left out."""

from __future__ import annotations

import re

import pytest
import redis

from jobpool import contract
from jobpool.store import luatext
from jobpool.store.luatext import script_text
from jobpool.store.runner import SCRIPT_NAMES
from tests.support.pool_helpers import Backend

WORD = re.compile(r"[A-Za-z_]\w*")


def top_level_names(text: str) -> set[str]:
    """Every name a line at column 0 defines with `local` (read independently of luatext's own pattern)."""
    names = set()
    for line in text.splitlines():
        if m := re.match(r"local function (\w+)", line):
            names.add(m.group(1))
        elif m := re.match(r"local ([\w, ]+?) =", line):
            names.update(n.strip() for n in m.group(1).split(","))
    return names


def test_the_split_loses_no_text_and_finds_every_definition() -> None:
    shared = luatext._shared()
    defs = luatext.definitions(shared)
    body = re.sub(r"--\[\[.*?\]\]\n?", "", shared, flags=re.DOTALL)
    assert body.endswith("".join(d.text for d in defs))
    head = body[:len(body) - len("".join(d.text for d in defs))]
    assert all(line.startswith("--") for line in head.splitlines() if line.strip())  # comments alone
    assert set().union(*(d.names for d in defs)) == top_level_names(body)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_a_loaded_script_has_every_shared_definition_it_names(name: str) -> None:
    text = script_text(name)
    words = set(WORD.findall(text))
    for d in luatext.definitions(luatext._shared()):
        if d.names & words:
            assert d.text in text, f"{name} names {sorted(d.names & words)} but was loaded without it"


def test_a_script_is_loaded_without_what_it_does_not_reach() -> None:
    heartbeat = script_text("heartbeat")
    assert "local function fence(" in heartbeat  # it fences its write
    for unreached in ("local function promote_candidates(", "local METRIC_REASONS", "local RQ_JOB_FIELDS"):
        assert unreached not in heartbeat
    assert "local RQ_JOB_FIELDS" in script_text("enqueue")  # reached only by the scripts that write RQ's hash
    # A helper reached only through another helper is kept, and before the helper that calls it.
    enqueue = script_text("enqueue")
    assert enqueue.index("local function metric_reason(") < enqueue.index("local function transition_field(")
    alone = luatext.needed(luatext.definitions(luatext._shared()), "return now_ms()")
    assert "local function now_ms(" in alone and "local function metric_reason(" not in alone


def test_a_shared_text_the_split_cannot_read_is_refused() -> None:
    with pytest.raises(ValueError, match="before its first top-level"):
        luatext.definitions("redis.call('PING')\nlocal A = 1\n")
    with pytest.raises(ValueError, match="defines nothing readable"):
        luatext.definitions("local = 1\n")
    # A statement of its own after a definition would be kept or dropped with that definition.
    with pytest.raises(ValueError, match="no definition, comment or `end`"):
        luatext.definitions("local A = {}\nredis.call('DEL', KEYS[1])\nlocal B = 1\n")
    with pytest.raises(ValueError, match="does not end at column 0"):  # a `local` at column 0 inside f
        luatext.definitions("local function f()\nlocal x = 1\n  return x\nend\n")
    for hidden in ("local A = 1 --[[ c ]]\nlocal B = 2\n", "local A = [[\nlocal B = 2\n]]\n",
                   "local A = 1 ---[[ x\nlocal B = KEYS[X[1]]\n", "local A = [=[x]=]\n"):
        with pytest.raises(ValueError, match="long bracket"):
            luatext.definitions(hidden)
    text = "--[[ header\nlocal X = 1\n]]\nlocal function f()\n  return 1\nend\n-- B\nlocal B = {\n}\n"
    assert [d.names for d in luatext.definitions(text)] == [frozenset({"f"}), frozenset({"B"})]


def test_what_the_split_keeps_runs_and_what_it_leaves_out_is_refused_by_redis(backend: Backend) -> None:
    # The guarantee the closure rests on: a name the loaded text lacks is not silently nil, Redis refuses it.
    defs = luatext.definitions(luatext._shared())
    script = "return {whole('7'), EXIT_TEMPFAIL}"
    assert backend.raw.eval(luatext.needed(defs, script) + script, 0) == [7, contract.EXIT_TEMPFAIL]
    with pytest.raises(redis.ResponseError):
        backend.raw.eval(script, 0)
