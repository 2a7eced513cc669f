"""An installed wheel finds its Lua scripts (STYLE.md item 1): they ship as package data, read through
importlib.resources, not from the checkout.

The wheel is built from this checkout, installed non-editable into a fresh venv (system site-packages give
it redis, rq and fakeredis without a download), and used from a directory that is not the checkout, with no
PYTHONPATH, so the only jobpool importable is the installed one.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from jobpool.registry import SCRIPT_NAMES

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import jobpool, sys
from jobpool import Pool
from jobpool.registry import script_text, SCRIPT_NAMES
texts = [script_text(n) for n in SCRIPT_NAMES]
assert all('local function fence' in t for t in texts), 'the shared _lib.lua is not prepended'
import fakeredis
from jobpool.config import Settings
pool = Pool(fakeredis.FakeRedis(decode_responses=True), Settings(max_concurrent_jobs=1))
job = pool.enqueue(image='busybox', command=['true'])
assert job.state.value == 'running', job
print(jobpool.__file__)
"""


def run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_installed_wheel_finds_its_scripts(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    build = [sys.executable, "-m", "pip", "wheel", str(ROOT), "-w", str(dist), "--no-deps", "-q"]
    if importlib.util.find_spec("hatchling") is not None:
        build.append("--no-build-isolation")  # the backend is here already: no index needed
    run(build, cwd=tmp_path)
    (wheel,) = dist.glob("jobpool-*.whl")

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    expected = {f"jobpool/scripts/{n}.lua" for n in (*SCRIPT_NAMES, "_lib")}
    assert expected <= names, f"missing from the wheel: {sorted(expected - names)}"
    assert not any(n.startswith(("tests/", "bench/")) for n in names)

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = run([str(python), "-c", CHECK], cwd=elsewhere).stdout.strip().splitlines()[-1]
    installed = Path(out).resolve()
    assert installed.is_relative_to(venv.resolve()), f"imported {installed}, not the installed wheel"
    assert not installed.is_relative_to(ROOT)
