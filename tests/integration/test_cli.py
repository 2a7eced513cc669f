"""The admin CLI through click's runner, against a real redis-server.

Every command is run in both output modes (`--json` parsed with `json.loads`); every kind of bad input is
checked for its exit code, its one-line message, and that Redis is unchanged afterwards (every key's value
and TTL, tests/support/snapshot.py).
`events --follow` runs as a real process so Ctrl-C is a real SIGINT.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import redis
from click.testing import CliRunner, Result

from jobpool import Job, JobState, Pool
from jobpool.cli import main
from jobpool.store.calls import Store
from tests.support.polling import eventually
from tests.support.servers import free_port
from tests.support.snapshot import keyspace

POOL = "clitest"
REPO = Path(__file__).resolve().parents[2]
SECRET = "hunter2-do-not-print"
#: A dashboard token strong enough for Settings (config.MIN_TOKEN_BITS): random hex, not a repeated letter.
STRONG_TOKEN = "9f2c41d7e08b5a63c1f7d29e4ab08c35"

Run = Callable[..., Result]


# ---- fixtures ------------------------------------------------------------------------------------------

def _clean_env(redis_url: str, extra: dict[str, str] | None = None) -> dict[str, str | None]:
    """JOBPOOL_* from the outer environment removed, so only what a test sets counts."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("JOBPOOL_")}
    env.update({"JOBPOOL_REDIS_URL": redis_url, "JOBPOOL_POOL": POOL})
    env.update(extra or {})
    return env


@pytest.fixture
def run(redis_url: str) -> Run:
    """`run(*args, env={...})`: the CLI in-process; unexpected exceptions propagate to the test."""
    runner = CliRunner()

    def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
        return runner.invoke(main, list(args), env=_clean_env(redis_url, env), catch_exceptions=False,
                             prog_name="jobpool")

    return invoke


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    with contextlib.closing(redis.Redis.from_url(redis_url, decode_responses=True)) as c:
        yield c


@pytest.fixture
def pool(redis_url: str) -> Iterator[Pool]:
    p = Pool.from_url(redis_url, name=POOL)
    yield p
    p.store.client.close()


def server_ms(client: redis.Redis) -> int:
    secs, usecs = client.time()
    return int(secs) * 1000 + int(usecs) // 1000


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def enqueue_id(run: Run, *args: str) -> str:
    result = run("enqueue", *args)
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert len(job_id) == 32 and all(c in "0123456789abcdef" for c in job_id), result.stdout
    return job_id


# ---- enqueue -------------------------------------------------------------------------------------------

def test_enqueue_prints_the_id_and_stores_the_spec(run: Run, pool: Pool) -> None:
    job_id = enqueue_id(run, "--env", f"TOKEN={SECRET}", "--workdir", "/w", "--user", "1000:1000",
                        "--memory", "512m", "--cpus", "1.5", "--label", "team=infra",
                        "busybox", "--", "sh", "-c", "echo hi")
    job = pool.get(job_id)
    assert job.spec.command == ("sh", "-c", "echo hi")
    assert dict(job.spec.env) == {"TOKEN": SECRET}
    assert (job.spec.workdir, job.spec.user) == ("/w", "1000:1000")
    assert (job.spec.memory, job.spec.cpus) == ("512m", 1.5)
    assert dict(job.spec.labels) == {"team": "infra"}


def test_enqueue_without_double_dash_keeps_the_commands_own_options(run: Run, pool: Pool) -> None:
    job_id = enqueue_id(run, "busybox", "sh", "-c", "echo --json")
    assert pool.get(job_id).spec.command == ("sh", "-c", "echo --json")


def test_enqueue_json_is_the_job_with_env_redacted(run: Run) -> None:
    doc = ok_json(run("--json", "enqueue", "--env", f"TOKEN={SECRET}", "busybox", "--", "true"))
    assert doc["spec"]["env"] == {"TOKEN": "<redacted>"}
    assert doc["state"] in ("queued", "running") and doc["coalesced"] is False
    assert SECRET not in json.dumps(doc)


def test_enqueue_coalesces_with_a_queued_twin_and_says_so(run: Run) -> None:
    assert run("slots", "0").exit_code == 0  # keep jobs queued: only queued jobs coalesce
    first = enqueue_id(run, "--coalesce", "busybox", "--", "sleep", "1")
    again = run("enqueue", "--coalesce", "busybox", "--", "sleep", "1")
    assert again.exit_code == 0 and again.stdout.strip() == first
    assert "coalesced" in again.stderr
    # options go before IMAGE: everything after it is the command
    doc = ok_json(run("enqueue", "--json", "--coalesce", "busybox", "--", "sleep", "1"))
    assert (doc["id"], doc["coalesced"]) == (first, True)
    other = enqueue_id(run, "busybox", "--", "sleep", "1")  # no --coalesce: a new job
    assert other != first


def test_enqueue_coalesce_key_joins_different_specs(run: Run) -> None:
    run("slots", "0")
    first = enqueue_id(run, "--coalesce-key", "nightly", "busybox", "--", "sleep", "1")
    assert enqueue_id(run, "--coalesce-key", "nightly", "busybox", "--", "sleep", "2") == first


# ---- reading -------------------------------------------------------------------------------------------

def test_ls_table_filters_and_json(run: Run) -> None:
    assert run("ls").stdout.strip() == "no jobs"
    run("slots", "1")
    running = enqueue_id(run, "busybox", "--", "sleep", "10")
    queued = enqueue_id(run, "--env", f"TOKEN={SECRET}", "busybox", "--", "sleep", "20")
    table = run("ls")
    assert table.exit_code == 0
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["ID", "STATE", "PRIO", "ATT", "IMAGE", "COMMAND", "CREATED", "NOTE"]
    assert [r.split()[:2] for r in rows] == [[running, "running"], [queued, "queued"]]
    assert "ago" in rows[0] or "just now" in rows[0]
    assert SECRET not in table.output

    assert [j["id"] for j in ok_json(run("ls", "--json"))] == [running, queued]
    assert [j["id"] for j in ok_json(run("--json", "ls", "--state", "queued"))] == [queued]
    assert [j["id"] for j in ok_json(run("ls", "--limit", "1", "--json"))] == [queued]
    assert ok_json(run("ls", "--state", "failed", "--json")) == []


