"""The supervisor and subprocess-executor rows: a recorded process identity, never a bare pid number.

A pid is evidence only together with the process start time, pid namespace and kernel boot id that were
recorded with it: a dead job whose pid number now names another process is dead, a process in another pid
namespace is unknown, and nothing is ever signalled by pid.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jobpool import Pool
from jobpool.procid import identity_of, kernel_boot_id, pid_namespace, start_time
from jobpool.supervisor import Supervisor, probe_process, reconcile, stop_orphan
from jobpool.supervisor.probes import Absent, Present, Unknown
from tests.support.attempts import claim
from tests.support.constants import FAST_SETTINGS
from tests.support.polling import eventually

DEAD = "dead-boot"
ROOT = Path(__file__).resolve().parents[2]
SETTINGS: dict[str, Any] = {**FAST_SETTINGS, "executor": "subprocess"}


@pytest.fixture
def pool(redis_url: str) -> Iterator[Pool]:
    p = Pool.from_url(redis_url, "sp", **SETTINGS)
    yield p
    p.store.client.close()


@pytest.fixture
def supervisor(pool: Pool) -> Iterator[Supervisor]:
    s = Supervisor(pool.store)
    yield s
    s.close()


@pytest.fixture
def sleeper() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen(["sleep", "300"]))
        return started[-1]

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def orphan(pool: Pool, identity: dict[str, Any] | None, wait_lease: bool = True) -> str:
    job = pool.get(pool.enqueue(image="busybox", command=["sleep", "300"]).id)
    assert job.state.value == "running"
    att = claim(pool, job.id, DEAD)
    if identity is not None:
        att.set_container(identity=identity)
    if wait_lease:
        eventually(lambda: not pool.store.client.exists(pool.keys.lease(job.id)), message="lease expiring")
    return job.id


def test_live_unrelated_pid_with_another_start_time_is_dead(pool: Pool, supervisor: Supervisor) -> None:
    """The recorded pid number is alive, but names another process (this test runner): dead."""
    me = os.getpid()
    fake = {"pid": me, "start_time": start_time(me) - 5, "pidns": pid_namespace(),
            "boot_id": kernel_boot_id()}
    assert isinstance(probe_process(fake), Absent)
    job_id = orphan(pool, fake)
    b = pool.enqueue(image="busybox", command=["true"])
    report = supervisor.sweep()
    job = pool.get(job_id)
    assert (job.state.value, job.error_reason) == ("failed", "orphan_reconciled_dead_pid")
    assert report.verdicts == {"absent": 1} and pool.get(b.id).state.value == "running"


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root")
def test_recycled_pid_in_a_fresh_pid_namespace_is_judged_dead(redis_url: str) -> None:
    """A real recycled pid: in a new pid namespace, the job's process dies and the kernel hands its very pid
    number to a new process (ns_last_pid); the supervisor, in that namespace, must judge the job dead."""
    script = textwrap.dedent("""
        import json, os, subprocess, sys, time
        from jobpool import Pool
        from jobpool.workers.attempt import Attempt
        from jobpool.procid import identity_of, start_time
        from jobpool.supervisor import Supervisor, probe_process
        settings = json.loads(sys.argv[2])
        pool = Pool.from_url(sys.argv[1], "ns", **settings)
        job = pool.get(pool.enqueue(image="busybox", command=["sleep", "300"]).id)
        att = Attempt(pool.store, job.id, "dead-boot", job.attempt)
        att.claim()
        first = subprocess.Popen(["sleep", "300"])
        ident = identity_of(first.pid)
        att.set_container(identity=ident)
        first.kill(); first.wait()
        # A new process must start in a later clock tick, or start times could not tell them apart.
        deadline = time.monotonic() + 5
        ticks = os.sysconf("SC_CLK_TCK")
        while time.clock_gettime(time.CLOCK_BOOTTIME) * ticks < ident["start_time"] + 2:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(first.pid - 1))
        second = subprocess.Popen(["sleep", "300"])
        try:
            deadline = time.monotonic() + 5
            while pool.store.client.exists(pool.keys.lease(job.id)):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            probe = probe_process(ident)
            sup = Supervisor(pool.store)
            report = sup.sweep()
            sup.close()
            row = pool.get(job.id)
            print(json.dumps({"first": first.pid, "second": second.pid, "second_alive": second.poll() is None,
                              "probe": type(probe).__name__, "state": row.state.value,
                              "reason": row.error_reason, "identity": ident,
                              "verdicts": dict(report.verdicts)}))
        finally:
            second.kill(); second.wait()
            pool.store.client.close()
    """)
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script, redis_url,
         json.dumps(SETTINGS)], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["second"] == result["first"] and result["second_alive"], result  # the pid was recycled
    assert result["probe"] == "Absent"
    assert (result["state"], result["reason"], result["verdicts"]) == (
        "failed", "orphan_reconciled_dead_pid", {"absent": 1})
    # Seen from outside that namespace, the same identity is not ours to judge.
    assert isinstance(probe_process(result["identity"]), Unknown)


def test_live_orphan_process_keeps_its_slot_until_it_exits(
        pool: Pool, supervisor: Supervisor, sleeper: Callable[[], subprocess.Popen[bytes]],
        caplog: pytest.LogCaptureFixture) -> None:
    proc = sleeper()
    job_id = orphan(pool, identity_of(proc.pid))
    b = pool.enqueue(image="busybox", command=["true"])
    caplog.set_level(logging.WARNING, logger="jobpool.supervisor")
    for _ in range(3):
        report = supervisor.sweep()
        assert report.verdicts == {"warn": 1}
        assert report.decisions[0].verdict.reason == "orphan_process_alive"
    assert isinstance(probe_process(identity_of(proc.pid)), Present)
    assert pool.get(job_id).state.value == "running" and pool.get(b.id).state.value == "queued"
    assert sum(job_id in r.getMessage() and "re-parented" in r.getMessage() for r in caplog.records) == 3
    proc.kill()
    proc.wait(10)
    supervisor.sweep()
    assert pool.get(job_id).error_reason == "orphan_reconciled_dead_pid"
    assert pool.get(b.id).state.value == "running"


def test_identity_in_another_pid_namespace_is_unknown(pool: Pool, supervisor: Supervisor) -> None:
    me = os.getpid()
    other_ns = {"pid": me, "start_time": start_time(me), "pidns": pid_namespace() + 1,
                "boot_id": kernel_boot_id()}
    job_id = orphan(pool, other_ns)
    report = supervisor.sweep()
    assert (report.verdicts, report.unknown) == ({"warn": 1}, 1)
    assert "another pid namespace" in report.decisions[0].verdict.evidence
    assert pool.get(job_id).state.value == "running"


def test_no_identity_recorded_is_unknown_not_dead(pool: Pool, supervisor: Supervisor) -> None:
    """The worker died between spawning and recording: a process may exist that nobody can name."""
    job_id = orphan(pool, None)
    report = supervisor.sweep()
    assert report.verdicts == {"warn": 1} and report.unknown == 1
    assert pool.get(job_id).state.value == "running"


def test_cancel_of_a_subprocess_orphan_never_signals_a_pid(
        pool: Pool, supervisor: Supervisor, sleeper: Callable[[], subprocess.Popen[bytes]],
        caplog: pytest.LogCaptureFixture) -> None:
    proc = sleeper()
    job_id = orphan(pool, identity_of(proc.pid))
    pool.cancel(job_id)
    caplog.set_level(logging.ERROR, logger="jobpool.supervisor")
    result = stop_orphan(pool.store, job_id)
    assert result.action == "manual_stop_needed"
    assert proc.poll() is None, "the process must not have been signalled"
    assert any("stopped by hand" in r.getMessage() and job_id in r.getMessage() for r in caplog.records)
    assert pool.get(job_id).state.value == "running"
    os.kill(proc.pid, signal.SIGTERM)  # the operator, by hand
    proc.wait(10)
    supervisor.sweep()
    assert pool.get(job_id).state.value == "cancelled"


def test_evicting_a_stale_subprocess_job_warns_loudly_and_signals_nothing(
        redis_url: str, sleeper: Callable[[], subprocess.Popen[bytes]],
        caplog: pytest.LogCaptureFixture) -> None:
    pool = Pool.from_url(redis_url, "sp", **{**SETTINGS, "lease_secs": 300, "job_stale_seconds": 1})
    try:
        proc = sleeper()
        job_id = orphan(pool, identity_of(proc.pid), wait_lease=False)
        eventually(lambda: reconcile(pool.store, dry_run=True).verdicts.get("warn"),
                   message="job turning stale")
        caplog.set_level(logging.ERROR, logger="jobpool.supervisor")
        report = reconcile(pool.store, evict_stale=True)
        assert report.decisions[0].outcome == "failed"
        assert pool.get(job_id).error_reason == "stale_evicted"
        assert proc.poll() is None
        assert any("never signals" in r.getMessage() for r in caplog.records)
    finally:
        pool.store.client.close()
