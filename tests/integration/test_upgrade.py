"""Upgrades (docs/architecture.md, "Upgrades"): every door refuses a pool newer than its release knows, in
one line, writing nothing; `jobpool migrate` records a pool's layout once, idempotently; and a rolling upgrade
from the previous release (built as a wheel from its commit) to this one, with both releases' workers on one
pool while jobs run throughout, loses no job, does none's work twice (a job a draining worker hands back
resumes from its checkpoint), never runs a job beside itself, and never more jobs at once than the slots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobpool import JobState, Pool
from jobpool.contract import SCHEMA_VERSION
from jobpool.store import schema
from tests.support.bad_input import cli, one_line_error
from tests.support.constants import SUB
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.snapshot import keyspace

ROOT = Path(__file__).resolve().parents[2]
#: The previous release (0.2.0, as it landed): the rolling upgrade's old side. Its promotions make a job of
#: this release's enqueue visible to RQ without RQ's record of it (0.3.0 writes it at the first promotion,
#: 0.2.0 wrote it at enqueue): the supervisors' redispatch writes it whole past the claim grace (CHANGELOG).
PREVIOUS = "de3dc89"
SLOTS = 2
JOBS = 12
#: A job of the rolling upgrade: a second of work in two halves; stopped (a draining worker's stop signal), it
#: keeps the half it finished and exits 75 to be handed back, and run again it does only what is left.
JOB = """
ck="$JOBPOOL_CHECKPOINT_DIR/half"
trap 'echo stop {i} >> {runs}; exit 75' TERM
echo start {i} >> {runs}
if [ ! -f "$ck" ]; then sleep 0.5 & wait $!; touch "$ck"; fi
sleep 0.5 & wait $!
echo end {i} >> {runs}
"""

DOORS = [
    pytest.param("jobpool.workers", (), id="python -m jobpool.workers"),
    pytest.param("jobpool.cli", ("supervisor",), id="jobpool supervisor"),
    pytest.param("jobpool.cli", ("enqueue", "img", "--", "true"), id="jobpool enqueue"),
]


@pytest.mark.parametrize(("module", "args"), DOORS)
def test_a_pool_newer_than_this_release_is_refused_at_every_door(
        redis_url: str, pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess], module: str,
        args: tuple[str, ...]) -> None:
    env = {**pool_env, **SUB}
    pool = Pool.from_env(env=env)
    try:
        pool.enqueue("img", ["true"])
        pool.store.client.hset(pool.keys.config, schema.FIELD, SCHEMA_VERSION + 1)  # a later release's
        before = keyspace(pool.store.client)
        process = spawn(module, args, **env)
        code = process.wait(30)
        lines = process.log().strip().splitlines()
        assert code == 1 and len(lines) == 1, process.log()[-3000:]
        assert lines[0].startswith("Error: ") and "newer than this jobpool" in lines[0], lines
        assert keyspace(pool.store.client) == before
    finally:
        pool.close()


def test_migrate_records_the_layout_once_and_says_so(redis_url: str, pool_env: dict[str, str]) -> None:
    pool = Pool.from_env(env=pool_env)
    try:
        pool.enqueue("img", ["true"])
        pool.store.client.hdel(pool.keys.config, schema.FIELD)  # a pool of 0.1.0: no version recorded
        dry = cli("--json", "migrate", "--dry-run", env=pool_env)
        assert dry.returncode == 0 and json.loads(dry.stdout)["dry_run"], dry.stderr
        assert pool.store.recorded_schema() is None
        first = cli("migrate", env=pool_env)
        assert first.returncode == 0 and f"version {SCHEMA_VERSION}: recorded it" in first.stdout, first
        again = cli("migrate", env=pool_env)
        assert again.returncode == 0 and "nothing to do" in again.stdout, again
        pool.store.client.hset(pool.keys.config, schema.FIELD, SCHEMA_VERSION + 1)
        newer = cli("migrate", env=pool_env)
        assert one_line_error(newer, 1) is None, newer
    finally:
        pool.close()


# ---- the rolling upgrade -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release installed in a directory of its own (its wheel, built from its commit), to put
    first on PYTHONPATH; its dependencies are this release's."""
    work = tmp_path_factory.mktemp("previous")
    git = ["git", "-C", str(ROOT)]
    shallow = subprocess.run([*git, "rev-parse", "--is-shallow-repository"], capture_output=True, text=True,
                             check=False)
    if shallow.stdout.strip() == "true":  # a shallow clone (a CI's) has not got the commit: fetch history
        subprocess.run([*git, "fetch", "--quiet", "--unshallow"], capture_output=True, check=False)
    archive = subprocess.run([*git, "archive", "--format=tar", PREVIOUS], capture_output=True, check=False)
    assert archive.returncode == 0, f"commit {PREVIOUS} (the previous release) must be in this clone: " \
                                    f"{archive.stderr.decode()[-500:]}"
    src = work / "src"
    src.mkdir()
    archive_path = work / "src.tar"
    archive_path.write_bytes(archive.stdout)
    with tarfile.open(archive_path) as tar:
        tar.extractall(src, filter="data")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
                            str(work / "wheels"), str(src)], capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (work / "wheels").glob("jobpool-*.whl")
    site = work / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                                str(site), str(wheel)], capture_output=True, text=True, check=False)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return site


