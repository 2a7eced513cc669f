"""Every status code a script can return maps to one exception, in one table
(jobpool.store.runner.ERROR_CODES).

The codes are read from the scripts' text, not copied by hand: the `local E_... = -1, ...` line of _lib.lua
names them, and every `.lua` file is scanned for the names it returns (directly, or through `fence`) and for
any negative literal returned without a name.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest

from jobpool import errors
from jobpool.store.runner import _MESSAGES, ERROR_CODES, SCRIPT_NAMES, raise_for_code

SCRIPTS = resources.files("jobpool") / "scripts"

#: What each named code means (the comment table of _lib.lua) and the exception a caller should catch.
EXPECTED = {
    "E_NOT_FOUND": errors.NotFound,
    "E_INVALID_STATE": errors.InvalidState,
    "E_NOT_OWNER": errors.NotOwner,
    "E_CONFLICT": errors.Conflict,
    "E_EXISTS": errors.AlreadyExists,
    "E_BAD_ARG": errors.InvalidArgument,
    "E_BAD_SPEC": errors.InvalidSpec,
}

#: Helpers in _lib.lua whose result a script returns as its status: the codes they can produce.
HELPER_CODES = {"fence": {"E_NOT_FOUND", "E_NOT_OWNER"}}


def lua(name: str) -> str:
    return (SCRIPTS / f"{name}.lua").read_text()


def code_table() -> dict[str, int]:
    """The `local E_A, E_B = -1, -2` assignment of _lib.lua, as {name: code}."""
    m = re.search(r"^local (E_\w+(?:\s*,\s*E_\w+)*)\s*=\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*$", lua("_lib"), re.M)
    assert m, "_lib.lua has no `local E_... = -1, ...` line"
    names = [n.strip() for n in m.group(1).split(",")]
    codes = [int(c) for c in m.group(2).split(",")]
    assert len(names) == len(codes)
    return dict(zip(names, codes, strict=True))


def code_names_used(text: str) -> set[str]:
    """E_ names a script returns, directly or through a helper whose status it returns."""
    used = set(re.findall(r"\{\s*(E_\w+)", text))
    for helper, codes in HELPER_CODES.items():
        if re.search(rf"=\s*{helper}\(", text):
            used |= codes
    return used


def all_lua_files() -> list[str]:
    return sorted(p.name[:-4] for p in SCRIPTS.iterdir() if p.name.endswith(".lua"))


def test_the_code_table_is_the_documented_one() -> None:
    table = code_table()
    assert set(table) == set(EXPECTED), "a code was added or renamed: add it to EXPECTED and ERROR_CODES"
    header = lua("_lib").split("]]")[0]
    for name, code in table.items():
        assert code < 0
        assert re.search(rf"(?<![\d-]){code} \w", header), f"{name} ({code}) not in _lib.lua header"
    assert len(set(table.values())) == len(table), "two names share a code"


def test_every_script_is_registered_and_every_registered_script_exists() -> None:
    assert set(all_lua_files()) - {"_lib"} == set(SCRIPT_NAMES)


def test_no_script_returns_an_unnamed_negative_code() -> None:
    for name in all_lua_files():
        text = lua(name)
        assert not re.search(r"return\s*\{\s*-\s*\d", text), f"{name}.lua returns a bare negative literal"
        assert not re.search(r"return\s+-\s*\d", text) or name == "_lib", f"{name}.lua returns a bare code"


def test_every_code_a_script_can_return_is_mapped() -> None:
    table = code_table()
    used: set[str] = set()
    for name in all_lua_files():
        names = code_names_used(lua(name))
        unknown = names - set(table)
        assert not unknown, f"{name}.lua returns codes not defined in _lib.lua: {unknown}"
        used |= names
    assert used == set(table), f"defined but never returned: {set(table) - used}"
    for code_name in used:
        code = table[code_name]
        assert code in ERROR_CODES, f"{code_name} ({code}) has no exception in runner.ERROR_CODES"
        assert code in _MESSAGES, f"{code_name} ({code}) has no message in registry._MESSAGES"
    assert set(ERROR_CODES) == set(table.values()), "ERROR_CODES maps a code no script defines"


@pytest.mark.parametrize("name", sorted(SCRIPT_NAMES))
def test_each_script_header_documents_the_codes_it_returns(name: str) -> None:
    text = lua(name)
    header = text.split("]]")[0]
    returns = header[header.index("Returns"):]
    table = code_table()
    for code_name in code_names_used(text):
        assert re.search(rf"(?<![\d-]){table[code_name]}(?!\d)", returns), (
            f"{name}.lua can return {code_name} ({table[code_name]}) but its header's Returns omits it")


@pytest.mark.parametrize("code_name", sorted(EXPECTED))
def test_raise_for_code_raises_the_mapped_class(code_name: str) -> None:
    code = code_table()[code_name]
    assert ERROR_CODES[code] is EXPECTED[code_name]
    with pytest.raises(EXPECTED[code_name]) as info:
        raise_for_code("claim", [code, "running"])
    assert type(info.value) is EXPECTED[code_name]
    assert isinstance(info.value, errors.JobpoolError) and "{" not in str(info.value)
    if code_name == "E_INVALID_STATE":
        assert info.value.state == "running"  # type: ignore[attr-defined]


def test_bad_argument_message_names_the_operation_and_the_argument() -> None:
    with pytest.raises(errors.InvalidArgument, match="finish: bad argument exploded"):
        raise_for_code("finish", [code_table()["E_BAD_ARG"], "exploded"])


def test_a_code_without_an_argument_still_has_a_message() -> None:
    with pytest.raises(errors.NotOwner, match="heartbeat: this worker no longer owns the job"):
        raise_for_code("heartbeat", [code_table()["E_NOT_OWNER"]])


def test_success_and_unknown_codes() -> None:
    raise_for_code("promote", [0, 1, "full"])  # no exception
    with pytest.raises(errors.JobpoolError, match="failed with code -99") as info:
        raise_for_code("promote", [-99])
    assert type(info.value) is errors.JobpoolError
