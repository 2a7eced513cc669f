"""A pool that runs for months: finished jobs are pruned past retention by the supervisor, RQ keeps nothing
of a job that ended, the keyspace stays flat once the caps are reached, and one job's history is found
whatever else the event stream holds. Real redis-server, real worker and supervisor processes."""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from typing import cast

import pytest
import redis

from jobpool import JobState, Pool, errors
from tests.support.constants import IMAGE, SUB
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess

CAPS = {"JOBPOOL_KEEP_SUCCEEDED": "4", "JOBPOOL_KEEP_FAILED": "2", "JOBPOOL_KEEP_CANCELLED": "1",
        "JOBPOOL_SWEEP_INTERVAL_SECS": "0.2"}


def key_kinds(raw: redis.Redis) -> Counter[str]:
    """Keys by kind: a pool's own keys by their first part after the hash tag, RQ's by theirs."""
    kinds: Counter[str] = Counter()
    for key in raw.scan_iter(count=1000):
        text = key.decode()
        if text.startswith("jobpool:{"):
            kinds["jobpool:" + text.split("}:", 1)[1].split(":", 1)[0]] += 1
        else:
            kinds[":".join(text.split(":")[:2])] += 1
    return kinds


def run_jobs(pool: Pool, n: int) -> list[str]:
    """n jobs of every ending: succeed, fail, and (every fifth) cancelled while queued."""
    ids = []
    for i in range(n):
        job = pool.enqueue(IMAGE, ["sh", "-c", "echo out" if i % 3 else "exit 3"])
        if i % 5 == 4:
            with contextlib.suppress(errors.InvalidState):  # it finished first
                pool.cancel(job.id)
        ids.append(job.id)
    def ended() -> bool:  # finished, or finished and pruned already
        pipe = pool.store.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(pool.keys.job(job_id), "state")
        return all(s is None or JobState(s).terminal for s in pipe.execute())
    eventually(ended, timeout=90, message="jobs did not end")
    return ids


def settled(pool: Pool, raw: redis.Redis) -> bool:
    """No job queued or running, and no RQ delivery in flight."""
    counts = pool.stats()["counts"]
    return counts["queued"] + counts["running"] == 0 and not any(
        key_kinds(raw)[kind] for kind in ("rq:wip", "rq:execution", "rq:executions"))


def retained(pool: Pool) -> dict[str, int]:
    return {s: pool.store.client.zcard(pool.keys.state_index(s))
            for s in ("succeeded", "failed", "cancelled")}


def test_the_supervisor_prunes_past_the_caps_and_the_keyspace_stays_flat(
        pool: Pool, raw: redis.Redis, spawn: Callable[..., JobpoolProcess]) -> None:
    pool.set_slots(2)
    spawn(**SUB, **CAPS)
    spawn(**SUB, **CAPS)
    spawn("jobpool.cli", ("supervisor",), **SUB, **CAPS)
    first = run_jobs(pool, 30)
    caps = {"succeeded": 4, "failed": 2, "cancelled": 1}
    # Counted once every job has ended and its delivery is over: the caps can be reached while the last
    # jobs still run, and RQ's records of a delivery in flight (its hash, execution, wip) are no growth.
    before = eventually(lambda: retained(pool) == caps and settled(pool, raw) and key_kinds(raw), timeout=20,
                        message="retention not reached")
    second = run_jobs(pool, 30)
    after = eventually(lambda: retained(pool) == caps and settled(pool, raw)
                       and (k := key_kinds(raw)) == before and k, timeout=20,
                       message=f"the keyspace grew: {before} -> {key_kinds(raw)}")
    # Seven rows are kept, and RQ keeps nothing of a job whose row is gone: RQ's record of a delivered job
    # went when it ended; a job cancelled while queued was never delivered, its record goes with its row.
    kept = set().union(*(raw.zrange(pool.keys.state_index(s), 0, -1)
                         for s in ("succeeded", "failed", "cancelled")))
    assert after["jobpool:job"] == 7 and after["rq:results"] == 0, after
    rq_left = {k.split(b":", 2)[2] for k in raw.scan_iter(match="rq:job:*")}
    assert rq_left <= kept and len(rq_left) <= after["jobpool:job"] - 6, rq_left  # cancelled ones at most
    assert raw.zcard(pool.keys.rq_finished) == 0
    for job_id in first + second:
        if job_id.encode() not in kept:
            with pytest.raises(errors.NotFound, match="pruned"):
                pool.get(job_id)
            assert not any(raw.exists(k) for k in pool.keys.leftovers(job_id))
    pruned = [e for e in pool.tail_events(count=10_000)[0] if e["reason"] == "pruned"]
    assert pruned and all(e["actor"].startswith("supervisor:") for e in pruned)


