"""`/metrics` served by a real `jobpool supervisor` process (JOBPOOL_METRICS_PORT), scraped over HTTP and
parsed with prometheus-client's own parser, against a fleet put in a known state: real redis-server, real
workers on a real dockerd where jobs must run, a real supervisor probing process identities where the
evidence is the point. Every figure asserted follows from what the test did.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import pytest
import redis

from jobpool import JobState, Pool
from jobpool.contract import JOB_DURATION_BUCKETS
from jobpool.procid import kernel_boot_id, pid_namespace, start_time
from tests.support.attempts import claim
from tests.support.bad_input import cli, one_line_error
from tests.support.constants import IMAGE, SUB
from tests.support.metrics_scrape import Samples, scrape, start_supervisor, value
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.servers import RedisServer, free_port
from tests.support.snapshot import keyspace

EVERY_METRIC = {
    "jobpool_slots_max", "jobpool_slots_used", "jobpool_slots_unknown", "jobpool_jobs",
    "jobpool_queue_oldest_age_seconds", "jobpool_workers_live", "jobpool_transitions",
    "jobpool_probe_results", "jobpool_sweep_duration_seconds", "jobpool_job_duration_seconds",
    "jobpool_recoveries", "jobpool_promotion_paused", "jobpool_redis_reachable", "jobpool_healthy",
    "jobpool_sweep_overruns", "jobpool_redis_eviction_policy_ok", "jobpool_last_sweep_age_seconds",
    "jobpool_sweep_interval_seconds",
}


def test_a_fleet_in_a_known_state_is_what_metrics_says(pool: Pool, spawn: Callable[..., JobpoolProcess],
                                                       docker_host: str) -> None:
    """Two succeeded, one failed, one cancelled, one running, one queued behind a paused queue, two slots,
    two live workers; then a second supervisor (the first stopped) serves the same counters."""
    pool.set_slots(2)
    ok = [pool.enqueue(IMAGE, ["true"]) for _ in range(2)]
    bad = pool.enqueue(IMAGE, ["sh", "-c", "exit 3"])
    for _ in range(2):
        spawn()
    port = free_port()
    sup = start_supervisor(spawn, port)
    assert [pool.wait(j.id, timeout=90).state for j in ok] == [JobState.SUCCEEDED] * 2
    assert pool.wait(bad.id, timeout=90).state == JobState.FAILED
    long = pool.enqueue(IMAGE, ["sh", "-c", "echo started; sleep 300"])
    eventually(lambda: pool.get(long.id).owner_boot, timeout=60, message="the long job claimed")
    pool.pause(None, reason="test")
    waiting = pool.enqueue(IMAGE, ["true"])
    doomed = pool.enqueue(IMAGE, ["true"])
    pool.cancel(doomed.id)
    eventually(lambda: (w := pool.status().workers) is not None and w.live == 2, timeout=30,
               message="two live workers")
    sweeps_before = value(scrape(port)[1], "jobpool_sweep_duration_seconds_count")
    families, s = eventually(lambda: (r := scrape(port)) and
                             value(r[1], "jobpool_sweep_duration_seconds_count") > sweeps_before and r,
                             timeout=30, message="a sweep after the fleet settled")
    assert families >= EVERY_METRIC
    assert value(s, "jobpool_slots_max") == 2 and value(s, "jobpool_slots_used") == 1
    assert value(s, "jobpool_slots_unknown") == 0
    assert {st.value: value(s, "jobpool_jobs", state=st.value) for st in JobState} == {
        "queued": 1, "waiting": 0, "running": 1, "paused": 0, "succeeded": 2, "failed": 1, "cancelled": 1}
    assert value(s, "jobpool_promotion_paused") == 1 and value(s, "jobpool_workers_live") == 2
    assert value(s, "jobpool_queue_oldest_age_seconds") > 0
    assert value(s, "jobpool_redis_reachable") == 1
    t = {k: v for k, v in s.items() if k[0] == "jobpool_transitions_total"}
    counted = {(dict(labels)["to"], dict(labels)["reason"]): v for (_, labels), v in t.items()}
    assert counted == {("queued", "enqueued"): 6, ("running", "promoted"): 4, ("running", "claimed"): 4,
                       ("succeeded", "exit_0"): 2, ("failed", "exit_code_nonzero"): 1,
                       ("none", "slots_set"): 1, ("none", "queue_paused"): 1, ("cancelled", "cancel"): 1}
    for state, n in (("succeeded", 2), ("failed", 1), ("cancelled", 1)):
        assert value(s, "jobpool_job_duration_seconds_count", state=state) == n
        assert value(s, "jobpool_job_duration_seconds_bucket", state=state, le="+Inf") == n
        # A cancel right after its enqueue can take less than the millisecond the scripts count in.
        low = 0 if state == "cancelled" else 0.001
        assert low <= value(s, "jobpool_job_duration_seconds_sum", state=state) < 300
    les = sorted(float(dict(labels)["le"]) for (name, labels), _ in s.items()
                 if name == "jobpool_job_duration_seconds_bucket" and dict(labels)["state"] == "failed")
    assert les == [*map(float, JOB_DURATION_BUCKETS), float("inf")]
    assert value(s, "jobpool_recoveries_total") == 0
    sweeps = value(s, "jobpool_sweep_duration_seconds_count")
    assert sweeps >= 1 and value(s, "jobpool_sweep_duration_seconds_bucket", le="+Inf") == sweeps
    assert value(s, "jobpool_sweep_duration_seconds_sum") > 0
    assert value(s, "jobpool_sweep_overruns_total") == 0  # a sweep of a few rows fits its interval
    # Another supervisor (the first one gone) serves the very same counters: they live in Redis.
    sup.stop()
    port2 = free_port()
    start_supervisor(spawn, port2)
    s2 = scrape(port2)[1]
    assert {k: v for k, v in s2.items() if k[0] == "jobpool_transitions_total"} == t
    assert value(s2, "jobpool_sweep_duration_seconds_count") >= sweeps
    assert value(s2, "jobpool_jobs", state="queued") == 1 and pool.get(waiting.id).state == JobState.QUEUED


def test_waiting_jobs_are_a_state_of_the_jobs_gauge(pool: Pool, spawn: Callable[..., JobpoolProcess],
                                                    docker_host: str) -> None:
    """Jobs held by time or by the jobs they wait for are `jobpool_jobs{state="waiting"}` (they hold no slot);
    once the job one waits for is cancelled, the supervisor's timer cancels it too (dependency_failed), and
    the gauge and the transitions say so."""
    pool.set_slots(0)
    first = pool.enqueue(IMAGE, ["true"])
    pool.enqueue(IMAGE, ["true"], not_before=pool.now_ms() / 1000 + 3600)
    dependent = pool.enqueue(IMAGE, ["true"], after=[first.id])
    port = free_port()
    start_supervisor(spawn, port)
    s = scrape(port)[1]
    assert value(s, "jobpool_jobs", state="waiting") == 2 and value(s, "jobpool_jobs", state="queued") == 1
    assert value(s, "jobpool_slots_used") == 0
    assert value(s, "jobpool_transitions_total", to="waiting", reason="enqueued") == 2
    pool.cancel(first.id)
    eventually(lambda: pool.get(dependent.id).state is JobState.CANCELLED, timeout=30,
               message="the dependent cancelled by the supervisor's timer")
    s = scrape(port)[1]
    assert value(s, "jobpool_jobs", state="waiting") == 1 and value(s, "jobpool_jobs", state="cancelled") == 2
    assert value(s, "jobpool_transitions_total", to="cancelled", reason="dependency_failed") == 1


def test_probe_results_recoveries_and_unknown_slots(pool_env: dict[str, str],
                                                    spawn: Callable[..., JobpoolProcess]) -> None:
    """Subprocess rows whose workers are gone: one whose process is dead (absent: recovered, budget 1), one
    recorded in another pid namespace (unknown: slot kept and counted as unknown)."""
    env = {**pool_env, **SUB, "JOBPOOL_RECOVERY_BUDGET": "1"}
    pool = Pool.from_env(env=env)
    pool.set_slots(2)
    me = os.getpid()
    dead = pool.enqueue(image="busybox", command=["sleep", "300"])
    claim(pool, dead.id, "gone-a").set_container(identity={
        "pid": me, "start_time": start_time(me) - 5, "pidns": pid_namespace(), "boot_id": kernel_boot_id()})
    elsewhere = pool.enqueue(image="busybox", command=["sleep", "300"])
    claim(pool, elsewhere.id, "gone-b").set_container(identity={
        "pid": me, "start_time": start_time(me), "pidns": pid_namespace() + 1, "boot_id": kernel_boot_id()})
    port = free_port()
    start_supervisor(spawn, port, **SUB, JOBPOOL_RECOVERY_BUDGET="1")
    # The dead one is queued again (recovered) and promoted at once; no worker takes it, so it stays running.
    eventually(lambda: pool.get(dead.id).recovery_attempts == 1, timeout=30, message="the dead job recovered")
    s = eventually(lambda: (r := scrape(port)[1]) and value(r, "jobpool_slots_unknown") == 1 and r,
                   timeout=30, message="a sweep that found the unknown one")
    assert value(s, "jobpool_recoveries_total") == 1
    assert value(s, "jobpool_transitions_total", to="queued", reason="orphan_reconciled_dead_pid") == 1
    assert value(s, "jobpool_probe_results_total", result="absent") == 1
    assert value(s, "jobpool_probe_results_total", result="unknown") >= 1
    assert value(s, "jobpool_probe_results_total", result="present") == 0
    assert value(s, "jobpool_slots_used") == 2 and pool.get(elsewhere.id).state == JobState.RUNNING
    pool.close()


@pytest.mark.parametrize("port", ["abc", "0", "65536", "-1", "80x"])
def test_a_bad_metrics_port_is_one_line_and_nothing_written(redis_url: str, raw: redis.Redis,
                                                            port: str) -> None:
    raw.set("canary", "1")
    before = keyspace(raw)
    result = cli("supervisor", env={"JOBPOOL_REDIS_URL": redis_url, "JOBPOOL_POOL": "it",
                                    "JOBPOOL_METRICS_PORT": port})
    assert one_line_error(result, 2) is None, one_line_error(result, 2)
    assert "JOBPOOL_METRICS_PORT" in result.stderr
    assert keyspace(raw) == before


def test_a_port_already_taken_is_one_line_and_nothing_written(redis_url: str, raw: redis.Redis) -> None:
    raw.set("canary", "1")
    before = keyspace(raw)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("supervisor", env={"JOBPOOL_REDIS_URL": redis_url, "JOBPOOL_POOL": "it",
                                        "JOBPOOL_METRICS_PORT": str(port)})
    assert one_line_error(result, 2) is None, one_line_error(result, 2)
    assert f"JOBPOOL_METRICS_PORT: cannot serve metrics on http://127.0.0.1:{port}/metrics" in result.stderr
    assert keyspace(raw) == before


def test_a_scrape_while_redis_is_away_says_so(private_redis: RedisServer,
                                              spawn: Callable[..., JobpoolProcess]) -> None:
    port = free_port()
    start_supervisor(spawn, port, JOBPOOL_REDIS_URL=private_redis.url)
    private_redis.stop()
    families, s = scrape(port)
    assert value(s, "jobpool_redis_reachable") == 0 and "jobpool_slots_max" not in families


def counter_samples(samples: Samples) -> Samples:
    """The samples of counters and histograms: the ones Prometheus reads as counting up."""
    return {k: v for k, v in samples.items() if k[0].endswith(("_total", "_bucket", "_count", "_sum"))}


def test_no_counter_goes_back_when_redis_loses_its_last_writes(
        redis_server_factory: Callable[[], RedisServer], pool_env: dict[str, str],
        spawn: Callable[..., JobpoolProcess]) -> None:
    """Redis comes back from an RDB saved before the last transitions (a crash without AOF): the supervisor
    serving `/metrics` the whole time serves no counter, bucket, count or sum lower than before, and counts
    what happens after the rollback on top of what it served."""
    server = redis_server_factory()
    server.start()  # no AOF, no automatic saves: only the SAVE below survives a SIGKILL
    env = {**pool_env, "JOBPOOL_REDIS_URL": server.url}
    pool = Pool.from_env(env=env)
    pool.pause(None, reason="test")  # nothing is promoted: every transition is one this test makes
    port = free_port()
    start_supervisor(spawn, port, JOBPOOL_REDIS_URL=server.url)

    def enqueue(n: int, cancel: int) -> None:
        jobs = [pool.enqueue(IMAGE, ["true"]) for _ in range(n)]
        for job in jobs[:cancel]:
            pool.cancel(job.id)

    def enqueued(s: Samples) -> float:
        return value(s, "jobpool_transitions_total", to="queued", reason="enqueued")

    enqueue(3, cancel=1)
    pool.store.client.save()
    enqueue(4, cancel=2)
    before = counter_samples(scrape(port)[1])
    assert enqueued(before) == 7
    assert value(before, "jobpool_job_duration_seconds_count", state="cancelled") == 3
    server.kill()
    server.start()  # same port and dir: back from the RDB saved after the first three
    kept = eventually(lambda: pool.store.client.hget(pool.keys.metrics, "transitions:queued:enqueued"),
                      timeout=10,
                      ignoring=(redis.ConnectionError,), message="Redis answering")
    assert kept == "3", "Redis did not lose the last writes"
    enqueued_series = ("jobpool_transitions_total",
                       frozenset({"pool": "it", "to": "queued", "reason": "enqueued"}.items()))
    after = counter_samples(eventually(
        lambda: (r := scrape(port)[1]) and value(r, "jobpool_redis_reachable") == 1 and enqueued_series in r
        and r, timeout=30, message="a scrape that read Redis again"))
    lower = {k: (v, after.get(k)) for k, v in before.items() if after.get(k, -1) < v}
    assert not lower, f"served lower than before: {lower}"
    assert enqueued(after) == 7
    # What happens after the rollback is counted on top.
    enqueue(2, cancel=1)
    again = counter_samples(scrape(port)[1])
    assert enqueued(again) == 9
    assert value(again, "jobpool_job_duration_seconds_count", state="cancelled") == 4
    assert value(again, "jobpool_job_duration_seconds_bucket", state="cancelled", le="+Inf") == 4
    assert not {k for k, v in after.items() if again.get(k, -1) < v}
    pool.close()