def test_show_human_and_json_never_print_env_values(run: Run) -> None:
    job_id = enqueue_id(run, "--env", f"TOKEN={SECRET}", "--label", "k=v", "busybox", "--", "sh", "-c", "x y")
    human = run("show", job_id)
    assert human.exit_code == 0
    assert f"id            {job_id}" in human.stdout
    assert "TOKEN  (values hidden)" in human.stdout and "sh -c 'x y'" in human.stdout
    doc = ok_json(run("show", job_id, "--json"))
    assert doc["id"] == job_id
    assert (doc["spec"]["env"], doc["spec"]["labels"]) == ({"TOKEN": "<redacted>"}, {"k": "v"})
    assert SECRET not in human.output + json.dumps(doc)


def test_logs_prints_the_kept_tail(run: Run, pool: Pool, client: redis.Redis) -> None:
    job_id = enqueue_id(run, "busybox", "--", "true")
    empty = run("logs", job_id)
    assert (empty.exit_code, empty.stdout) == (0, "")
    assert "no output recorded" in empty.stderr
    client.hset(pool.keys.job(job_id), "log_tail", "line one\nline two\n")  # what a finishing worker keeps
    assert run("logs", job_id).stdout == "line one\nline two\n"
    assert ok_json(run("logs", job_id, "--json")) == {"id": job_id, "log": "line one\nline two\n"}


def test_events_lists_transitions_filtered_and_counted(run: Run) -> None:
    run("slots", "0")
    a = enqueue_id(run, "busybox", "--", "true")
    b = enqueue_id(run, "busybox", "--", "false")
    assert run("cancel", a).exit_code == 0
    every = ok_json(run("events", "--json"))
    moves = [(e["job"], e["to"]) for e in every if e["job"]]
    assert moves == [(a, "queued"), (b, "queued"), (a, "cancelled")]
    assert all(isinstance(e["at"], int) and e["id"] for e in every)
    assert [e["to"] for e in ok_json(run("events", "--job", a, "--json"))] == ["queued", "cancelled"]
    assert [e["job"] for e in ok_json(run("events", "--count", "1", "--json"))] == [a]
    assert [e["to"] for e in ok_json(run("events", "--job", b, "--count", "5", "--json"))] == ["queued"]
    human = run("events", "--job", a)
    assert human.exit_code == 0
    assert [line.split("  ")[1:3] for line in human.stdout.splitlines()] == [
        [a, "- -> queued"], [a, "queued -> cancelled"]]


def test_events_empty_stream(run: Run) -> None:
    assert ok_json(run("events", "--json")) == []
    result = run("events")
    assert (result.exit_code, result.stdout) == (0, "")


def _follow(redis_url: str, *args: str) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("JOBPOOL_")},
           "JOBPOOL_REDIS_URL": redis_url, "JOBPOOL_POOL": POOL, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "jobpool.cli", "events", "--follow", *args], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def _next_line(lines: queue.Queue[str]) -> str:
    return eventually(lambda: lines.get_nowait() if not lines.empty() else None, timeout=15,
                      message="no line from events --follow")


def test_events_follow_prints_json_lines_and_stops_cleanly_on_ctrl_c(redis_url: str, run: Run) -> None:
    run("slots", "0")
    first = enqueue_id(run, "busybox", "--", "true")
    proc, lines = _follow(redis_url, "--json", "--count", "1")
    try:
        assert json.loads(_next_line(lines))["job"] == first  # the backlog
        second = enqueue_id(run, "busybox", "--", "false")
        event = json.loads(_next_line(lines))  # a new event, as it happens
        assert (event["job"], event["to"]) == (second, "queued")
        run("pause", second)
        assert json.loads(_next_line(lines))["to"] == "paused"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Aborted" not in err


def test_events_follow_human_lines_for_one_job(redis_url: str, run: Run) -> None:
    run("slots", "0")
    mine = enqueue_id(run, "busybox", "--", "true")
    proc, lines = _follow(redis_url, "--job", mine)
    try:
        assert f"{mine}  - -> queued" in _next_line(lines)
        enqueue_id(run, "busybox", "--", "other")  # another job's event is not shown
        run("cancel", mine)
        assert f"{mine}  queued -> cancelled" in _next_line(lines)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0 and "Traceback" not in err


# ---- control -------------------------------------------------------------------------------------------

def test_cancel_a_queued_job(run: Run, pool: Pool) -> None:
    run("slots", "0")
    job_id = enqueue_id(run, "busybox", "--", "true")
    result = run("cancel", job_id, "--reason", "not needed")
    assert (result.exit_code, result.stdout.strip()) == (0, f"cancelled {job_id}")
    assert pool.get(job_id).state == "cancelled"
    again = run("cancel", job_id, "--json")
    assert again.exit_code == 1 and again.stdout == ""
    assert again.stderr.strip() == "Error: cancel: not allowed while the job is cancelled"


def _claimed(client: redis.Redis, pool: Pool, job_id: str, boot_id: str, lease: bool = False) -> None:
    """What a worker's claim leaves on a running row (and, while it lives, its lease)."""
    client.hset(pool.keys.job(job_id), mapping={"owner_boot": boot_id, "claimed_at": server_ms(client)})
    if lease:
        client.set(pool.keys.lease(job_id), f"{boot_id}:{pool.get(job_id).attempt}", px=30_000)


def test_cancel_of_a_running_job_with_a_live_worker_is_a_request(run: Run, pool: Pool,
                                                                 client: redis.Redis) -> None:
    job_id = enqueue_id(run, "busybox", "--", "sleep", "100")
    assert pool.get(job_id).state == "running"
    _live_worker(client, pool, "w1")
    _claimed(client, pool, job_id, "w1", lease=True)
    doc = ok_json(run("--json", "cancel", job_id))
    assert (doc["state"], doc["cancel_requested"]) == ("running", True)
    assert "orphan_stop" not in doc  # its worker stops it
    human = run("cancel", job_id)  # asking again is harmless
    assert human.stdout.strip() == (f"cancel requested for {job_id} (it is running; its worker acts on the "
                                    "request)")


