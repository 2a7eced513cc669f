"""A job's live log: scripts/log_append.lua and its reader (jobpool/livelogs.py), on fakeredis[lua] and a real
redis-server.

Appends are fenced on (boot, attempt), counted in bytes, sent again without a repeat, capped in bytes, and
linger after the attempt's last; a reader sees the lines as they come, says what was trimmed before it read
it and which attempt printed what, and ends once the job has ended.
"""

from __future__ import annotations

import hashlib
from typing import cast

import pytest
import redis

from jobpool import errors
from jobpool.api import Pool
from jobpool.contract import LIVE_LOG_CAP_BYTES, LIVE_LOG_LINGER_SECS, LIVE_LOG_WATCH_SECS
from jobpool.livelogs import pieces
from jobpool.retention import batch_keys
from jobpool.store.luatext import script_text
from jobpool.workers.attempt import Attempt
from jobpool.workers.executors import Handle
from jobpool.workers.executors.base import Output
from jobpool.workers.livelog import LiveLog
from tests.support.attempts import claim
from tests.support.polling import eventually
from tests.support.pool_helpers import Backend, enqueue
from tests.support.proxies import RedisReplyDropper
from tests.support.servers import RedisServer


def running(pool: Pool) -> tuple[str, Attempt]:
    job = enqueue(pool, "echo")
    att = claim(pool, job.id)
    att.set_container("cid", "daemon")
    return job.id, att


def test_appends_are_counted_in_bytes_and_a_resend_adds_nothing(pool: Pool) -> None:
    job_id, att = running(pool)
    assert att.append_log("héllo\n", "1:1") == 7  # bytes, as Lua counts them
    assert att.append_log("héllo\n", "1:1") == 7  # its reply was lost: sent again, added once
    assert att.append_log("world\n", "2:1") == 13
    got = pieces(pool.store.log_after(job_id, 0, 10))
    assert [(p.start, p.end, p.attempt, p.text, p.position) for p in got] == [
        (0, 7, "1", "héllo\n", "1:1"), (7, 13, "1", "world\n", "2:1")]
    assert pool.logs(job_id) == "héllo\nworld\n"  # while it runs, what the live log holds


def test_the_heartbeat_tells_the_worker_whether_someone_reads_the_log(pool: Pool) -> None:
    job_id, att = running(pool)
    assert att.heartbeat().followed is False  # nobody reads: sent every LIVE_LOG_IDLE_SECS
    assert pool.logs(job_id) == ""  # a read of a running job's log marks it read, for a while
    assert att.heartbeat().followed is True
    assert 0 < pool.store.client.pttl(pool.keys.log_watch(job_id)) <= LIVE_LOG_WATCH_SECS * 1000
    pool.store.client.delete(pool.keys.log_watch(job_id))  # the mark expired: nobody reads any more
    assert att.heartbeat().followed is False


def test_only_the_attempts_owner_appends(backend: Backend, pool: Pool) -> None:
    job_id, _ = running(pool)
    before = backend.keyspace()
    stranger = Attempt(pool.store, job_id, "boot-b", 1)
    with pytest.raises(errors.NotOwner):
        stranger.append_log("not mine\n", "1:1")
    with pytest.raises(errors.NotOwner):
        Attempt(pool.store, job_id, "boot-a", 2).append_log("a later attempt\n", "1:1")
    assert backend.keyspace() == before


def test_the_log_keeps_about_its_cap_and_a_late_reader_is_told_what_it_missed(pool: Pool) -> None:
    job_id, att = running(pool)
    chunk = ("x" * 1023 + "\n") * 16  # 16 KiB of whole lines
    appends = LIVE_LOG_CAP_BYTES // len(chunk) * 2
    for i in range(appends):
        att.append_log(chunk, str(i))
    kept = pieces(pool.store.log_after(job_id, 0, 1000))
    held = sum(len(p.text) for p in kept)
    assert LIVE_LOG_CAP_BYTES <= held <= LIVE_LOG_CAP_BYTES + len(chunk)
    assert kept[-1].end == appends * len(chunk)
    att.finish("exit", 0, log_tail="the end\n")
    follower = pool.logs(job_id, follow=True)  # ended: the row's tail
    assert list(follower) == ["the end"]


def test_a_follower_reads_lines_whole_names_each_attempt_and_ends_with_the_job(pool: Pool) -> None:
    job_id, att = running(pool)
    follower = pool.logs(job_id, follow=True)  # started while it runs
    att.append_log("one\ntw", "a")
    att.append_log("o\n", "b")
    att.finish("interrupted", 75)  # handed back: a second attempt
    second = claim(pool, job_id)
    second.set_container("cid2", "daemon")
    second.append_log("three\n", "c", LIVE_LOG_LINGER_SECS * 1000)
    second.finish("exit", 0, log_tail="three\n")
    assert list(follower) == ["one", "two", "[jobpool: attempt 2]", "three"]
    assert 0 < pool.store.client.ttl(pool.keys.job_log(job_id)) <= LIVE_LOG_LINGER_SECS


