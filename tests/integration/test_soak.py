"""The chaos soak (bench/soak.py) at CI size: every fault kind injected, and the promises' figures are zero."""

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
    figures = run_soak(jobs=20, slots=2, workers=3, seed=7, max_minutes=7, fault_every=(2.0, 3.5))
    print(figures.line())
    assert set(figures.faults) == set(FAULTS), figures.line()
    assert figures.samples > 50, "the daemon was sampled throughout"
    assert figures.lost == 0, figures.line()
    assert figures.over_limit_instants == 0, figures.line()
    assert not figures.double_container_jobs, figures.line()
    assert figures.stuck == 0, figures.line()
    assert figures.illegal_transitions == 0, figures.line()
    assert figures.jobs >= 20 and sum(figures.outcomes.values()) == figures.jobs
