"""The chaos soak (bench/soak.py) at CI size: every fault kind met live jobs twice, and the promises' figures
are zero. Its fleet runs on two private dockerd daemons that share Docker's ID, with workers reaching Redis
and one daemon through fault proxies (tests/support/proxies.py); see bench/soak_fleet.py. It runs as a
long-lived pool with small retention caps (`keep`): finished jobs are pruned as it goes, its checks must tell
a pruned job from a lost one, and once the caps are reached Redis's keys and memory stay flat
(bench/soak_watch.py)."""

from __future__ import annotations

import pytest

from bench.soak import FAULTS, Figures, run_soak
from bench.soak_edges import EDGE_FAULTS
from bench.soak_faults import HOST_FAULTS
from bench.soak_subprocess import FAULTS as SUBPROCESS_FAULTS
from bench.soak_subprocess import run_soak as run_subprocess_soak
from jobpool.jobcgroup import unavailable
from tests.support.servers import DockerDaemon, RedisServer


def assert_the_zeros(figures: Figures, jobs: int) -> None:
    """The promises: every job accounted for, the daemons sampled throughout, and every zero held."""
    assert figures.samples > 50, "the daemons were sampled throughout"
    assert figures.lost == 0, figures.line()
    assert figures.over_limit_instants == 0, (figures.line(), figures.findings)
    assert figures.over_named_limit_instants == 0, (figures.line(), figures.findings)
    assert not figures.double_container_jobs, (figures.line(), figures.findings)
    assert figures.stuck == 0, figures.line()
    assert figures.illegal_transitions == 0, figures.line()
    assert figures.events_unseen == 0, figures.line()
    assert figures.swallowed == 0, figures.line()
    t = figures.time  # bench/soak_time.py: dependents, schedule ticks, delayed starts, retries
    assert not (t.dependents_early or t.dependency_cancels_wrong or t.ticks_twice or t.delayed_early
                or t.retry_breaches), (figures.line(), t.lines())
    assert t.met["released"] and t.met["retried_by_policy"] and t.met["fired"], \
        "jobs waited, were retried, and the schedule fired"
    assert figures.jobs >= jobs and sum(figures.outcomes.values()) == figures.jobs


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_soak_keeps_every_promise_under_faults(redis_server: RedisServer,
                                               docker_daemon: DockerDaemon) -> None:
    # The fixtures are asked for only so a machine without the servers skips (CI fails) the same way; the soak
    # starts private ones of its own, because it kills and restarts them.
    figures = run_soak(jobs=20, slots=2, workers=4, seed=7, max_minutes=7, fault_every=(2.0, 3.5), rounds=2,
                       keep=3, events_maxlen=100)
    print(figures.line())
    assert {k for k, n in figures.faults.items() if n >= 2} == set(FAULTS), figures.line()
    assert figures.rolled_back_events > 0, "a Redis rollback took back transitions"
    assert_the_zeros(figures, jobs=20)
    # Retention ran under the faults: most finished rows went, each accounted for by a prune event, and the
    # keyspace was flat at the caps.
    assert sum(figures.pruned.values()) >= figures.jobs // 2, figures.line()
    assert figures.pruned_unaccounted == 0, figures.line()
    keyspace = figures.keyspace
    assert keyspace is not None and keyspace["censuses"] >= 4, figures.line()
    assert keyspace["keys_flat"], (figures.line(), keyspace)
    assert keyspace["memory_flat"], (figures.line(), keyspace)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_soak_over_three_daemons_keeps_every_promise_under_host_faults(redis_server: RedisServer,
                                                                       docker_daemon: DockerDaemon) -> None:
    """The fleet over three daemons (one supervisor attached to daemon 1, one to none), meeting the faults of
    whole hosts twice each: all workers of a daemon killed until its inventory is stale, a daemon's
    containers removed under its live workers, a host rebooted (bench/soak_faults.py, HOST_FAULTS); and those
    at the fleet's edges and on the worker's host: a claim Redis forgot after its worker died, a daemon
    forgotten that comes back, Redis restarted during a launch, a read-only checkpoint root, a cloned data
    root, a worker without a daemon, a frozen standby (bench/soak_edges.py, EDGE_FAULTS)."""
    kinds = (*HOST_FAULTS, *EDGE_FAULTS, "worker_sigkill", "pause_resume", "dockerd_restart")
    figures = run_soak(jobs=20, slots=3, workers=5, seed=11, max_minutes=7, fault_every=(1.5, 3.0), rounds=2,
                       faults=kinds, daemons=3)
    print(figures.line())
    assert {k for k, n in figures.faults.items() if n >= 2} == set(kinds), figures.line()
    assert_the_zeros(figures, jobs=20)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(bool(unavailable()), reason=f"no job cgroup here: {unavailable()}")
def test_subprocess_soak_ends_every_process_of_a_job_before_its_slot_is_freed(
        redis_server: RedisServer) -> None:
    """The subprocess executor's soak (bench/soak_subprocess.py): jobs that leave background children (some
    in a session of their own, some deaf to SIGTERM) under worker SIGKILL and SIGTERM, supervisor restarts,
    cancels and pauses, each met twice. No process of a job lives once its row is terminal or its slot was
    freed, never more jobs with live processes than slots; a SIGKILLed worker's leftovers keep their job's
    slot until the soak, as the person the supervisor's warning asks, kills them through `cgroup.kill`."""
    figures = run_subprocess_soak(jobs=20, slots=2, workers=3, seed=5, max_minutes=3.5,
                                  fault_every=(1.5, 3.0), rounds=2)
    print(figures.line())
    assert {k for k, n in figures.faults.items() if n >= 2} == set(SUBPROCESS_FAULTS), figures.line()
    assert figures.samples > 50, "the processes were sampled throughout"
    assert figures.max_live_procs > figures.max_live_jobs, "jobs left background children, and they were seen"
    assert figures.over_limit_instants == 0, (figures.line(), figures.breaches)
    assert not figures.after_end, (figures.line(), figures.breaches)
    assert not figures.after_slot, (figures.line(), figures.breaches)
    assert figures.lost == 0 and figures.stuck == 0, figures.line()
    assert figures.illegal_transitions == 0 and figures.events_unseen == 0, figures.line()
    assert figures.kept_for_leftovers and figures.leftovers_killed, figures.line()
    assert not figures.cgroups_left, (figures.line(), figures.cgroups_left)
    assert figures.zeros_hold()
    assert figures.jobs >= 20 and sum(figures.outcomes.values()) == figures.jobs


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(bool(unavailable()), reason=f"no job cgroup here: {unavailable()}")
def test_subprocess_soak_sees_a_process_that_outlives_its_job(redis_server: RedisServer) -> None:
    """The check of the check: a job whose child moves itself out of the job's cgroup (a job running as root
    can) outlives its job, and the soak says its zeros broke."""
    figures = run_subprocess_soak(jobs=2, slots=1, workers=2, seed=2, max_minutes=2,
                                  faults=("supervisor_restart",), escape=1)
    print(figures.line())
    assert len(figures.after_end) == 1, (figures.line(), figures.breaches)
    assert not figures.zeros_hold()
