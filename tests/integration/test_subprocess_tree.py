"""The subprocess executor's promise: every process a job started is gone before its slot is freed, as a
container's end ends everything in it (docs/architecture.md, "The subprocess executor's promise").

Real workers (JOBPOOL_EXECUTOR=subprocess) against the real redis-server; each job leaves a writer behind
that appends to a file and says its pid, and the tests look at that very process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobpool import JobState, Pool
from jobpool.config import STATE_FILE
from jobpool.jobcgroup import JobCgroup, directory, unavailable
from jobpool.procid import identity_of
from jobpool.spec import JobSpec
from jobpool.supervisor import Supervisor
from jobpool.supervisor.probes import Absent, Present, probe_process
from jobpool.supervisor.stopper import remove_empty_cgroups
from jobpool.supervisor.verdicts import REASON_DEAD_PID, WARN_UNADOPTABLE
from jobpool.workers.executors.base import Launch
from jobpool.workers.executors.subprocess import SubprocessExecutor
from tests.support.constants import SUB
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess, state_of

#: A command prefix under which a process finds no cgroup2 hierarchy where its mount table says (an empty
#: tmpfs over /sys/fs/cgroup, in a mount namespace of its own): a host that offers a job no cgroup.
NO_CGROUP = ("unshare", "--mount", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs none /sys/fs/cgroup && exec "$@"', "sh")
#: A writer that says its pid, then appends a line every 20 ms for as long as it lives.
WRITER = 'echo $$ > "$PIDFILE"; while :; do echo x >> "$OUT"; sleep 0.02; done'
#: A job that starts the writer in the background and exits 0 once it has written.
BACKGROUND = f"sh -c '{WRITER}' & " 'until test -s "$OUT"; do sleep 0.01; done; exit 0'


def alive(pid: int) -> bool:
    """The process runs (a zombie does no work: it waits for its parent to read its exit)."""
    return state_of(pid) not in ("", "Z")


@pytest.fixture
def writers(tmp_path: Path) -> Iterator[list[int]]:
    """Pids of the writers the jobs left; any still alive after the test is killed by pid."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def writer_env(tmp_path: Path, name: str) -> tuple[dict[str, str], Path, Path]:
    out, pidfile = tmp_path / f"{name}.out", tmp_path / f"{name}.pid"
    return {"OUT": str(out), "PIDFILE": str(pidfile)}, out, pidfile


def writer_pid(pidfile: Path) -> int:
    text = pidfile.read_text().strip() if pidfile.exists() else ""
    return int(text) if text else 0


def test_a_background_process_ends_with_its_job_before_the_next_job_starts(
        sub_pool: Pool, spawn: Callable[..., JobpoolProcess], tmp_path: Path, writers: list[int]) -> None:
    """`sh -c 'writer & exit 0'`: the job succeeds, and its writer is gone before the next job takes the only
    slot; the next job itself sees no writer and a file that does not grow."""
    sub_pool.set_slots(1)
    env, _out, pidfile = writer_env(tmp_path, "bg")
    first = sub_pool.enqueue("ignored", ["sh", "-c", BACKGROUND], env=env)
    verdict = tmp_path / "verdict"
    # The next job looks at the writer as it starts: its process state, and the file's size twice 0.3 s
    # apart (fifteen lines' worth of the writer's pace).
    look = ('w=$(cat "$PIDFILE"); s=$(cut -d" " -f3 /proc/$w/stat 2>/dev/null || echo gone); '
            'a=$(stat -c %s "$OUT"); sleep 0.3; b=$(stat -c %s "$OUT"); echo "$s $a $b" > "$VERDICT"')
    second = sub_pool.enqueue("ignored", ["sh", "-c", look], env={**env, "VERDICT": str(verdict)})
    spawn(**SUB)
    done = sub_pool.wait(first.id, timeout=30)
    writers.append(writer_pid(pidfile))
    assert done.state == JobState.SUCCEEDED and done.exit_code == 0
    assert writers[0] and not alive(writers[0]), "the job's background writer outlived its job"
    assert sub_pool.wait(second.id, timeout=30).state == JobState.SUCCEEDED
    state, before, after = verdict.read_text().split()
    assert state in ("gone", "Z"), f"the writer was still {state} when the next job started"
    assert before == after, "the file still grew while the next job ran"
    cgroup = json.loads(done.identity).get("cgroup")
    if cgroup:  # where the host gives a job a cgroup of its own, it is removed once it is empty
        assert not directory(cgroup).exists()


