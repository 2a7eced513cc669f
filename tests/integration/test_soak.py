"""The chaos soak (bench/soak.py) at CI size: every fault kind met live jobs twice, and the promises' figures
are zero. Its fleet runs on two private dockerd daemons that share Docker's ID, with workers reaching Redis
and one daemon through fault proxies (tests/proxies.py); see bench/soak_fleet.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from soak import FAULTS, run_soak  # noqa: E402


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_soak_keeps_every_promise_under_faults(redis_server, docker_daemon) -> None:
    # The fixtures are asked for only so a machine without the servers skips (CI fails) the same way; the soak
    # starts private ones of its own, because it kills and restarts them.
    figures = run_soak(jobs=20, slots=2, workers=4, seed=7, max_minutes=7, fault_every=(2.0, 3.5), rounds=2)
    print(figures.line())
    assert {k for k, n in figures.faults.items() if n >= 2} == set(FAULTS), figures.line()
    assert figures.rolled_back_events > 0, "a Redis rollback took back transitions"
    assert figures.samples > 50, "the daemons were sampled throughout"
    assert figures.lost == 0, figures.line()
    assert figures.over_limit_instants == 0, (figures.line(), figures.findings)
    assert not figures.double_container_jobs, (figures.line(), figures.findings)
    assert figures.stuck == 0, figures.line()
    assert figures.illegal_transitions == 0, figures.line()
    assert figures.jobs >= 20 and sum(figures.outcomes.values()) == figures.jobs
