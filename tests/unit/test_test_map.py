"""tests/README.md's map from the package to its tests is whole: every module and Lua script of jobpool/ is in
it with at least one test file, every test file is in it, and every path it names exists. A module moved or
added, or a test file added, without its line fails here, so the map cannot go stale."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
PACKAGE_FILE = re.compile(r"`(jobpool/[\w/]+\.(?:py|lua))`")
TEST_FILE = re.compile(r"`((?:unit|integration)/test_\w+\.py)`")


def map_entries() -> list[str]:
    """The map's bullets, each with its continuation lines joined."""
    text = (TESTS / "README.md").read_text()
    return [" ".join(item.split()) for item in re.split(r"\n- ", text)[1:]]


def test_every_module_script_and_test_file_is_in_the_map() -> None:
    entries = map_entries()
    named_modules = {m for e in entries for m in PACKAGE_FILE.findall(e)}
    named_tests = {t for e in entries for t in TEST_FILE.findall(e)}

    package = {p.relative_to(ROOT).as_posix() for p in (ROOT / "jobpool").rglob("*")
               if p.suffix in (".py", ".lua")}
    tests = {p.relative_to(TESTS).as_posix() for layer in ("unit", "integration")
             for p in (TESTS / layer).glob("test_*.py")}

    assert sorted(package - named_modules) == [], "package files missing from tests/README.md's map"
    assert sorted(named_modules - package) == [], "tests/README.md names package files that do not exist"
    assert sorted(tests - named_tests) == [], "test files missing from tests/README.md's map"
    assert sorted(named_tests - tests) == [], "tests/README.md names test files that do not exist"
    untested = [e.split(":")[0] for e in entries if PACKAGE_FILE.search(e) and not TEST_FILE.search(e)]
    assert untested == [], "map lines that name no test file"
