"""The cross-layer contract (jobpool/contract.py) is defined once, and the Lua scripts see the same values.

A label, exit code or limit copied by hand drifts: a label renamed on the worker side alone would make every
probe say "absent". These checks read the sources for copies and run the scripts to see the generated
constants in force, on fakeredis[lua] and on a real server.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import cast

import pytest

import jobpool
from jobpool import contract, errors
from jobpool.contract import EXIT_TEMPFAIL, MAX_SLOTS, JobState
from jobpool.spec import build_spec
from jobpool.store.keys import PoolKeys
from jobpool.store.luatext import script_text, shape
from jobpool.store.runner import SCRIPT_NAMES
from tests.support.pool_helpers import Backend, enqueue, rq_hash

PACKAGE = Path(jobpool.__file__).parent
SCRIPTS = resources.files("jobpool") / "scripts"
LIB = (SCRIPTS / "_lib.lua").read_text()

#: Spellings that must appear in jobpool/ only where contract.py defines them.
LITERALS = {
    "a container label": re.compile(r"""["']jobpool\.(pool|job_id|attempt|boot_id)\b"""),
    "a job environment name": re.compile(r"JOBPOOL_(JOB_ID|ATTEMPT|CHECKPOINT_DIR)\b"),
    "the tempfail exit code": re.compile(rf"(?<![\w.]){EXIT_TEMPFAIL}(?![\w.])"),
    "the RQ meta attempt key": re.compile(contract.RQ_META_ATTEMPT),
}


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".lua") and p.name != "contract.py")


@pytest.mark.parametrize("what", LITERALS)
def test_jobpool_spells_the_contract_only_in_contract_py(what: str) -> None:
    found = [f"{p.relative_to(PACKAGE)}:{n}: {line.strip()}"
             for p in _sources() for n, line in enumerate(p.read_text().splitlines(), 1)
             if LITERALS[what].search(line)]
    assert not found, f"{what} copied outside jobpool/contract.py:\n" + "\n".join(found)


def test_labels_are_all_reserved_from_job_specs() -> None:
    labels = [contract.LABEL_POOL, contract.LABEL_JOB, contract.LABEL_ATTEMPT, contract.LABEL_BOOT]
    assert all(label.startswith(contract.LABEL_PREFIX) for label in labels)
    with pytest.raises(errors.InvalidSpec):
        build_spec({"image": "busybox", "command": ["true"], "labels": {contract.LABEL_JOB: "x"}})


#: Constants whose value is too common a number to search for: MAX_PRIORITY is 1000, as in every ms
#: conversion; LIMIT_NAME_MAX_CHARS is 128, as in UTF-8's bytes.
_COMMON_VALUES = {"MAX_PRIORITY", "LIMIT_NAME_MAX_CHARS"}


@pytest.mark.parametrize("name", [n for n, v in contract.LUA_CONSTANTS.items()
                                  if len(str(v)) > 1 and n not in _COMMON_VALUES])
def test_scripts_never_write_a_generated_value(name: str) -> None:
    # A one-digit value (HISTORY_HEAD_EVENTS) is left out: every script writes small indexes, which this
    # search cannot tell from it.
    value = str(contract.LUA_CONSTANTS[name])
    for script in ("_lib", *SCRIPT_NAMES):
        text = (SCRIPTS / f"{script}.lua").read_text()
        assert not re.search(rf"(?<![\w.]){re.escape(value)}(?![\w.])", text), \
            f"{script}.lua writes {value} instead of {name}"


def test_every_script_is_loaded_with_the_constants_it_names_first() -> None:
    definitions = [line for line in contract.lua_constants().splitlines() if line.startswith("local ")]
    assert len(definitions) == len(contract.LUA_CONSTANTS)
    for name in SCRIPT_NAMES:
        text = script_text(name)
        helpers = text.find("local function ")
        for line in definitions:
            rest = text.replace(line, "")
            if re.search(rf"\b{line.split()[1]}\b", rest):  # the script or a helper it has names it
                assert line in text, f"{name} names {line.split()[1]} without its definition"
                assert helpers < 0 or text.index(line) < helpers, f"{name}: {line.split()[1]} after a helper"


def test_the_generated_block_holds_the_contract_values(backend: Backend) -> None:
    names = list(contract.LUA_CONSTANTS)
    got = backend.client.eval(contract.lua_constants() + f"return {{{', '.join(names)}}}", 0)
    def as_reply(v: object) -> object:  # what a Lua value comes back as: a table is a list
        return [as_reply(x) for x in v] if isinstance(v, tuple) else str(v) if isinstance(v, str) else v

    assert got == [as_reply(v) for v in contract.LUA_CONSTANTS.values()]


def test_lua_slot_ceiling_is_the_contract_one(backend: Backend) -> None:
    pool = backend.pool()
    pool.store.run("set_slots", pool.store.candidates(0), [MAX_SLOTS, "test"])
    assert int(cast(str, pool.store.client.hget(pool.keys.config, "max_concurrent_jobs"))) == MAX_SLOTS
    with pytest.raises(errors.InvalidArgument):
        pool.store.run("set_slots", pool.store.candidates(0), [MAX_SLOTS + 1, "test"])


def test_promotion_writes_the_attempt_under_the_contract_meta_key(backend: Backend) -> None:
    pool = backend.pool()
    job = enqueue(pool)
    meta = rq_hash(backend, pool, job.id)[b"meta"].decode()
    assert meta == f'{{"{contract.RQ_META_ATTEMPT}":1}}'


def test_state_names_agree_across_layers() -> None:
    """Lua writes states through STATE_INDEX (set_state in _lib.lua, placed by jobpool/store/luatext.py);
    store/keys.py names an index for each, and the script is handed that very key in that place."""
    table = re.search(r"STATE_INDEX = \{([^}]*)\}", script_text("finish"))
    assert table
    places = dict(re.findall(r"(\w+) = K_(\w+)", table.group(1)))
    assert set(places) == {s.value for s in JobState}
    keys = PoolKeys("p")
    assert len({keys.state_index(s.value) for s in JobState}) == len(JobState)
    named = keys.named(shape("finish").pool_keys)
    for state, key in places.items():
        assert named[shape("finish").pool_keys.index(key.lower())] == keys.state_index(state)
    assert jobpool.JobState is JobState and jobpool.models.JobState is JobState