def test_a_follower_says_what_was_trimmed_before_it_read_it(pool: Pool) -> None:
    job_id, att = running(pool)
    follower = pool.logs(job_id, follow=True)
    chunk = "y" * 16383 + "\n"
    for i in range(LIVE_LOG_CAP_BYTES // len(chunk) + 4):
        att.append_log(chunk, str(i))
    att.finish("exit", 0)
    lines = list(follower)
    assert lines[0].startswith("[jobpool: ") and "bytes of this log were trimmed" in lines[0]
    missed = int(lines[0].split()[1].replace(",", ""))
    assert missed + len(chunk) * (len(lines) - 1) == len(chunk) * (LIVE_LOG_CAP_BYTES // len(chunk) + 4)


def test_a_job_ended_before_its_first_append_follows_as_its_tail(pool: Pool) -> None:
    job_id, att = running(pool)
    follower = pool.logs(job_id, follow=True)
    att.finish("exit", 0, log_tail="short\njob\n")
    assert list(follower) == ["short", "job"]


def test_a_last_attempt_shorter_than_a_read_follows_as_its_tail(pool: Pool) -> None:
    job_id, att = running(pool)
    follower = pool.logs(job_id, follow=True)
    att.append_log("first attempt\n", "a")
    att.finish("interrupted", 75)  # handed back; its next attempt fails before its first read
    second = claim(pool, job_id)
    second.set_container("cid2", "daemon")
    second.finish("exit", 3, log_tail="error: X\n")
    assert list(follower) == ["first attempt", "[jobpool: attempt 2]", "error: X"]


def test_an_unknown_job_is_refused_at_once(backend: Backend, pool: Pool) -> None:
    before = backend.keyspace()
    with pytest.raises(errors.NotFound):
        pool.logs("nosuchjob", follow=True)  # at the call, not at the first line
    with pytest.raises(errors.NotFound):
        pool.logs("no:such {job}", follow=True)
    assert backend.keyspace() == before


def test_retention_removes_the_live_log_with_the_row(pool: Pool) -> None:
    job_id, att = running(pool)
    att.append_log("kept until pruned\n", "1")
    att.finish("exit", 0)
    assert pool.store.client.exists(pool.keys.job_log(job_id))
    assert pool.store.prune("succeeded", 0, pool.now_ms() + 1, "test", [job_id],
                            batch_keys(pool.store, [job_id])) == [job_id]
    assert not pool.store.client.exists(pool.keys.job_log(job_id))


def test_a_reader_that_may_not_write_still_reads_a_running_jobs_log(backend: Backend, pool: Pool) -> None:
    if backend.name != "real":
        pytest.skip("ACLs are the real server's")
    job_id, att = running(pool)
    att.append_log("readable\n", "1")
    client = pool.store.client
    client.acl_setuser("jobpool-test-reader", enabled=True, passwords=["+pw"], keys=["*"],
                       commands=["+@read", "+@connection", "+@transaction"])  # reads in MULTI, no writes
    try:
        kwargs = client.connection_pool.connection_kwargs
        reader = Pool(redis.Redis(host=kwargs["host"], port=kwargs["port"], db=kwargs.get("db", 0),
                                  username="jobpool-test-reader", password="pw", decode_responses=True),
                      pool.settings)
        assert reader.logs(job_id) == "readable\n"  # its mark refused: the log is read all the same
        assert not client.exists(pool.keys.log_watch(job_id))
        reader.store.client.close()
    finally:
        client.acl_deluser("jobpool-test-reader")


def test_a_next_attempt_after_the_log_expired_goes_on_from_its_length(pool: Pool) -> None:
    """The stream expires while a handed-back job waits long for its next attempt: the next attempt's appends
    go on from the log's length (the row keeps it), so a follower that read the first attempt reads all of
    the second, even one whose first append ends where the first attempt's log ended."""
    job_id, att = running(pool)
    follower = pool.logs(job_id, follow=True)
    att.append_log("a" * 9 + "\n" * 1 + "a" * 89 + "\n", "a")  # 100 bytes
    assert [next(follower), next(follower)] == ["a" * 9, "a" * 89]
    att.finish("interrupted", 75)
    pool.store.client.delete(pool.keys.job_log(job_id))  # its linger ran out before the next attempt
    second = claim(pool, job_id)
    second.set_container("cid2", "daemon")
    second.append_log("b" * 49 + "\n" + "b" * 49 + "\n", "b", LIVE_LOG_LINGER_SECS * 1000)  # 100 bytes too
    second.finish("exit", 0)
    assert list(follower) == ["[jobpool: attempt 2]", "b" * 49, "b" * 49]
    assert [(p.start, p.end) for p in pieces(pool.store.log_after(job_id, 0, 10))] == [(100, 200)]


class PrintedSoFar:
    """A stand-in for an executor's handle (workers/executors/base.py `Handle.read_output`): what the job
    printed, read by byte offset, as the subprocess executor reads its output file."""

    def __init__(self) -> None:
        self.out = b""

    def read_output(self, position: str, budget: int, lines: int, timeout: float) -> Output:
        start = int(position or 0)
        end = min(len(self.out), start + budget)
        return Output(self.out[start:end], str(end))


def test_the_last_append_is_sent_again_until_redis_answers(redis_server: RedisServer) -> None:
    """The watcher's last append (`LiveLog.close(last=True)`, made before the end is recorded) whose
    connection is cut is sent again, as the finish after it is: the follower reads the job's last lines, and
    the log lingers."""
    proxy = RedisReplyDropper(redis_server.port)
    try:
        pool = Pool.from_url(redis_server.url)
        worker_side = Pool.from_url(proxy.url)
        job = pool.enqueue(image="busybox", command=["true"])
        att = claim(worker_side, job.id, "boot-a")
        att.set_container("c1", "daemon")
        printed = PrintedSoFar()
        live = LiveLog(att, cast(Handle, printed))
        live.followed = True
        live.start()
        printed.out += b"line 1\nline 2\n"
        eventually(lambda: pool.logs(job.id) == "line 1\nline 2\n", timeout=10)
        printed.out += b"line 3\nRESULT: 42\n"
        proxy.swallow(hashlib.sha1(script_text("log_append").encode()).hexdigest())
        live.close(last=True)
        assert pool.logs(job.id) == printed.out.decode()
        assert pool.store.client.pttl(pool.keys.job_log(job.id)) > 0
    finally:
        proxy.close()