def test_a_cancelled_job_leaves_nothing_running_not_even_a_new_session(
        sub_pool: Pool, spawn: Callable[..., JobpoolProcess], tmp_path: Path, writers: list[int]) -> None:
    """A child that called setsid has left the job's process group and session; cancelling the job ends it
    all the same, before the job is recorded cancelled."""
    env, out, pidfile = writer_env(tmp_path, "setsid")
    job = sub_pool.enqueue("ignored", ["sh", "-c", f"setsid sh -c '{WRITER}' & "
                                       "while :; do sleep 0.05; done"], env=env)
    spawn(**SUB)
    pid = eventually(lambda: writer_pid(pidfile) if out.exists() else 0, timeout=30, message="writer started")
    writers.append(pid)
    assert os.getsid(pid) == pid, "the writer runs in a session of its own"
    sub_pool.cancel(job.id)
    done = sub_pool.wait(job.id, timeout=30)
    assert done.state == JobState.CANCELLED
    assert not alive(pid), "the cancelled job's setsid child still runs"
    cgroup = json.loads(done.identity).get("cgroup")
    if cgroup:
        assert not directory(cgroup).exists()


@pytest.mark.skipif(bool(unavailable()), reason=f"no job cgroup here: {unavailable()}")
def test_the_supervisor_keeps_the_slot_while_a_process_of_the_job_lives(tmp_path: Path) -> None:
    """A worker that died cannot end its job's tree: after the main process exits, what it left in the job's
    cgroup is still the job, and the supervisor's probe says so (the slot is kept) until it is gone; then
    the probe names the empty cgroup, which the sweep removes (supervisor/stopper.py)."""
    cgroup = JobCgroup.make(f"jobpool-test-{os.getpid()}")
    fd = cgroup.open_procs()
    try:
        main = subprocess.Popen(["sh", "-c", "setsid sleep 300 & echo $!"], stdout=subprocess.PIPE,
                                preexec_fn=lambda: os.write(fd, b"0"))
    finally:
        os.close(fd)
    identity = {"executor": "subprocess", **identity_of(main.pid), **cgroup.identity()}
    assert isinstance(probe_process(identity), Present)
    assert main.stdout is not None
    with main.stdout:
        left = int(main.stdout.readline())
    main.wait(10)
    eventually(lambda: state_of(main.pid) == "", timeout=5, message="the main process reaped")
    try:
        probe = probe_process(identity)
        assert isinstance(probe, Present) and probe.running, probe
        assert cgroup.path in probe.detail
    finally:
        cgroup.kill()
    eventually(lambda: isinstance(probe_process(identity), Absent), timeout=10,
               message="the cgroup emptied is the job gone")
    absent = probe_process(identity)
    assert isinstance(absent, Absent) and absent.empty_cgroup is not None
    assert cgroup.directory.exists(), "a probe only looks"
    remove_empty_cgroups([absent])
    assert not cgroup.directory.exists(), "the empty cgroup the probe found is removed"
    assert not alive(left)



@pytest.mark.skipif(bool(unavailable()), reason=f"no job cgroup here: {unavailable()}")
def test_a_dead_workers_job_holds_its_slot_while_a_process_it_started_lives(
        sub_pool: Pool, spawn: Callable[..., JobpoolProcess], tmp_path: Path, writers: list[int]) -> None:
    """The worker dies (SIGKILL, with its work horse) while its job runs, and the job's main process then
    exits, leaving a setsid writer that nobody is left to end. The supervisor keeps the slot while the writer
    lives, and frees it (a crash: recovery budget) once it is gone."""
    env, out, pidfile = writer_env(tmp_path, "orphan")
    go = tmp_path / "go"
    job = sub_pool.enqueue("ignored", ["sh", "-c", f"setsid sh -c '{WRITER}' & "
                                       f'while test ! -e "{go}"; do sleep 0.02; done; exit 0'], env=env)
    worker = spawn(**SUB)
    writers.append(eventually(lambda: writer_pid(pidfile) if out.exists() else 0, timeout=30,
                              message="writer started"))
    identity = json.loads(eventually(lambda: sub_pool.get(job.id).identity, timeout=10,
                                     message="the job's identity recorded"))
    assert identity.get("cgroup"), identity
    worker.kill_with_children()
    go.touch()
    eventually(lambda: not alive(identity["pid"]), timeout=10, message="the job's main process exited")
    sup = Supervisor(sub_pool.store)
    try:
        def kept() -> str:
            report = sup.sweep(job_ids=[job.id])
            return next((d.verdict.evidence for d in report.decisions if d.verdict.reason == WARN_UNADOPTABLE
                         and "processes it started still live" in d.verdict.evidence), "")

        evidence = eventually(kept, timeout=20, message="the slot kept for the writer")
        assert identity["cgroup"] in evidence
        assert sub_pool.get(job.id).state == JobState.RUNNING and alive(writers[0])
        os.kill(writers[0], signal.SIGKILL)

        def freed() -> bool:
            sup.sweep(job_ids=[job.id])
            return any(e["reason"] == REASON_DEAD_PID for e in sub_pool.events(job.id))

        eventually(freed, timeout=20, message="the slot freed once nothing of the job lives")
    finally:
        sup.close()
    assert not directory(identity["cgroup"]).exists(), "the empty cgroup is removed"


