"""Only jobpool/store/ names a Lua script: every other module calls the store's typed methods
(jobpool/store/calls.py), so no KEYS, ARGV or reply position is written outside it."""

from __future__ import annotations

import re
from pathlib import Path

import jobpool
from jobpool.store.runner import SCRIPT_NAMES

ROOT = Path(jobpool.__file__).parent
#: A script named in a call: `run("claim", ...)`, `scripts.run("enqueue", ...)`, `register_script(...)`.
CALL = re.compile(r"""\brun\(\s*["'](""" + "|".join(SCRIPT_NAMES) + r""")["']|register_script\(""")


def test_only_the_store_names_a_script() -> None:
    outside = [p for p in ROOT.rglob("*.py") if "store" not in p.relative_to(ROOT).parts[:1]]
    assert len(outside) > 20, "the scan found the package"
    found = [f"{p.relative_to(ROOT)}:{n}" for p in outside
             for n, line in enumerate(p.read_text().splitlines(), 1) if CALL.search(line)]
    assert found == []


def test_the_scan_finds_a_call_by_name() -> None:
    assert CALL.search('reply = self.pool.run("claim", keys, args)')
    assert CALL.search("pool.store.scripts.run('prune', keys, args)")
    assert not CALL.search("pool.store.claim(job_id, boot_id, 1, 30_000, '', '', token)")
