"""A job's history through the CLI as a real process, on a real redis-server: it lasts as long as the job
(issue #23: five pauses with long reasons used to push `enqueued` out without a trace), and a job that goes
on changing state for ever keeps its start and its newest events with one event saying what went between.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

from jobpool import Pool
from jobpool.apichecks import MAX_TEXT_BYTES
from jobpool.contract import HISTORY_HEAD_EVENTS, HISTORY_MAX_BYTES, REASON_HISTORY_TRIMMED

POOL = "history"
REPO = Path(__file__).resolve().parents[2]


def cli(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBPOOL_")}
    env.update({"JOBPOOL_REDIS_URL": redis_url, "JOBPOOL_POOL": POOL})
    return subprocess.run([sys.executable, "-m", "jobpool.cli", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


def ok(redis_url: str, *args: str) -> str:
    done = cli(redis_url, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def cli_events(redis_url: str, job_id: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = json.loads(ok(redis_url, "--json", "events", "--job", job_id,
                                               "--count", "5000"))
    return docs


def test_five_pauses_with_4_kib_reasons_leave_all_eleven_events(redis_url: str) -> None:
    ok(redis_url, "slots", "0")
    job_id = ok(redis_url, "enqueue", "busybox", "true").strip()
    reason = "r" * MAX_TEXT_BYTES
    for _ in range(5):
        ok(redis_url, "pause", job_id, "--reason", reason)
        ok(redis_url, "resume", job_id)
    expected = [("", "queued", "enqueued", "")] + [("queued", "paused", "pause", reason),
                                                   ("paused", "queued", "resume", "")] * 5
    shown = cli_events(redis_url, job_id)
    assert [(e["from"], e["to"], e["reason"], e["evidence"]) for e in shown] == expected
    pool = Pool.from_url(redis_url, name=POOL)
    try:
        api = pool.events(job_id)
    finally:
        pool.close()
    assert [(e["from"], e["to"], e["reason"], e["evidence"]) for e in api] == expected
    assert [e["id"] for e in api] == [e["id"] for e in shown]


def test_a_history_past_its_cap_says_what_it_dropped(redis_url: str) -> None:
    pool = Pool.from_url(redis_url, name=POOL)
    try:
        pool.set_slots(0)
        job = pool.enqueue("busybox", ["true"])
        for i in range(40):
            pool.pause(job.id, reason=f"pause {i} " + "p" * (MAX_TEXT_BYTES - 10))
            pool.resume(job.id)
        entries = cast("list[tuple[str, dict[str, str]]]", pool.store.client.xrange(pool.keys.events))
        written = [{"id": i, **f} for i, f in entries if f["job"] == job.id]
        assert len(cast(str, pool.store.client.hget(pool.keys.job(job.id), "history"))) <= HISTORY_MAX_BYTES
    finally:
        pool.close()
    shown = cli_events(redis_url, job_id=job.id)
    marker = shown[HISTORY_HEAD_EVENTS]
    kept = len(shown) - HISTORY_HEAD_EVENTS - 1
    dropped = written[HISTORY_HEAD_EVENTS:len(written) - kept]
    assert [e["id"] for e in shown[:HISTORY_HEAD_EVENTS]] == [e["id"] for e in written[:HISTORY_HEAD_EVENTS]]
    assert shown[0]["reason"] == "enqueued"
    assert [e["id"] for e in shown[HISTORY_HEAD_EVENTS + 1:]] == [e["id"] for e in written[-kept:]]
    assert marker["reason"] == REASON_HISTORY_TRIMMED and marker["id"] == dropped[-1]["id"]
    assert re.fullmatch(rf"{len(dropped)} events dropped to bound the history \(ids {dropped[0]['id']} to "
                        rf"{dropped[-1]['id']}, at {dropped[0]['at']} to {dropped[-1]['at']} ms\)",
                        marker["evidence"])
    # The human listing shows it as one line among the others.
    lines = ok(redis_url, "events", "--job", job.id, "--count", "5000").splitlines()
    assert len(lines) == len(shown)
    assert REASON_HISTORY_TRIMMED in lines[HISTORY_HEAD_EVENTS] and f"{len(dropped)} events dropped" in \
        lines[HISTORY_HEAD_EVENTS]
