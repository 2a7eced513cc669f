"""The worker's check of its own host (jobpool/workers/hostcheck.py) and what `status` makes of it
(jobpool/status/health.py): a worker holding its claims is not ready, and a warning says why."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rq.exceptions import StopRequested

from jobpool.status import Health, Slots, StatusReport, Worker, Workers, judge
from jobpool.workers import hostcheck
from jobpool.workers.executors.base import CHECKPOINT_ROOT, DOCKER, HostFault
from jobpool.workers.hostcheck import HostCheck
from tests.support.polling import eventually


def check(directory: str, published: list[str], ping: Callable[[], object] | None = None) -> HostCheck:
    c = HostCheck(directory, CHECKPOINT_ROOT, "boot1", every=3600, ping=ping, publish=published.append)
    c.start()
    return c


def test_a_writable_root_passes_and_leaves_no_marker(tmp_path: Path) -> None:
    published: list[str] = []
    c = check(str(tmp_path / "root"), published)
    try:
        c.before_dequeue(lambda: None, lambda: False)  # waits for the first probe, which passes
        assert c.problem() == "" and published == [] and os.listdir(tmp_path / "root") == []
    finally:
        c.stop()


def test_an_unusable_root_holds_until_a_stop(tmp_path: Path) -> None:
    (tmp_path / "root").write_text("not a directory")
    published: list[str] = []
    c = check(str(tmp_path / "root"), published)
    idled: list[float] = []
    try:
        with pytest.raises(StopRequested):
            c.before_dequeue(lambda: idled.append(time.monotonic()), lambda: len(idled) >= 2)
        assert published and "is unusable" in published[-1] and str(tmp_path / "root") in published[-1]
    finally:
        c.stop()


def test_a_docker_fault_holds_until_the_daemon_answers_and_handbacks_in_a_row_back_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostcheck, "BACKOFF_FIRST_SECS", 0.2)
    monkeypatch.setattr(hostcheck, "RECHECK_SECS", 0.05)
    answers = [False, False, True, True, True, True]

    def ping() -> None:
        if not answers.pop(0):
            raise ConnectionRefusedError("refused")

    published: list[str] = []
    c = check("", published, ping)
    try:
        c.before_dequeue(lambda: None, lambda: False)
        c.note.write(HostFault(DOCKER, "no connection for the create (refused)"))
        t0 = time.monotonic()
        c.before_dequeue(lambda: None, lambda: False)
        assert time.monotonic() - t0 >= 0.2 and answers[0] is True  # held until a ping answered
        assert any("does not answer" in p for p in published), published
        assert published[-1] == ""  # claims again, and says so
        c.note.write(HostFault(CHECKPOINT_ROOT, "x"))
        t0 = time.monotonic()
        c.before_dequeue(lambda: None, lambda: False)
        assert time.monotonic() - t0 >= 0.4  # the second handback in a row: twice the pause
    finally:
        c.stop()


def report(*boots: Worker, slots: int = 2) -> StatusReport:
    workers = Workers(live=len(boots), draining=0, stale=0, boots=boots)
    return StatusReport(pool="p", redis_url="redis://", reachable=True, health=Health(), now_ms=0,
                        slots=Slots(0, slots), workers=workers)


def test_status_counts_a_worker_holding_its_claims_as_not_ready_and_says_why() -> None:
    health = judge(report(Worker("b1", host="h1", cannot_claim="checkpoint root /r is unusable: EROFS"),
                          Worker("b2", host="h2")), 1.0)
    assert any("1 ready for 2 slots (1 not claiming" in r for r in health.reasons), health
    said = "b1 on h1 is not claiming: checkpoint root /r is unusable: EROFS"
    assert any(said in w for w in health.warnings), health
    assert not any("not claiming" in r for r in judge(report(Worker("b2"), slots=1), 1.0).reasons)


def test_the_recheck_runs_each_round_and_its_failure_stops_no_probe(tmp_path: Path) -> None:
    """The worker re-reads its daemon's live-restore setting on this thread (workers/__init__.py,
    `host_check`): called once a round after the probes; an error is logged, and the probes go on."""
    calls: list[float] = []

    def recheck() -> None:
        calls.append(time.monotonic())
        raise ConnectionError("no answer")

    published: list[str] = []
    c = HostCheck(str(tmp_path / "root"), CHECKPOINT_ROOT, "boot1", every=0.05, ping=None,
                  publish=published.append, recheck=recheck)
    c.start()
    try:
        eventually(lambda: len(calls) >= 3, timeout=10, message="three rounds called the recheck")
        c.before_dequeue(lambda: None, lambda: False)
        assert c.problem() == "" and published == []
    finally:
        c.stop()
