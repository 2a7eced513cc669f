"""`Pool.status()` / `Pool.health()` and the event reads, against a real redis-server and real worker and
supervisor processes: the one report the CLI, the API and a dashboard all read."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from jobpool import InvalidArgument, Pool
from jobpool.status import StatusReport
from tests.support.constants import SUB
from tests.support.polling import eventually

REPO = Path(__file__).resolve().parents[2]
#: A job that runs until it is stopped, on the subprocess executor (the image is ignored there).
FOREVER = ["sh", "-c", "while true; do sleep 0.1; done"]


def _json_round_trip(report: StatusReport) -> dict[str, Any]:
    doc = report.to_dict()
    assert json.loads(json.dumps(doc)) == doc  # plain JSON types only
    return doc


def test_status_reports_a_real_fleet(sub_pool: Pool, spawn: Callable[..., Any]) -> None:
    sub_pool.set_slots(1)
    running = sub_pool.enqueue("ignored", FOREVER)
    waiting = sub_pool.enqueue("ignored", ["true"])
    worker = spawn(**SUB)
    spawn(module="jobpool.cli", args=("supervisor",), **SUB)

    def settled() -> StatusReport | None:
        r = sub_pool.status()
        ok = (r.healthy and r.workers is not None and r.workers.boots and r.workers.boots[0].jobs
              and r.last_sweep is not None and r.last_sweep.rows == 1)
        return r if ok else None

    report = eventually(settled, timeout=30, message="a healthy report with the worker on its job")
    assert report.reachable and report.slots is not None and (report.slots.used, report.slots.max) == (1, 1)
    assert report.counts["running"] == 1 and report.counts["queued"] == 1
    assert report.queue is not None and (report.queue.depth, report.queue.oldest_job) == (1, waiting.id)
    assert report.queue.oldest_wait_ms is not None and report.queue.oldest_wait_ms >= 0
    assert report.promotion is not None and not report.promotion.paused
    assert report.workers is not None and (report.workers.live, report.workers.stale) == (1, 0)
    boot = report.workers.boots[0]
    assert (boot.pid, boot.jobs, boot.executor) == (worker.pid, (running.id,), "subprocess")
    assert not boot.draining
    assert boot.heartbeat_age_ms is not None and 0 <= boot.heartbeat_age_ms < 5_000
    assert report.last_sweep is not None and report.last_sweep.verdicts.get("keep") == 1
    assert report.now_ms is not None and 0 <= report.now_ms - report.last_sweep.at < 5_000
    assert report.unknown == 0 and sub_pool.boot_is_live(boot.id)
    doc = _json_round_trip(report)
    assert doc["workers"]["boots"][0]["jobs"] == [running.id] and doc["healthy"] is True
    assert sub_pool.health().healthy
    sub_pool.cancel(running.id)


def test_health_says_why_once_the_worker_and_the_supervisor_are_gone(sub_pool: Pool,
                                                                     spawn: Callable[..., Any]) -> None:
    worker = spawn(**SUB)
    supervisor = spawn(module="jobpool.cli", args=("supervisor",), **SUB)
    boot_id = cast(str, eventually(
        lambda: (r := sub_pool.status()).healthy and r.workers and r.workers.boots[0].id, timeout=30,
        message="a healthy pool"))
    worker.kill_with_children()  # idle: no job to leave behind; its boot record expires with its TTL
    supervisor.signal(signal.SIGKILL)
    supervisor.wait(10)

    def both_reasons() -> tuple[str, ...]:
        reasons = sub_pool.health().reasons
        return reasons if len(reasons) == 2 else ()

    reasons = eventually(both_reasons, timeout=20, message="both reasons in the verdict")
    assert reasons[0].startswith("no live supervisor: the last sweep was ")
    assert reasons[1] == "fewer live workers than slots: 0 ready for 1 slot"
    report = sub_pool.status()
    assert report.workers is not None and (report.workers.live, report.workers.stale) == (0, 1)
    assert not sub_pool.boot_is_live(boot_id) and not sub_pool.boot_is_live("")
    assert _json_round_trip(report)["healthy"] is False


def test_status_with_redis_down_is_an_unhealthy_report_not_an_error(
        redis_server_factory: Callable[[], Any], pool_env: dict[str, str]) -> None:
    server = redis_server_factory()
    server.start()
    pool = Pool.from_env(env={**pool_env, "JOBPOOL_REDIS_URL": server.url})
    pool.set_slots(1)
    server.stop()
    report = pool.status()
    assert (report.reachable, report.healthy, report.slots, report.workers) == (False, False, None, None)
    assert report.health.reasons[0].startswith("redis unreachable")
    assert _json_round_trip(report)["redis"] == {"url": server.url, "reachable": False}
    assert pool.health() == report.health
    pool.close()


@pytest.mark.parametrize("garbage", ["not json", '{"rows": 3}', "hash"])
def test_an_unreadable_last_sweep_record_is_a_warning_in_the_report(pool: Pool, redis_url: str,
                                                                     garbage: str) -> None:
    """Another program wrote the supervisor's key: the report still comes, saying so (no live supervisor)."""
    with contextlib.closing(redis.Redis.from_url(redis_url)) as raw:
        if garbage == "hash":
            raw.hset(pool.keys.last_sweep, "at", "1")
        else:
            raw.set(pool.keys.last_sweep, garbage)
    report = pool.status()
    assert report.reachable and report.last_sweep is None
    assert report.health.warnings[0].startswith("the last-sweep record is unreadable")
    assert "no live supervisor: no sweep has been recorded for this pool" in report.health.reasons


