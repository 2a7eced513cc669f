"""A reply lost after Redis ran the script: the worker's write happened, the worker never heard.

A connection reset at that moment (or a short Redis OOM) used to strand the row: a lost `claim` reply left it
claimed with nothing launched, a lost `set_container` reply left the job running unwatched. With the
subprocess executor both kept the slot for ever. Fenced writes are safe to send again, and a claim sent again
by the same claim call succeeds again, so the worker retries and the job runs once.

The fault is real: a proxy (tests/proxies.py) in front of the real redis-server forwards the worker's
requests and drops the connection instead of the reply of chosen script calls, found by the script's SHA.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from constants import SUB
from polling import eventually
from proxies import RedisReplyDropper
from servers import RedisServer

from jobpool import JobState, Pool, RedisUnavailable, Settings
from jobpool.registry import script_text


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
def test_a_lost_reply_is_retried_and_the_job_runs_once(pool_env: dict[str, str], spawn, tmp_path: Path,
                                                        dropper: RedisReplyDropper, script: str,
                                                        drops: int) -> None:
    pool = Pool.from_env(env={**pool_env, **SUB})
    with contextlib.closing(pool.client):
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
    by redis-py's `execute_command` (jobpool/registry.py, `_held_call`). A reply lost there is
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
