"""A reply lost after Redis ran the script: the worker's write happened, the worker never heard.

A connection reset at that moment (or a short Redis OOM) used to strand the row: a lost `claim` reply left it
claimed with nothing launched, a lost `set_container` reply left the job running unwatched. With the
subprocess executor both kept the slot for ever. Fenced writes are safe to send again, and a claim sent again
by the same claim call succeeds again, so the worker retries and the job runs once.

The fault is real: a proxy (tests/support/proxies.py) in front of the real redis-server forwards the worker's
requests and drops the connection instead of the reply of chosen script calls, found by the script's SHA.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from jobpool import JobState, Pool, RedisUnavailable, Settings
from jobpool.store.luatext import script_text
from tests.support.constants import SUB
from tests.support.polling import eventually
from tests.support.procs import JobpoolProcess
from tests.support.proxies import RedisReplyDropper
from tests.support.servers import RedisServer


def script_sha(name: str) -> str:
    """The SHA1 redis-py sends with EVALSHA for one of jobpool's scripts (its loaded text)."""
    return hashlib.sha1(script_text(name).encode()).hexdigest()


@pytest.fixture
def dropper(redis_server: RedisServer, redis_url: str) -> Iterator[RedisReplyDropper]:
    proxy = RedisReplyDropper(redis_server.port)
    yield proxy
    proxy.close()


@pytest.mark.parametrize(("script", "drops"), [
    pytest.param("claim", 1, id="claim"),
    pytest.param("claim", 3, id="claim-three-times"),
    pytest.param("set_container", 1, id="set_container"),
    pytest.param("finish", 1, id="finish"),
])
def test_a_lost_reply_is_retried_and_the_job_runs_once(
        pool_env: dict[str, str], spawn: Callable[..., JobpoolProcess], tmp_path: Path,
        dropper: RedisReplyDropper, script: str, drops: int) -> None:
    pool = Pool.from_env(env={**pool_env, **SUB})
    with contextlib.closing(pool.store.client):
        marker = tmp_path / "ran"
        sha = script_sha(script)
        dropper.drop(sha, drops)
        job = pool.enqueue("ignored", ["sh", "-c", f'echo "$JOBPOOL_ATTEMPT" >> {marker}; sleep 0.5'])
        spawn(module="jobpool.cli", args=("supervisor",), **SUB)  # on Redis directly
        worker = spawn(JOBPOOL_REDIS_URL=dropper.url, **SUB)

        done = pool.wait(job.id, timeout=40)

        assert dropper.dropped.get(sha) == drops, "the fault was injected"
        assert (done.state, done.attempt, done.recovery_attempts) == (JobState.SUCCEEDED, 1, 0), \
            worker.log()[-3000:]
        assert marker.read_text().split() == ["1"], "the job ran once"
        events = [e["reason"] for e in pool.events(job.id)]
        assert events.count("claimed") == 1, events
        assert pool.slots()[0] == 0
        # The finish sent again got its answer (not a refusal read as "superseded"): the ended job's
        # checkpoint went with it.
        checkpoint = Path(pool_env["JOBPOOL_STATE_DIR"]) / "checkpoints" / pool.keys.pool / job.id
        eventually(lambda: not checkpoint.exists(), timeout=10, message="the checkpoint removed")
        # Nothing is held for ever: the one slot takes the next job, through the same worker.
        nxt = pool.enqueue("ignored", ["sh", "-c", "exit 0"])
        assert pool.wait(nxt.id, timeout=20).state is JobState.SUCCEEDED
        eventually(lambda: worker.proc.poll() is None, timeout=1, message="worker alive")


@pytest.mark.parametrize("retries", [0, 3], ids=["jobpool-client", "client-with-retries"])
def test_a_lost_enqueue_reply_is_raised_typed_and_never_sent_again(redis_url: str, dropper: RedisReplyDropper,
                                                                  retries: int) -> None:
    """Enqueue runs on the thread's held connection (jobpool/submit.py), sent by jobpool itself rather than
    by redis-py's `execute_command` (jobpool/store/runner.py, `_held_call`). A reply lost there is
    `RedisUnavailable`, the connection is opened again for the next call, and the script is never sent a
    second time, not even by a client whose Retry would resend a command (it would meet the job it made and
    answer AlreadyExists): the lost call may have been applied, and it was."""
    kwargs = {"retry": redis.retry.Retry(redis.backoff.NoBackoff(), retries),
              "retry_on_error": [redis.ConnectionError]} if retries else {}
    client = redis.Redis.from_url(dropper.url, decode_responses=True, **kwargs)
    pool = Pool(client, Settings(redis_url=dropper.url, pool="it", max_concurrent_jobs=0))
    with contextlib.closing(pool):
        sha = script_sha("enqueue")
        pool.enqueue("img", ["true"])  # the script loaded, the thread's connection held
        sent = dropper.calls[sha]  # a NOSCRIPT and the call again, on a server new to the script
        dropper.drop(sha)
        with pytest.raises(RedisUnavailable):
            pool.enqueue("img", ["true"])
        assert dropper.dropped == {sha: 1} and dropper.calls[sha] == sent + 1, "sent once, its reply lost"
        third = pool.enqueue("img", ["true"])  # the same pool, on a connection opened again
        assert dropper.calls[sha] == sent + 2
        assert pool.stats()["counts"]["queued"] == 3, "the lost call was applied, once"
        assert pool.get(third.id).state is JobState.QUEUED


def _items(n: int, **extra: object) -> list[dict[str, object]]:
    return [{"image": "img", "command": ["echo", str(i)], **extra} for i in range(n)]