def test_cancel_of_an_orphaned_job_stops_it_by_label(run: Run, pool: Pool, client: redis.Redis,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def stop_orphan(store: Store, job: Job) -> Any:
        seen.append(job.id)
        store.evict(job.id, job.attempt, "cancelled", "", "test")  # stands in for: stopped, reconciled
        return types.SimpleNamespace(action="stopped", containers=("c1",), detail="")

    _fake_module(monkeypatch, "jobpool.supervisor", stop_orphan=stop_orphan)
    job_id = enqueue_id(run, "busybox", "--", "sleep", "100")
    _claimed(client, pool, job_id, "gone-boot")
    human = run("cancel", job_id)
    assert human.exit_code == 0 and seen == [job_id]
    assert human.stdout.splitlines()[-1] == (
        "its worker boot gone-boot is gone: stopped 1 container(s) by label; the job is now failed")
    run("slots", "2")
    second = enqueue_id(run, "busybox", "--", "sleep", "100")
    _claimed(client, pool, second, "gone-too")
    doc = ok_json(run("cancel", second, "--json"))
    assert doc["orphan_stop"] == {"action": "stopped", "containers": ["c1"], "detail": ""}


def test_cancel_of_an_orphaned_job_without_the_supervisor_warns(run: Run, pool: Pool, client: redis.Redis,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jobpool.supervisor", None)
    job_id = enqueue_id(run, "busybox", "--", "sleep", "100")
    _claimed(client, pool, job_id, "gone-boot")
    result = run("cancel", job_id)
    assert result.exit_code == 0  # the request is persisted; recovery honours it
    assert "warning: its worker boot gone-boot is gone and the supervisor is not in this build" \
        in result.stderr
    assert pool.get(job_id).cancel_requested


def test_cancel_asks_the_real_supervisor_which_sees_the_owners_lease(run: Run, pool: Pool,
                                                                     client: redis.Redis) -> None:
    job_id = enqueue_id(run, "busybox", "--", "sleep", "100")
    _claimed(client, pool, job_id, "no-boot-record", lease=True)  # boot record gone, lease still held
    result = run("cancel", job_id, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["orphan_stop"]["action"] == "owner_alive"


def test_pause_and_resume_a_job(run: Run, pool: Pool) -> None:
    run("slots", "0")
    job_id = enqueue_id(run, "busybox", "--", "true")
    paused = run("pause", job_id, "--reason", "look first")
    assert (paused.exit_code, paused.stdout.strip()) == (0, f"paused {job_id}")
    assert pool.get(job_id).state == "paused"
    assert ok_json(run("resume", job_id, "--json"))["state"] == "queued"
    refused = run("resume", job_id)
    assert refused.exit_code == 1 and refused.stderr.startswith("Error: resume_job: not allowed")
    assert ok_json(run("pause", job_id, "--json"))["state"] == "paused"


def test_show_says_the_affinity_and_resume_anywhere_releases_it(run: Run, pool: Pool) -> None:
    from jobpool.contract import EXIT_TEMPFAIL
    from tests.support.attempts import claim

    run("slots", "1")
    job_id = enqueue_id(run, "busybox", "--", "true")
    att = claim(pool, job_id)
    att.set_container("c-1", "daemon-x")
    run("pause", job_id)
    assert att.finish("interrupted", EXIT_TEMPFAIL) == "paused"
    shown = run("show", job_id)
    assert shown.exit_code == 0 and "affinity" in shown.stdout and "daemon-x" in shown.stdout
    assert ok_json(run("show", job_id, "--json"))["affinity"] == "daemon-x"
    no_job = run("resume", "--anywhere")
    assert no_job.exit_code == 2 and "--anywhere needs a JOB" in no_job.stderr
    released = run("resume", job_id, "--anywhere")
    assert released.exit_code == 0 and "runs on any daemon" in released.stdout
    assert pool.get(job_id).affinity == ""
    assert ok_json(run("show", job_id, "--json"))["affinity"] == ""


def test_pause_and_resume_the_queue(run: Run, pool: Pool, client: redis.Redis) -> None:
    doc = ok_json(run("pause", "--reason", "maintenance", "--json"))
    assert (doc["pool"], doc["queue_paused"], doc["paused_reason"]) == (POOL, True, "maintenance")
    assert isinstance(doc["paused_since"], int)
    assert client.exists(pool.keys.paused)
    job_id = enqueue_id(run, "busybox", "--", "true")
    assert pool.get(job_id).state == "queued"  # promotion held
    assert "promotion paused for pool clitest" in run("pause").stdout  # idempotent
    human = run("resume")
    assert (human.exit_code, human.stdout.strip()) == (0, "promotion running for pool clitest")
    assert pool.get(job_id).state == "running"
    assert ok_json(run("resume", "--json"))["queue_paused"] is False


def test_slots_show_and_set(run: Run, pool: Pool) -> None:
    assert run("slots").stdout.strip() == "0/1"
    enqueue_id(run, "busybox", "--", "true")
    assert ok_json(run("slots", "--json")) == {"used": 1, "max": 1}
    result = run("slots", "3")
    assert (result.exit_code, result.stdout.strip()) == (0, "1/3  (was 1)")
    assert ok_json(run("slots", "0", "--json")) == {"used": 1, "max": 0, "previous": 3}
    assert pool.slots() == (1, 0)


# ---- status --------------------------------------------------------------------------------------------

def _live_supervisor(client: redis.Redis, pool: Pool, age_ms: int = 0, unknown: int = 0) -> None:
    """What the supervisor writes after each sweep (the contract `status` reads)."""
    sweep = {"at": server_ms(client) - age_ms, "rows": 0, "unknown": unknown}
    client.set(pool.keys.last_sweep, json.dumps(sweep))


def _live_worker(client: redis.Redis, pool: Pool, boot_id: str, draining: bool = False) -> None:
    """What a worker boot writes each heartbeat: its hash (with a TTL) and its score in the boots index."""
    now = server_ms(client)
    client.hset(pool.keys.boot(boot_id), mapping={"host": "h1", "pid": 42, "draining": int(draining),
                                                 "heartbeat_at": now})
    client.pexpire(pool.keys.boot(boot_id), 30_000)
    client.zadd(pool.keys.boots, {boot_id: now})


def test_status_healthy(run: Run, pool: Pool, client: redis.Redis) -> None:
    _live_supervisor(client, pool)
    _live_worker(client, pool, "w1")
    human = run("status")
    assert human.exit_code == 0, human.output
    assert "slots       0/1 used" in human.stdout and "workers     1 live" in human.stdout
    assert "health      OK" in human.stdout and "just now" in human.stdout
    doc = ok_json(run("status", "--json"))
    assert doc["healthy"] is True and doc["reasons"] == []
    assert doc["redis"]["reachable"] is True and doc["pool"] == POOL
    assert doc["slots"] == {"used": 0, "max": 1}
    assert doc["workers"]["live"] == 1 and doc["workers"]["boots"][0]["id"] == "w1"
    assert doc["last_sweep"]["rows"] == 0 and doc["unknown"] == 0


def test_status_without_a_supervisor_is_unhealthy(run: Run, pool: Pool, client: redis.Redis) -> None:
    _live_worker(client, pool, "w1")
    result = run("status")
    assert result.exit_code == 1
    assert "UNHEALTHY" in result.stdout
    assert "no live supervisor: no sweep has been recorded" in result.stdout


def test_status_with_a_stale_sweep_is_unhealthy(run: Run, pool: Pool, client: redis.Redis) -> None:
    _live_worker(client, pool, "w1")
    _live_supervisor(client, pool, age_ms=10_000)
    fast = {"JOBPOOL_SWEEP_INTERVAL_SECS": "1"}  # 10 s > 3 x 1 s
    doc = json.loads(run("status", "--json", env=fast).stdout)
    assert doc["healthy"] is False
    assert doc["reasons"] == ["no live supervisor: the last sweep was 10 s ago, more than 3 x "
                              "JOBPOOL_SWEEP_INTERVAL_SECS (1 s)"]
    assert run("status", env={"JOBPOOL_SWEEP_INTERVAL_SECS": "5"}).exit_code == 0  # 10 s < 15 s


def test_status_counts_only_live_ready_workers(run: Run, pool: Pool, client: redis.Redis) -> None:
    _live_supervisor(client, pool, unknown=2)
    run("slots", "2")
    _live_worker(client, pool, "w1")
    client.zadd(pool.keys.boots, {"gone": server_ms(client)})  # its hash expired: not live
    result = run("status", "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["workers"]["live"] == 1 and doc["workers"]["stale"] == 1
    assert doc["reasons"] == ["fewer live workers than slots: 1 ready for 2 slots"]
    assert doc["unknown"] == 2 and "could not be probed" in doc["warnings"][0]
    _live_worker(client, pool, "w2", draining=True)
    doc = json.loads(run("status", "--json").stdout)
    assert (doc["workers"]["live"], doc["workers"]["draining"], doc["healthy"]) == (2, 1, False)
    _live_worker(client, pool, "w3")
    human = run("status")
    assert human.exit_code == 0, human.output
    assert "3 live (1 draining), 1 gone" in human.stdout and "unknowns    2" in human.stdout


def test_status_names_the_jobs_held_on_unknown_evidence(run: Run, pool: Pool, client: redis.Redis) -> None:
    held = [{"job": "j" * 32, "attempt": 2, "reason": "probe_unknown",
             "evidence": "daemon could not be asked"}]
    sweep = {"at": server_ms(client), "rows": 1, "unknown": 1, "unknown_jobs": held}
    client.set(pool.keys.last_sweep, json.dumps(sweep))
    assert json.loads(run("status", "--json").stdout)["last_sweep"]["unknown_jobs"] == held
    assert f"{'j' * 32}  probe_unknown: daemon could not be asked" in run("status").stdout


def test_status_reports_a_paused_queue(run: Run, pool: Pool, client: redis.Redis) -> None:
    _live_supervisor(client, pool)
    _live_worker(client, pool, "w1")
    run("pause", "--reason", "upgrade")
    result = run("status")
    assert result.exit_code == 0
    assert "PAUSED by cli" in result.stdout and "upgrade" in result.stdout
    assert "promotion is paused" in result.stdout


def test_status_with_redis_unreachable(run: Run) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = run("status", "--json", env={"JOBPOOL_REDIS_URL": url})
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["healthy"] is False and doc["redis"] == {"url": url, "reachable": False}
    assert doc["reasons"][0].startswith("redis unreachable")
    human = run("status", env={"JOBPOOL_REDIS_URL": url})
    assert human.exit_code == 1 and "UNREACHABLE" in human.stdout and "Traceback" not in human.output


def test_status_hides_the_redis_password(run: Run) -> None:
    url = f"redis://user:s3cret@127.0.0.1:{free_port()}/0"
    result = run("status", "--json", "--redis-url", url)
    assert "s3cret" not in result.output
    # The userinfo is hidden whole, the user name with the password.
    assert json.loads(result.stdout)["redis"]["url"].startswith("redis://***@127.0.0.1:")


# ---- global options ------------------------------------------------------------------------------------

def test_pool_flag_selects_the_pool_and_wins_over_the_environment(run: Run, redis_url: str) -> None:
    other = enqueue_id(run, "--pool", "other", "busybox", "--", "true")
    assert ok_json(run("ls", "--json")) == []
    assert [j["id"] for j in ok_json(run("--pool", "other", "ls", "--json"))] == [other]
    assert [j["id"] for j in ok_json(run("ls", "--pool", "other", "--json"))] == [other]
    assert ok_json(run("ls", "--json", env={"JOBPOOL_POOL": "other"}))[0]["id"] == other


def test_help_documents_shell_completion_and_completion_works(run: Run) -> None:
    assert "_JOBPOOL_COMPLETE=bash_source jobpool" in run("--help").stdout
    script = run(env={"_JOBPOOL_COMPLETE": "bash_source"})
    assert script.exit_code == 0 and "_jobpool_completion()" in script.stdout
    words = run(env={"_JOBPOOL_COMPLETE": "bash_complete", "COMP_WORDS": "jobpool sta", "COMP_CWORD": "1"})
    assert words.stdout.split() == ["plain,status"]


def test_version(run: Run) -> None:
    result = run("--version")
    assert result.exit_code == 0 and result.stdout.startswith("jobpool ")


# ---- bad input: exit code, one line, nothing written ---------------------------------------------------

BAD_INPUT = [
    # (args, extra env, exit code, message on stderr)
    (["enqueue", "--env", "NOEQUALS", "busybox", "true"], {}, 2, "'NOEQUALS' is not NAME=VALUE"),
    (["enqueue", "--env", "1X=y", "busybox", "true"], {}, 2, "'1X' in '1X'=… is not a variable name"),
    (["enqueue", "--label", "=v", "busybox", "true"], {}, 2, "Invalid value for '--label'"),
    (["enqueue", "--label", "jobpool.pool=x", "busybox", "true"], {}, 2, "prefix is reserved"),
    (["enqueue", "--memory", "lots", "busybox", "true"], {}, 2, "memory must look like '512m' or '2g'"),
    (["enqueue", "--workdir", "rel", "busybox", "true"], {}, 2, "workdir must be an absolute path"),
    (["enqueue", "--cpus", "0", "busybox", "true"], {}, 2, "cpus must be a number above 0"),
    (["enqueue", "--cpus", "many", "busybox", "true"], {}, 2, "'many' is not a valid float"),
    (["enqueue", "--coalesce-key", "", "busybox", "true"], {}, 2, "must not be empty"),
    (["enqueue", "busybox"], {}, 2, "Missing argument 'COMMAND...'"),
    (["enqueue", "busybox", "--"], {}, 2, "missing the command to run after IMAGE"),
    (["enqueue", "", "true"], {}, 2, "image must be a non-empty string"),
    (["enqueue", "--uses", "nolimit", "busybox", "true"], {}, 2, "no limit covers nolimit"),
    (["enqueue", "--uses", "a b", "busybox", "true"], {}, 2, "limit 'a b' is not a name"),
    (["enqueue", "--uses", "gpu=0", "busybox", "true"], {}, 2, "the amount must be a whole number"),
    (["enqueue", "--uses", "gpu", "--uses", "gpu=2", "busybox", "true"], {}, 2, "'gpu' is named twice"),
    (["enqueue", "--priority", "1001", "busybox", "true"], {}, 2, "1001 is not in the range -1000<=x<=1000"),
    (["enqueue", "--slots", "0", "busybox", "true"], {}, 2, "0 is not in the range 1<=x<=100000"),
    (["enqueue", "--group", "", "busybox", "true"], {}, 2, "group '' is not a name"),
    (["enqueue", "--timeout", "10x", "busybox", "true"], {}, 2, "'10x' is not a duration such as 90s, 10m"),
    (["enqueue", "--timeout", "0", "busybox", "true"], {}, 2, "'0' is out of range: from 1s to 366d"),
    (["enqueue", "--timeout", "1.5h", "busybox", "true"], {}, 2, "'1.5h' is not a duration"),
    (["enqueue", "--retries", "1", "--retry-delay", "10M", "busybox", "true"], {}, 2,
     "'10M' is not a duration"),
    (["enqueue", "--in", "-5m", "busybox", "true"], {}, 2, "'-5m': a duration is never negative"),
    (["enqueue", "--in", "400d", "busybox", "true"], {}, 2, "'400d' is out of range"),
    (["enqueue", "--at", "2026-12-03T02:00", "busybox", "true"], {}, 2,
     "'2026-12-03T02:00' names no time zone: add one (Z for UTC"),
    (["enqueue", "--at", "soon", "busybox", "true"], {}, 2, "'soon' is not an ISO-8601 time"),
    (["enqueue", "--at", "1969-07-20T20:17:00Z", "busybox", "true"], {}, 2, "not_before must be from 1970"),
    (["enqueue", "--at", "2026-12-03T02:00Z", "--in", "5m", "busybox", "true"], {}, 2,
     "--at and --in both say when to start"),
    (["enqueue", "--after", "0" * 32, "busybox", "true"], {}, 2,
     f"it waits for job {'0' * 32}, which does not exist"),
    (["enqueue", "--after", "a b", "busybox", "true"], {}, 2, "after: 'a b' is not a job id"),
    (["enqueue", "--after", "0" * 32, "--coalesce", "busybox", "true"], {}, 2,
     "a job that waits (--at, --in, --after) does not coalesce"),
    (["enqueue", "--in", "5m", "--coalesce-key", "k", "busybox", "true"], {}, 2, "does not coalesce"),
    (["enqueue", "--retries", "-1", "busybox", "true"], {}, 2, "-1 is not in the range 0<=x<=1000"),
    (["enqueue", "--retries", "1001", "busybox", "true"], {}, 2, "1001 is not in the range 0<=x<=1000"),
    (["enqueue", "--retries", "1", "--retry-on", "0", "busybox", "true"], {}, 2,
     "'0' is not an exit code from 1 to 255"),
    (["enqueue", "--retries", "1", "--retry-on", "3,300", "busybox", "true"], {}, 2,
     "'300' is not an exit code"),
    (["enqueue", "--retries", "1", "--retry-on", "3,", "busybox", "true"], {}, 2, "'' is not an exit code"),
    (["enqueue", "--retry-on", "3", "busybox", "true"], {}, 2, "they need --retries N"),
    (["enqueue", "--retries", "0", "--retry-delay", "5s", "busybox", "true"], {}, 2, "they need --retries N"),
    (["enqueue", "--from-file", "-", "--in", "5m"], {}, 2, "--from-file takes every job from the file"),
    (["retry", "nope"], {}, 1, "Error: no job nope in this pool (never enqueued"),
    (["retry", "a b"], {}, 1, "Error: no job 'a b' in this pool"),
    (["limit", "a b", "1"], {}, 2, "a limit is a name"),
    (["limit", "gpu", "-1"], {}, 2, "-1 is not in the range 0<=x<=1000000"),
    (["limit", "--remove"], {}, 2, "NAME is needed"),
    (["limit", "gpu", "1", "--remove"], {}, 2, "--remove takes no N"),
    (["limit", "nope", "--remove"], {}, 1, "Error: no limit nope"),
    (["limit", "nope"], {}, 1, "Error: no limit nope"),
    (["slots", "-1"], {}, 2, "-1 is not in the range 0<=x<=100000"),
    (["slots", "100001"], {}, 2, "100001 is not in the range"),
    (["slots", "many"], {}, 2, "'many' is not a valid integer"),
    (["ls", "--state", "lost"], {}, 2, "'lost' is not one of"),
    (["ls", "--limit", "0"], {}, 2, "0 is not in the range 1<=x<=10000"),
    (["events", "--count", "-1"], {}, 2, "-1 is not in the range"),
    (["frobnicate"], {}, 2, "No such command 'frobnicate'"),
    (["ls"], {"JOBPOOL_SWEEP_INTERVAL_SECS": "abc"}, 2, "JOBPOOL_SWEEP_INTERVAL_SECS: 'abc' is not a number"),
    (["enqueue", "busybox", "true"], {"JOBPOOL_MAX_CONCURRENT_JOBS": "-1"}, 2, "JOBPOOL_MAX_CONCURRENT_JOBS"),
    (["slots"], {"JOBPOOL_POOL": "no spaces"}, 2, "JOBPOOL_POOL: 'no spaces' is not a pool name"),
    (["--pool", "a{b}", "ls"], {}, 2, "JOBPOOL_POOL: 'a{b}' is not a pool name"),
    (["status"], {"JOBPOOL_REDIS_URL": "http://127.0.0.1/"}, 2, "JOBPOOL_REDIS_URL"),
    (["show", "nope"], {}, 1, "Error: no job nope in this pool (never enqueued"),
    (["show", "a b"], {}, 1, "Error: no job 'a b' in this pool"),
    (["logs", "nope"], {}, 1, "Error: no job nope in this pool (never enqueued"),
    (["cancel", "nope"], {}, 1, "Error: no job nope in this pool (never enqueued"),
    (["pause", "nope"], {}, 1, "Error: no job nope in this pool (never enqueued"),
    (["resume", "nope"], {}, 1, "Error: no job nope in this pool (never enqueued"),
    (["events", "--job", "nope"], {}, 1, "Error: no job nope in this pool (never enqueued"),
]


@pytest.fixture
def seeded(run: Run, pool: Pool) -> Job:
    """A pool with some state in it, so 'nothing written' is checked against more than an empty db."""
    run("slots", "0")
    return pool.get(enqueue_id(run, "--env", f"TOKEN={SECRET}", "busybox", "--", "sleep", "1"))


@pytest.mark.parametrize(("args", "env", "code", "message"), BAD_INPUT,
                         ids=[" ".join(c[0]) for c in BAD_INPUT])
def test_bad_input_is_refused_with_one_line_and_nothing_written(
        run: Run, raw: redis.Redis, seeded: Job, args: list[str], env: dict[str, str], code: int,
        message: str) -> None:
    before = keyspace(raw)
    result = run(*args, env=env)
    assert result.exit_code == code, result.output
    assert message in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("Error: ")
    assert "Traceback" not in result.output and SECRET not in result.output
    assert result.stdout == ""
    assert keyspace(raw) == before


@pytest.mark.parametrize("args", [["resume", "{job}"], ["cancel", "{job}"], ["pause", "{job}"]])
def test_illegal_transition_exits_1_and_writes_nothing(run: Run, raw: redis.Redis, seeded: Job,
                                                       args: list[str]) -> None:
    if args[0] != "resume":
        run("cancel", seeded.id)  # finished: nothing more may happen to it
    before = keyspace(raw)
    result = run(*[a.format(job=seeded.id) for a in args])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {args[0]}") and "not allowed while the job is" in result.stderr
    assert keyspace(raw) == before


def test_redis_unreachable_is_one_line_exit_1(run: Run) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    for args in (["ls"], ["enqueue", "busybox", "true"], ["slots", "2"], ["events", "--follow"]):
        result = run("--redis-url", url, *args)
        assert result.exit_code == 1, (args, result.output)
        assert result.stderr.startswith("Error: redis unreachable") and len(result.stderr.splitlines()) == 1


# ---- the process commands: lazy imports, thin wiring ---------------------------------------------------

@pytest.mark.parametrize(("args", "module", "what"), [
    (["worker"], "jobpool.workers", "the worker"),
    (["supervisor", "--once"], "jobpool.supervisor", "the supervisor"),
    (["reconcile", "--dry-run"], "jobpool.supervisor", "reconcile"),
    (["up"], "jobpool.up.stack", "`jobpool up`"),
])
def test_process_commands_say_when_not_in_this_build(run: Run, monkeypatch: pytest.MonkeyPatch,
                                                     args: list[str], module: str, what: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes the import fail, as in a build without it
    result = run(*args)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {what} is not available in this build")
    assert len(result.stderr.splitlines()) == 1


def _fake_module(monkeypatch: pytest.MonkeyPatch, name: str, **functions: Callable[..., Any]) -> None:
    module = types.ModuleType(name)
    for attr, fn in functions.items():
        setattr(module, attr, fn)
    monkeypatch.setitem(sys.modules, name, module)


def test_process_commands_pass_settings_and_options(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any, dict[str, Any]]] = []

    def record(name: str, rv: Any = None) -> Callable[..., Any]:
        def fn(first: Any, **kwargs: Any) -> Any:
            calls.append((name, first, kwargs))
            return rv
        return fn

    _fake_module(monkeypatch, "jobpool.workers", run_worker=record("worker", rv=3))
    decision = {"job_id": "j1", "attempt": 2, "owner_boot": "b1", "expected": "", "outcome": "kept",
                "verdict": {"kind": "keep", "reason": "", "evidence": "lease held"}}
    report = types.SimpleNamespace(to_dict=lambda: {"pool": POOL, "decisions": [decision]},
                                   line=lambda: "sweep pool=clitest: rows=1")
    _fake_module(monkeypatch, "jobpool.supervisor", run_supervisor=record("supervisor"),
                 reconcile=record("reconcile", rv=report))
    _fake_module(monkeypatch, "jobpool.up.stack", run_up=record("up", rv=4))
    _fake_module(monkeypatch, "jobpool.dashboard", run_dashboard=record("dashboard", rv=0))

    assert run("worker", "--burst").exit_code == 0  # its return value is a count of jobs left running
    assert run("supervisor", "--once", "--pool", "p2").exit_code == 0
    assert ok_json(run("reconcile", "--evict-stale", "--json")) == {"pool": POOL, "decisions": [decision]}
    human = run("reconcile", "--dry-run").stdout.splitlines()
    assert human[0] == "sweep pool=clitest: rows=1"
    assert human[1].split() == ["JOB", "ATT", "VERDICT", "EXPECTED", "OUTCOME", "EVIDENCE"]
    assert human[2].split() == ["j1", "2", "keep", "-", "kept", "lease", "held"]
    calls.pop()  # the dry run's call
    assert run("up", "--workers", "3", "--slots", "2", "--executor", "subprocess", "--state-dir", "/tmp/s",
               env={"JOBPOOL_SWEEP_INTERVAL_SECS": "7"}).exit_code == 4
    assert run("up", "--no-dashboard").exit_code == 4
    assert run("dashboard", "--port", "9999", env={"JOBPOOL_DASHBOARD_TOKEN": STRONG_TOKEN}).exit_code == 0
    assert run("dashboard", "--port", "0").exit_code == 2
    (w, ws, wk), (s, ss, sk), (r, rp, rk), (u, us, uk), (_, _, nk), (d, ds, dk) = calls
    assert (w, ws.pool, wk) == ("worker", POOL, {"burst": True})
    assert (s, ss.pool, sk) == ("supervisor", "p2", {"once": True})
    assert (r, rp.keys.pool, rk) == ("reconcile", POOL, {"evict_stale": True, "dry_run": False})
    assert (u, us.sweep_interval_secs, uk) == (
        "up", 7.0, {"workers": 3, "slots": 2, "state_dir": "/tmp/s", "executor": "subprocess",
                    "dashboard_port": 8765})
    assert nk["dashboard_port"] is None
    assert (d, ds.pool, ds.dashboard_token, dk) == ("dashboard", POOL, STRONG_TOKEN,
                                                    {"host": "127.0.0.1", "port": 9999})
    assert run("up", "--executor", "podman").exit_code == 2


def test_process_command_docker_failure_is_one_line(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_daemon(settings: Any, **kwargs: Any) -> None:
        raise docker.errors.DockerException("Error while fetching server API version")

    _fake_module(monkeypatch, "jobpool.workers", run_worker=no_daemon)
    result = run("worker")
    assert result.exit_code == 1
    assert result.stderr == "Error: docker: Error while fetching server API version\n"


def test_real_supervisor_once_then_status_sees_it(run: Run, pool: Pool, client: redis.Redis) -> None:
    """`supervisor --once` writes the last-sweep record `status` reads (nothing runs: Docker is not asked)."""
    _live_worker(client, pool, "w1")
    assert run("status").exit_code == 1
    result = run("supervisor", "--once")
    assert result.exit_code == 0, result.output
    doc = ok_json(run("status", "--json"))
    assert doc["healthy"] is True and doc["last_sweep"]["rows"] == 0


def test_real_reconcile_dry_run_reports_json(run: Run) -> None:
    doc = ok_json(run("reconcile", "--dry-run", "--json"))
    assert (doc["pool"], doc["dry_run"], doc["decisions"]) == (POOL, True, [])
    human = run("reconcile")
    assert human.exit_code == 0 and human.stdout.startswith(f"sweep pool={POOL}")


# ---- order and limits -----------------------------------------------------------------------------------

def test_limits_priorities_and_why_a_job_waits(run: Run, pool: Pool) -> None:
    assert run("limit").stdout.strip() == "no limits"
    assert run("limit", "dataset:*", "1").stdout.strip() == "dataset:* = 1  (new)"
    run("slots", "2")
    first = enqueue_id(run, "--uses", "dataset:sales", "busybox", "--", "sleep", "30")
    second = enqueue_id(run, "--uses", "dataset:sales=1", "--priority", "5", "busybox", "--", "sleep", "30")
    heavy = enqueue_id(run, "--slots", "2", "--group", "tenant-a", "busybox", "--", "true")
    assert ok_json(run("--json", "limit")) == [{"name": "dataset:*", "max": 1, "used": 1}]
    doc = ok_json(run("--json", "show", second))
    assert doc["spec"]["uses"] == {"dataset:sales": 1} and doc["spec"]["priority"] == 5
    assert doc["waiting_for"] == [f"dataset:sales 1/1 (limit dataset:*), needs 1, held by {first}"]
    shown = run("show", heavy).stdout
    assert "waiting for   needs 2 slots, 1 free of 2" in shown and "tenant-a" in shown
    rows = {r.split()[0]: r.split()[2] for r in run("ls").stdout.splitlines()[1:]}
    assert rows[second] == "5" and rows[first] == "0"
    status = json.loads(run("--json", "status").stdout)  # unhealthy (exit 1): no supervisor, no workers
    assert status["limits"] == [{"name": "dataset:*", "max": 1, "used": 1}]
    assert "\nlimit       dataset:* 1/1 used\n" in run("status").stdout
    assert run("limit", "dataset:*", "2").stdout.strip() == "dataset:* = 2  (was 1)"
    assert pool.get(second).state.value == "running"
    assert run("limit", "dataset:*", "--remove").stdout.strip() == "removed dataset:* (was 2)"


# ---- time and dependencies ------------------------------------------------------------------------------

def _iso(ms: int, hours: int = 0) -> str:
    """`ms` as ISO-8601 in a zone `hours` east of UTC, as a person in it would type it."""
    zone = datetime.timezone(datetime.timedelta(hours=hours))
    return datetime.datetime.fromtimestamp(ms / 1000, zone).isoformat(timespec="seconds")


def test_time_options_make_waiting_jobs_and_ls_show_status_say_what_they_wait_for(
        run: Run, pool: Pool, client: redis.Redis) -> None:
    run("slots", "0")
    first = enqueue_id(run, "busybox", "--", "true")
    retried = enqueue_id(run, "--after", first, "--timeout", "2h", "--retries", "2", "--retry-delay", "30s",
                         "--retry-on", "3,4", "busybox", "--", "sh", "-c", "exit 3")
    now = server_ms(client)
    later = enqueue_id(run, "--in", "10m", "busybox", "--", "true")
    at = (now // 1000 + 3600) * 1000
    last = enqueue_id(run, "--at", _iso(at, hours=2), "--after", retried, "--after", first, "busybox", "true")
    jobs = {j: pool.get(j) for j in (first, retried, later, last)}
    assert jobs[first].state is JobState.QUEUED
    assert {jobs[j].state for j in (retried, later, last)} == {JobState.WAITING}
    spec = jobs[retried].spec
    assert (spec.timeout, spec.retries, spec.retry_delay, spec.retry_on) == (7200, 2, 30, (3, 4))
    assert jobs[retried].after == (first,) and jobs[retried].wait_reason == "after"
    due = jobs[later].wait_until
    assert due is not None and now + 600_000 <= due <= now + 605_000
    assert (jobs[last].wait_until, jobs[last].after, jobs[last].wait_reason) == (at, (retried, first),
                                                                                 "not_before")
    # ls: the state, and a note saying after which jobs, until when and why.
    notes = {r.split()[0]: r for r in run("ls", "--state", "waiting").stdout.splitlines()[1:]}
    assert set(notes) == {retried, later, last}
    assert notes[retried].endswith(f"after {first}")
    assert re.search(r"until \S+Z \(in (9|10) min; delayed start\)$", notes[later]), notes[later]
    assert f"after {retried}, {first}; until " in notes[last] and "(in 59 min; delayed start)" in notes[last]
    assert "waiting" in run("ls").stdout
    # show: what each waits for, with the states of the jobs it runs after; the time limit and retries.
    shown = run("show", retried).stdout
    assert f"waiting for   jobs {first} (queued): 0 of 1 succeeded" in shown
    assert "timeout       2h per attempt" in shown
    assert ("retries       0 of 2 used (first delay 30s, doubled per retry, on exit 3, 4 or a timeout)"
            in shown)
    assert f"after         {first}" in shown
    shown = run("show", last).stdout
    utc = datetime.datetime.fromtimestamp(at / 1000, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"waiting for   jobs {retried} (waiting), {first} (queued): 0 of 2 succeeded" in shown
    assert f"waiting for   until {utc}, in 59 min (delayed start)" in shown
    doc = ok_json(run("show", "--json", retried))
    assert doc["waiting_for"] == [f"jobs {first} (queued): 0 of 1 succeeded"]
    assert (doc["state"], doc["after"], doc["wait_reason"], doc["retries_used"]) == ("waiting", [first],
                                                                                     "after", 0)
    assert (doc["spec"]["timeout"], doc["spec"]["retries"], doc["spec"]["retry_on"]) == (7200, 2, [3, 4])
    # status: how many wait, and the next due (the one held by time; the others wait on jobs).
    _live_supervisor(client, pool)
    human = run("status")
    assert human.exit_code == 0, human.output
    assert re.search(r"jobs        1 queued \(.*\), 3 waiting \(the next due in (9|10) min\), 0 paused, "
                     r"0 running", human.stdout), human.stdout
    status = ok_json(run("status", "--json"))
    assert status["counts"]["waiting"] == 3
    assert status["waiting"] == {"count": 3, "next_job": later, "next_due_ms": jobs[later].wait_until}


def test_a_failed_attempt_with_retries_left_waits_and_show_says_which_retry(run: Run, pool: Pool) -> None:
    from tests.support.attempts import claim

    run("slots", "1")
    job_id = enqueue_id(run, "--retries", "2", "--retry-delay", "1h", "busybox", "--", "sh", "-c", "exit 3")
    assert claim(pool, job_id).finish("exit", 3) == "waiting"
    job = pool.get(job_id)
    assert (job.state, job.wait_reason, job.retries_used, job.error_reason) == (JobState.WAITING, "retry", 1,
                                                                                "exit_code_3")
    shown = run("show", job_id).stdout
    assert re.search(r"waiting for   until \S+Z, in [45]\d min \(retry 1 of 2, after exit_code_3\)",
                     shown), shown
    assert "retries       1 of 2 used (first delay 1h, doubled per retry)" in shown
    assert re.search(r"until \S+Z \(in \d+ min; retry 1 of 2, after exit_code_3\)$",
                     run("ls", "--state", "waiting").stdout.splitlines()[1]), run("ls").stdout


def test_a_waiting_job_is_paused_resumed_and_cancelled(run: Run, pool: Pool) -> None:
    run("slots", "0")
    job_id = enqueue_id(run, "--in", "1h", "busybox", "--", "true")
    paused = run("pause", job_id, "--reason", "not yet")
    assert (paused.exit_code, paused.stdout.strip()) == (0, f"paused {job_id}")
    assert pool.get(job_id).state is JobState.PAUSED
    resumed = run("resume", job_id)
    assert resumed.exit_code == 0
    assert re.fullmatch(rf"resumed {job_id} \(waiting: until \S+Z \(in (59|60) min; delayed start\)\)",
                        resumed.stdout.strip()), resumed.stdout
    assert pool.get(job_id).state is JobState.WAITING
    cancelled = run("cancel", job_id)
    assert (cancelled.exit_code, cancelled.stdout.strip()) == (0, f"cancelled {job_id}")
    assert pool.get(job_id).state is JobState.CANCELLED


def test_retry_runs_a_failed_or_cancelled_job_again_and_refuses_the_rest(run: Run, pool: Pool) -> None:
    run("slots", "0")
    first = enqueue_id(run, "busybox", "--", "true")
    second = enqueue_id(run, "--after", first, "busybox", "--", "true")
    refused = run("retry", first)
    assert (refused.exit_code, refused.stdout) == (1, "")
    assert refused.stderr.strip() == (f"Error: retry: only a failed or cancelled job is retried; {first} is "
                                      "queued")
    run("cancel", first)
    assert pool.get(first).state is JobState.CANCELLED
    # Its dependent is cancelled by the release step a supervisor's timer runs (dependency_failed).
    from jobpool.supervisor.timers import release_due
    release_due(pool.store, "test")
    assert (pool.get(second).state, pool.get(second).error_reason) == (JobState.CANCELLED,
                                                                       "dependency_failed")
    blocked = run("retry", second)
    assert blocked.exit_code == 2 and f"job {first}, which it waits for, ended cancelled" in blocked.stderr
    again = run("retry", first)
    assert (again.exit_code, again.stdout.strip()) == (0, f"retried {first} (queued)")
    doc = ok_json(run("retry", second, "--json"))
    assert (doc["state"], doc["after"]) == ("waiting", [first])
    assert "is waiting" in run("retry", second).stderr
    history = [(e["to"], e["reason"]) for e in pool.events(first)]
    assert history[-2:] == [("cancelled", "cancel"), ("queued", "retried")]


def test_status_of_a_pool_from_before_weights_counts_running_jobs_not_waiting_ones(
        run: Run, pool: Pool, client: redis.Redis) -> None:
    """With no `slots_used` stored (a pool from before weights) the slots in use are the running jobs' count:
    the waiting jobs, whose index comes before `running` in the state order, hold none."""
    run("slots", "3")
    enqueue_id(run, "busybox", "--", "sleep", "30")
    for _ in range(2):
        enqueue_id(run, "--in", "1h", "busybox", "--", "true")
    client.hdel(pool.keys.config, "slots_used")
    doc = json.loads(run("--json", "status").stdout)  # unhealthy (exit 1): no supervisor, no workers
    assert doc["slots"] == {"used": 1, "max": 3} and doc["counts"]["waiting"] == 2
    assert "slots       1/3 used" in run("status").stdout