def test_rq_keeps_no_record_of_a_job_that_ended(pool: Pool, raw: redis.Redis,
                                                spawn: Callable[..., JobpoolProcess]) -> None:
    spawn(**SUB)
    job = pool.enqueue(IMAGE, ["sh", "-c", "echo hi"])
    assert pool.wait(job.id, timeout=30).state == JobState.SUCCEEDED
    eventually(lambda: not raw.exists(pool.keys.rq_job(job.id)), timeout=10,
               message="RQ kept the job's hash")
    assert not raw.exists(pool.keys.rq_results(job.id))
    assert raw.zscore(pool.keys.rq_finished, job.id) is None
    assert [e["to"] for e in pool.events(job.id)][-1] == "succeeded"


def test_one_jobs_history_is_found_behind_100000_other_events(pool: Pool, raw: redis.Redis,
                                                               pool_env: dict[str, str]) -> None:
    """The old reader took the stream's first 1,000 entries and filtered them: this job's came back empty."""
    pipe = raw.pipeline(transaction=False)
    for i in range(100_000):
        pipe.xadd(pool.keys.events, {"job": f"other-{i}", "from": "queued", "to": "running", "reason": "x"})
    pipe.execute()
    pool.set_slots(0)
    job = pool.enqueue(IMAGE, ["true"])
    pool.pause(job.id)
    pool.resume(job.id)
    pool.cancel(job.id)
    raw.config_resetstat()
    events = pool.events(job.id)
    assert [(e["from"], e["to"], e["reason"]) for e in events] == [
        ("", "queued", "enqueued"), ("queued", "paused", "pause"), ("paused", "queued", "resume"),
        ("queued", "cancelled", "cancel")]
    assert all(e["job"] == job.id and e["id"] and e["at"].isdigit() for e in events)
    tail, newest = pool.tail_events(job.id, count=2)
    assert [e["reason"] for e in tail] == ["resume", "cancel"] and newest == tail[-1]["id"]
    # What it cost: one job's row, and not one read through the stream's 100,000 entries.
    stats = raw.info("commandstats")
    assert "cmdstat_xrange" not in stats
    assert stats.get("cmdstat_xrevrange", {}).get("calls", 0) <= 2  # one per read: the newest id, COUNT 1
    # The same through the CLI, as a real process.
    out = subprocess.run([sys.executable, "-m", "jobpool.cli", "--json", "events", "--job", job.id],
                         env={**pool_env, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert [e["reason"] for e in json.loads(out)] == ["enqueued", "pause", "resume", "cancel"]


def test_jobpool_prune_says_what_it_removed(pool: Pool, pool_env: dict[str, str], raw: redis.Redis) -> None:
    pool.set_slots(0)
    ids = [pool.enqueue(IMAGE, ["true"]).id for _ in range(5)]
    for job_id in ids:
        pool.cancel(job_id)
    env = {**pool_env, "PATH": "/usr/bin:/bin", "JOBPOOL_KEEP_CANCELLED": "2"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "jobpool.cli", *args], env=env, capture_output=True,
                              text=True, timeout=60, check=False)

    dry = cli("prune", "--dry-run")
    assert dry.returncode == 0 and "cancelled: would remove 3 (keeping newest 2" in dry.stdout
    listed = {i for i in ids if f"cancelled {i}" in dry.stdout}
    assert len(listed) == 3 and raw.zcard(pool.keys.cancelled) == 5  # the oldest three (ties: by id)
    done = cli("--json", "prune")
    assert done.returncode == 0
    doc = json.loads(done.stdout)
    assert doc["total"] == 3 and set(doc["states"]["cancelled"]["ids"]) == listed
    cancelled = cast("list[bytes]", raw.zrange(pool.keys.cancelled, 0, -1))
    assert {i.decode() for i in cancelled} == set(ids) - listed
    again = cli("prune")
    assert again.returncode == 0 and "cancelled: removed 0" in again.stdout


def test_checkpoint_volumes_of_ended_or_pruned_jobs_go_and_those_in_use_stay(
        pool: Pool, docker_host: str) -> None:
    import docker

    from jobpool.contract import LABEL_JOB, LABEL_POOL
    from jobpool.supervisor.probes import ContainerProber
    from jobpool.supervisor.sweep import Supervisor

    client = docker.DockerClient(base_url=docker_host)
    pool.set_slots(1)
    running = pool.enqueue(IMAGE, ["true"])  # promoted: its row says running
    ended = pool.enqueue(IMAGE, ["true"])
    pool.cancel(ended.id)
    names = {}
    for what, job_id in (("running", running.id), ("ended", ended.id), ("pruned", "gone-" + "a" * 26),
                         ("in_use", "gone-" + "b" * 26)):
        names[what] = client.volumes.create(f"jobpool-ckpt-it-{job_id}",
                                            labels={LABEL_POOL: "it", LABEL_JOB: job_id}).name
    user = client.containers.create(IMAGE, ["true"], volumes={names["in_use"]: {"bind": "/ck", "mode": "rw"}},
                                    network_mode="none")
    sup = Supervisor(pool.store, ContainerProber(docker_host, timeout=5))
    try:
        sup.sweep()
        left = {v.name for v in client.volumes.list(filters={"label": f"{LABEL_POOL}=it"})}
        assert left == {names["running"], names["in_use"]}, left
        user.remove()
        sup._volumes_at = -math.inf  # as if the period had passed
        sup.sweep()
        left = {v.name for v in client.volumes.list(filters={"label": f"{LABEL_POOL}=it"})}
        assert left == {names["running"]}, left
    finally:
        sup.close()
        for name in names.values():
            with contextlib.suppress(docker.errors.NotFound):
                client.volumes.get(name).remove(force=True)
        client.close()


def test_containers_of_ended_attempts_go_and_the_volumes_they_held_with_them(
        pool: Pool, docker_host: str) -> None:
    """A container whose removal never happened (its worker died after recording the exit, its daemon was
    away) is removed by the supervisor once its attempt is over, and only then: one whose row still runs
    that attempt holds an exit nobody has recorded yet, and a running one is never touched."""
    import docker

    from jobpool.contract import LABEL_ATTEMPT, LABEL_JOB, LABEL_POOL
    from jobpool.supervisor.probes import ContainerProber
    from jobpool.supervisor.sweep import Supervisor

    client = docker.DockerClient(base_url=docker_host)
    pool.set_slots(1)
    running = pool.enqueue(IMAGE, ["true"])  # promoted: its row runs attempt 1
    ended = pool.enqueue(IMAGE, ["true"])
    pool.cancel(ended.id)
    attempt = str(pool.get(running.id).attempt)
    cases = {  # what: (job id, attempt label, command)
        "unrecorded": (running.id, attempt, ["true"]),
        "earlier_attempt": (running.id, str(int(attempt) - 1), ["true"]),
        "ended_job": (ended.id, str(pool.get(ended.id).attempt), ["true"]),
        "no_row": ("gone-" + "c" * 26, "1", ["true"]),
        "no_row_running": ("gone-" + "d" * 26, "1", ["sleep", "60"]),
    }
    made: dict[str, docker.models.containers.Container] = {}
    volume = client.volumes.create(f"jobpool-ckpt-it-{ended.id}",
                                   labels={LABEL_POOL: "it", LABEL_JOB: ended.id})
    for what, (job_id, att, cmd) in cases.items():
        mounts = {volume.name: {"bind": "/ck", "mode": "rw"}} if what == "ended_job" else {}
        c = client.containers.create(IMAGE, cmd, network_mode="none", volumes=mounts,
                                     labels={LABEL_POOL: "it", LABEL_JOB: job_id, LABEL_ATTEMPT: att})
        c.start()
        if cmd == ["true"]:
            c.wait(timeout=30)
        made[what] = c
    sup = Supervisor(pool.store, ContainerProber(docker_host, timeout=5))
    try:
        sup.sweep()
        left = {c.id for c in client.containers.list(all=True, filters={"label": f"{LABEL_POOL}=it"})}
        assert left == {made["unrecorded"].id, made["no_row_running"].id}, {
            w: c.id in left for w, c in made.items()}
        assert not client.volumes.list(filters={"label": f"{LABEL_POOL}=it"}), "the freed volume went too"
    finally:
        sup.close()
        for c in made.values():
            with contextlib.suppress(docker.errors.NotFound):
                c.remove(force=True)
        with contextlib.suppress(docker.errors.NotFound):
            volume.remove(force=True)
        client.close()