def background_job_in_its_group(executor: SubprocessExecutor, tmp_path: Path, name: str, job_id: str,
                                writers: list[int]) -> None:
    """Run a job leaving a background writer, launched with no cgroup (its process group stands in): the
    writer is gone once the job has ended."""
    env, _out, pidfile = writer_env(tmp_path, name)
    spec = JobSpec("ignored", ("sh", "-c", BACKGROUND), env=env, checkpoint=False)
    handle = executor.launch(Launch("t", job_id, 1, "boot", spec))
    assert handle.identity is not None and "cgroup" not in handle.identity
    ended = eventually(lambda: handle.wait(0.2), timeout=20, message="the job ended")
    writers.append(writer_pid(pidfile))
    assert ended.code == 0 and writers[0] and not alive(writers[0])
    handle.remove()


def test_without_a_cgroup_the_process_group_ends_with_its_job(tmp_path: Path, writers: list[int]) -> None:
    """Where no cgroup can be made (not root, no cgroup2 hierarchy, none writable), the executor falls back to
    the job's process group, and says so: a background process that stayed in the group ends with the job
    (one that called setsid would not: README, "The subprocess executor")."""
    executor = SubprocessExecutor(str(tmp_path / "state"))
    executor.uncontained = "forced off by this test"
    background_job_in_its_group(executor, tmp_path, "group", "j1", writers)


def test_a_worker_and_up_say_when_a_job_gets_no_cgroup(sub_pool: Pool, spawn: Callable[..., JobpoolProcess],
                                                       tmp_path: Path, writers: list[int]) -> None:
    """On a host where no cgroup can be made, the worker says at start that the executor cannot keep its
    promise, and so does `jobpool up` when it picks this executor; a background process that stayed in the
    job's process group still ends with the job."""
    worker = spawn(prefix=NO_CGROUP, **SUB)
    env, _out, pidfile = writer_env(tmp_path, "nocg")
    job = sub_pool.enqueue("ignored", ["sh", "-c", BACKGROUND], env=env)
    done = sub_pool.wait(job.id, timeout=30)
    writers.append(writer_pid(pidfile))
    assert done.state == JobState.SUCCEEDED and "cgroup" not in json.loads(done.identity)
    assert writers[0] and not alive(writers[0])
    assert "no cgroup of its own for a job here" in worker.log() and "setsid" in worker.log()
    state = tmp_path / "up"
    up = spawn(module="jobpool.cli", prefix=NO_CGROUP, args=(
        "up", "--executor", "subprocess", "--workers", "1", "--no-dashboard", "--state-dir", str(state)))
    eventually((state / STATE_FILE).exists, timeout=60, message="up is up")
    first = up.log().splitlines()[:3]
    assert first[1].startswith("  executor: subprocess"), first
    assert first[2].startswith("  warning: no cgroup") and "setsid" in first[2], first
    assert "outlive" in first[2]
    up.signal(signal.SIGINT)
    assert up.wait(60) == 0


@pytest.mark.skipif(bool(unavailable()), reason=f"no job cgroup here: {unavailable()}")
def test_a_child_that_cannot_enter_its_cgroup_runs_in_its_process_group(
        tmp_path: Path, writers: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A cgroup made but refused to the child (its `cgroup.procs` not writable by this user, say) is no fault
    of the job's: the child never reached its exec, so the job is started again without it, and the group
    stands in."""
    from jobpool.workers.executors import subprocess as executor_module

    def refused(procs: int) -> None:
        raise PermissionError("cgroup.procs: permission denied")

    monkeypatch.setattr(executor_module, "_enter", refused)
    executor = SubprocessExecutor(str(tmp_path / "state"))
    background_job_in_its_group(executor, tmp_path, "refused", "j2", writers)
