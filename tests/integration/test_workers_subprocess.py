"""The subprocess executor (no Docker): same outcomes and drain as containers; a recycled pid is not the
job."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobpool import JobState, Pool
from jobpool.procid import identity_of, same_process_alive
from tests.support.constants import CHECKPOINTING, SUB
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess


def test_success_failure_and_env(sub_pool: Pool, spawn: Callable[..., JobpoolProcess]) -> None:
    env_check = 'echo "$JOBPOOL_JOB_ID $JOBPOOL_ATTEMPT"; test -d "$JOBPOOL_CHECKPOINT_DIR"'
    ok = sub_pool.enqueue("ignored", ["sh", "-c", env_check])
    bad = sub_pool.enqueue("ignored", ["sh", "-c", "echo nope; exit 4"])
    spawn(**SUB)
    assert sub_pool.wait(ok.id, timeout=30).state == JobState.SUCCEEDED
    assert sub_pool.logs(ok.id).strip() == f"{ok.id} 1"
    done = sub_pool.wait(bad.id, timeout=30)
    assert done.state == JobState.FAILED and done.exit_code == 4 and "nope" in sub_pool.logs(bad.id)
    identity = json.loads(done.identity)
    assert identity["executor"] == "subprocess" and identity["pid"] > 0 and identity["start_time"] > 0


def test_missing_program_fails_at_launch(sub_pool: Pool, spawn: Callable[..., JobpoolProcess]) -> None:
    job = sub_pool.enqueue("ignored", ["/nonexistent/program"])
    spawn(**SUB)
    done = sub_pool.wait(job.id, timeout=30)
    assert done.state == JobState.FAILED and done.error_reason.startswith("launch_failed")
    assert sub_pool.slots()[0] == 0


def test_drain_hands_back_and_resumes(sub_pool: Pool, spawn: Callable[..., JobpoolProcess]) -> None:
    job = sub_pool.enqueue("ignored", ["sh", "-c", CHECKPOINTING])
    w = spawn(**SUB)
    eventually(lambda: "started" in sub_pool_log(sub_pool, job.id), timeout=20, message="job started")
    w.signal(signal.SIGTERM)
    assert w.wait(15) == 0
    handed = [e for e in sub_pool.events(job.id) if e["from"] == "running" and e["to"] == "queued"]
    assert handed and handed[0]["reason"] == "shutdown_handback"
    spawn(**SUB)
    done = sub_pool.wait(job.id, timeout=30)
    assert done.state == JobState.SUCCEEDED and done.recovery_attempts == 0
    assert "resumed with step" in sub_pool.logs(job.id)


def sub_pool_log(pool: Pool, job_id: str) -> str:
    """The live log of a running subprocess job (logs reach the row only when it ends)."""
    logs = Path(pool.settings.state_dir).absolute() / "logs" / pool.keys.pool
    return "".join(p.read_text(errors="replace") for p in logs.glob(f"{job_id}-a*.log"))


def test_identity_is_not_fooled_by_a_recycled_pid(tmp_path: Path) -> None:
    """In a fresh pid namespace pid numbers start again at 1: a live process there may hold the number a dead
    job had. The recorded start time (and namespace) tell them apart."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import json, subprocess, sys\n"
        "from jobpool.procid import identity_of, same_process_alive\n"
        "p = subprocess.Popen(['sleep', '0']); p.wait()\n"  # a job that ran and died, freeing small pids
        "q = subprocess.Popen(['sleep', '30'])\n"  # an unrelated live process
        "me = identity_of(q.pid)\n"
        "fake = dict(me, start_time=me['start_time'] - 1)\n"  # same pid number, another process's start time
        "print(json.dumps({'alive': same_process_alive(me), 'recycled': same_process_alive(fake),"
        " 'pid': q.pid}))\n"
        "q.kill()\n"
    )
    out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    verdict = json.loads(out.stdout)
    assert verdict["pid"] < 10, "a new pid namespace hands out small, recycled numbers"
    assert verdict["alive"] is True
    assert verdict["recycled"] is False


def test_identity_from_another_namespace_is_unknown() -> None:
    """Seen from outside, a pid recorded inside another pid namespace proves nothing either way."""
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sleep", "30"])
    try:
        def inner_identity() -> dict[str, Any] | None:
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            return identity_of(int(kids[0])) if kids else None

        ident = eventually(inner_identity, timeout=10, message="sleep started in its namespace")
        assert ident["pidns"] != identity_of(proc.pid)["pidns"]
        assert same_process_alive({**ident, "pid": 1}) is None
    finally:
        proc.kill()
        proc.wait(10)


def test_dead_process_is_dead() -> None:
    p = subprocess.Popen(["sleep", "30"])
    ident = identity_of(p.pid)
    assert same_process_alive(ident) is True
    p.kill()
    p.wait(10)
    eventually(lambda: same_process_alive(ident) is False, timeout=5, message="a reaped process is dead")


def test_jobs_enqueued_in_bulk_run_to_success_in_fifo_order(
        sub_pool: Pool, spawn: Callable[..., JobpoolProcess], tmp_path: Path) -> None:
    """`enqueue_many` across batch boundaries, with a twin that coalesces: real workers run every job, one
    slot at a time, in input order."""
    sub_pool.set_slots(1)
    ran = tmp_path / "order.txt"
    specs = [{"image": "ignored", "command": ["sh", "-c", f'echo {i} >> "{ran}"'], "coalesce": True}
             for i in range(7)]
    specs.insert(4, dict(specs[2]))  # equal to a job still queued: coalesces into it, runs once
    jobs = sub_pool.enqueue_many(specs, batch_size=3)
    assert jobs[4].coalesced and jobs[4].id == jobs[2].id
    assert jobs[0].state is JobState.RUNNING and all(j.state is JobState.QUEUED for j in jobs[1:])
    spawn(**SUB)
    spawn(**SUB)
    done = [sub_pool.wait(j.id, timeout=60) for j in jobs]
    assert all(d.state is JobState.SUCCEEDED and d.attempt == 1 for d in done)
    assert ran.read_text().split() == [str(i) for i in range(7)]
    unique = [d for i, d in enumerate(done) if i != 4]
    assert [d.seq for d in unique] == sorted(d.seq for d in unique)
    promoted = [d.promoted_at or 0 for d in unique]
    assert promoted == sorted(promoted)