def _queued_commands(pool: Pool) -> list[tuple[str, ...]]:
    return [j.spec.command for j in pool.list("queued", limit=10_000)]


@pytest.mark.parametrize("first_coalesces", [False, True], ids=["new-jobs", "its-first-job-coalesces"])
def test_a_lost_batch_reply_is_counted_from_what_redis_holds(redis_url: str, dropper: RedisReplyDropper,
                                                             first_coalesces: bool) -> None:
    """The reply of the third batch of 100 is lost after Redis applied it. The error used to
    say "the first 200 of the 500 jobs were enqueued" while Redis held 300, so a caller resuming from 200
    queued 100 jobs twice. The batch's outcome is asked of Redis (jobpool/submit.py, `_settled`): its rows
    are there, so the count is 300, on the exception (`enqueued`) as in the message, and resuming from it
    queues every job once. When the batch's first job coalesces into a queued job it makes no row of its
    own, so the look must not rest on the first id alone."""
    client = redis.Redis.from_url(dropper.url, decode_responses=True)
    pool = Pool(client, Settings(redis_url=dropper.url, pool="it", max_concurrent_jobs=0))
    with contextlib.closing(pool):
        items = _items(500)
        expected: list[tuple[str, ...]] = [("echo", str(i)) for i in range(500)]
        if first_coalesces:
            pool.enqueue("img", ["held"], coalesce_key="k")
            items[200]["coalesce_key"] = "k"
            expected = [("held",), *expected[:200], *expected[201:]]
        sha = script_sha("enqueue")
        dropper.drop(sha, after=2)  # batches 0 and 1 answered, batch 2's reply lost
        with pytest.raises(RedisUnavailable) as caught:
            pool.enqueue_many(items)
        assert dropper.dropped == {sha: 1}, "the fault was injected"
        held = _queued_commands(pool)
        assert held == expected[:300], "Redis holds the first 300 jobs' rows (and the job held before)"
        assert "(the first 300 of the 500 jobs were enqueued" in str(caught.value), str(caught.value)
        assert (caught.value.enqueued, caught.value.unknown) == (300, ())

        pool.enqueue_many(items[caught.value.enqueued:])  # the caller resumes where it was told
        assert _queued_commands(pool) == expected, "every job queued once, in input order"


def test_a_lost_reply_then_no_redis_says_the_count_is_unknown_and_how_to_check(
        redis_server_factory: Callable[[], RedisServer]) -> None:
    """The third batch's reply is lost and Redis stops before it can be asked (it stops while the caller
    still waits for the reply): the error says the count is 200 or 300, names the job to look for, and lists
    the batch's ids as `unknown`. Once Redis is back (its AOF kept the batch), looking as told settles it."""
    server = redis_server_factory()
    server.start(appendonly=True)
    proxy = RedisReplyDropper(server.port)
    pool = Pool(redis.Redis.from_url(proxy.url, decode_responses=True),
                Settings(redis_url=proxy.url, pool="it", max_concurrent_jobs=0))
    try:
        sha = script_sha("enqueue")
        proxy.drop(sha, after=2, then=server.stop)
        with pytest.raises(RedisUnavailable) as caught:
            pool.enqueue_many(_items(500))
        assert proxy.dropped == {sha: 1} and not server.running, "the fault was injected"
        exc = caught.value
        assert exc.enqueued == 200 and len(exc.unknown) == 100, str(exc)
        first = exc.unknown[0]
        message = str(exc)
        assert "the first 200 of the 500 jobs were enqueued before it; whether the next 100 were is " \
               "unknown: Redis could not be asked" in message, message
        assert f"if job {first} exists (`jobpool show {first}`), the first 300 were enqueued, else the " \
               "first 200" in message, message

        server.start(appendonly=True)  # the same port and data
        found = eventually(lambda: [pool.get(i) for i in exc.unknown], timeout=10, message="the batch's rows",
                           ignoring=(RedisUnavailable,))
        assert [j.spec.command for j in found] == [("echo", str(i)) for i in range(200, 300)]
        assert len(_queued_commands(pool)) == 300
    finally:
        pool.close()
        proxy.close()


def test_a_lost_batch_whose_jobs_all_coalesced_is_unknown_yet_safe_to_send_again(
        redis_url: str, dropper: RedisReplyDropper) -> None:
    """A batch whose every job coalesced into a queued job makes no row: after its reply is lost, Redis
    cannot tell whether it ran. The error says so (`unknown`), and sending the jobs again coalesces them the
    same way: nothing is queued twice."""
    pool = Pool(redis.Redis.from_url(dropper.url, decode_responses=True),
                Settings(redis_url=dropper.url, pool="it", max_concurrent_jobs=0))
    with contextlib.closing(pool):
        held = [pool.enqueue("img", ["held", str(i)], coalesce_key=f"k{i}") for i in range(3)]
        items = [{"image": "img", "command": ["again"], "coalesce_key": f"k{i}"} for i in range(3)]
        sha = script_sha("enqueue")
        dropper.drop(sha)
        with pytest.raises(RedisUnavailable) as caught:
            pool.enqueue_many(items, batch_size=3)
        assert dropper.dropped == {sha: 1}
        assert caught.value.enqueued == 0 and len(caught.value.unknown) == 3, str(caught.value)
        assert "every job of that batch has a coalesce key and none made a row" in str(caught.value)
        again = pool.enqueue_many(items)
        assert [j.id for j in again] == [j.id for j in held] and all(j.coalesced for j in again)
        assert len(_queued_commands(pool)) == 3