def test_stats_say_since_when_promotion_is_paused(pool: Pool) -> None:
    before = pool.now_ms()
    pool.pause(reason="deploy")
    stats = pool.stats()
    assert stats["queue_paused"] and before <= stats["paused_since"] <= pool.now_ms()
    promotion = pool.status().promotion
    assert promotion is not None
    assert (promotion.paused, promotion.by, promotion.reason) == (True, "api", "deploy")
    assert promotion.since == stats["paused_since"]
    pool.resume()
    assert pool.stats()["paused_since"] is None


# ---- events -------------------------------------------------------------------------------------------

def test_tail_then_follow_misses_nothing_and_repeats_nothing(pool: Pool) -> None:
    pool.set_slots(0)
    a, b, c = (pool.enqueue("busybox", ["true"]) for _ in range(3))
    tail, after = pool.tail_events(count=2)
    assert [e["job"] for e in tail] == [b.id, c.id] and after == tail[-1]["id"]
    assert [e["job"] for e in pool.tail_events(a.id, count=5)[0]] == [a.id]
    assert pool.tail_events(count=0) == ([], after)  # nothing shown, and still no gap after it
    follow = pool.follow_events(after=after, block_secs=0.2)
    d = pool.enqueue("busybox", ["true"])
    pool.pause(a.id)
    got = [next(follow), next(follow)]
    assert [(e["job"], e["to"]) for e in got] == [(d.id, "queued"), (a.id, "paused")]
    only_a = pool.follow_events(a.id, block_secs=0.2)  # from now on, one job
    pool.enqueue("busybox", ["true"])
    pool.resume(a.id)
    e = next(only_a)
    assert (e["job"], e["to"]) == (a.id, "queued")


@pytest.mark.parametrize(("call", "message"), [
    (lambda p: p.follow_events(after="$"), "after must be a stream id"),
    (lambda p: p.follow_events(after="(1-0"), "after must be a stream id"),
    (lambda p: p.follow_events(block_secs=0), "block_secs"),
    (lambda p: p.follow_events(job_id=7), "job_id must be a string"),
    (lambda p: p.tail_events(count=-1), "count must be a whole number from 0"),
    (lambda p: p.tail_events(count=True), "count must be a whole number"),
])
def test_bad_event_reads_are_refused_when_called(pool: Pool, call: Callable[[Pool], Any],
                                                 message: str) -> None:
    """Refused at the call, not at the first `next()` of a follow that may come much later."""
    with pytest.raises(InvalidArgument, match=message):
        call(pool)


def test_events_follow_with_count_0_prints_only_new_events(redis_url: str, pool_env: dict[str, str],
                                                           pool: Pool) -> None:
    """`--count` is how many of the newest events to show first; 0 shows none of the backlog."""
    pool.set_slots(0)
    pool.enqueue("busybox", ["true"])  # the backlog
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("JOBPOOL_")}, **pool_env,
           "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "jobpool.cli", "--json", "events", "--follow", "--count", "0"]
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout or ():
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    fresh: list[str] = []
    try:
        first = eventually(lambda: _enqueue_until_seen(pool, lines, fresh), timeout=20,
                           message="an event printed")
        assert first["job"] in fresh, f"the backlog was printed: {first}"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err


def _enqueue_until_seen(pool: Pool, lines: queue.Queue[str], fresh: list[str]) -> dict[str, Any] | None:
    """The follow may not have started reading yet: enqueue again until it prints something."""
    if lines.empty():
        fresh.append(pool.enqueue("busybox", ["true"]).id)
        return None
    event: dict[str, Any] = json.loads(lines.get_nowait())
    return event