class Sampler:
    """The pool's used slots, every 20 ms, from a thread: the most seen."""

    def __init__(self, pool: Pool) -> None:
        self.pool, self.most, self._stop = pool, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.most = max(self.most, self.pool.slots()[0])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def sampler(pool: Pool) -> Iterator[Sampler]:
    s = Sampler(pool)
    yield s
    s.close()


def test_a_rolling_upgrade_with_jobs_running_loses_none_and_runs_none_twice(
        previous_release: Path, pool: Pool, pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess],
        tmp_path: Path, sampler: Sampler) -> None:
    runs = tmp_path / "runs.log"
    old_env = {**SUB, "PYTHONPATH": str(previous_release)}
    # `python -m` puts its working directory first on sys.path: run the old side from elsewhere, so that it
    # imports the previous release, not this checkout.
    old_cwd = ("env", "-C", str(tmp_path))

    def old(module: str, args: tuple[str, ...] = ()) -> JobpoolProcess:
        return spawn(module, args, prefix=old_cwd, **old_env)

    version = subprocess.run([*old_cwd, sys.executable, "-c", "import importlib.util as u; "
                              "print(u.find_spec('jobpool.livelogs') is None)"],
                             env={**os.environ, **old_env}, capture_output=True, text=True, check=True)
    assert version.stdout.strip() == "True", "the old side runs the previous release (no live logs)"

    pool.set_slots(SLOTS)
    old_sup = old("jobpool.cli", ("supervisor",))
    old_workers = [old("jobpool.workers") for _ in range(SLOTS)]
    ids = [pool.enqueue("ignored", ["sh", "-c", JOB.format(i=i, runs=runs)]).id for i in range(JOBS)]

    def succeeded() -> int:
        return sum(pool.get(i).state is JobState.SUCCEEDED for i in ids)

    eventually(lambda: succeeded() >= 2, timeout=60, message="the old release runs jobs")
    # Supervisors first, then the layout is recorded, then the workers one by one, jobs running throughout.
    new_sup = spawn("jobpool.cli", ("supervisor",), **SUB)
    old_sup.stop()
    assert cli("migrate", env={**pool_env, **SUB}).returncode == 0
    for worker in old_workers:
        spawn(**SUB)
        done = succeeded()
        worker.stop()  # SIGTERM: it drains, its job handed back with its checkpoint
        # A stop can take the test's 30 s (the old release waits on RQ's pubsub close for ever now and then,
        # and is then killed), long enough for the new workers to run every job left: that is running on too.
        eventually(lambda d=done: succeeded() > d or succeeded() == JOBS, timeout=60,
                   message="jobs run on through the change")
    eventually(lambda: succeeded() == JOBS, timeout=120, message="every job ran")
    # Jobs this release enqueued and the old workers promoted had no RQ record (0.3.0 writes it at the first
    # promotion): each ran after a supervisor's redispatch wrote it whole.
    assert any(e["reason"] == "redispatched" for i in ids for e in pool.events(i)), "the old side promoted"
    assert new_sup.proc.poll() is None, "the new supervisor runs on"
    lines = runs.read_text().split()
    events = list(zip(lines[0::2], lines[1::2], strict=True))
    ends = [n for what, n in events if what == "end"]
    assert sorted(ends, key=int) == [str(i) for i in range(JOBS)], f"each job's work done once: {events}"
    running: set[str] = set()
    most = 0
    for what, n in events:
        if what == "start":
            assert n not in running, f"job {n} ran beside itself: {events}"
            running.add(n)
        else:
            running.remove(n)
        most = max(most, len(running))
    assert most <= SLOTS and sampler.most <= SLOTS, (most, sampler.most)
    assert pool.store.recorded_schema() == str(SCHEMA_VERSION)
