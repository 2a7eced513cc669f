"""A worker's round on its queues (jobpool/workers/routedqueue.py `RoutedQueue._dequeue_routed`) against a
real redis-server: a worker listening on its daemon's queue too looks at it without blocking, then blocks on
the pool's queue for its heartbeat period (within `ROUTED_POLL_SECS`), looking at the daemon's queue again in
the same round trip as each block ends, so an idle fleet sends one round trip per worker a heartbeat period; a
job routed to the daemon meanwhile is taken as the block ends."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis
from rq.exceptions import DequeueTimeout
from rq.utils import get_version

from jobpool.config import Settings
from jobpool.store.calls import Store
from jobpool.workers.boot import Boot
from jobpool.workers.outage import is_transient
from jobpool.workers.routedqueue import ROUTED_POLL_SECS, routed_poll_secs
from jobpool.workers.rqworker import JobpoolWorker
from jobpool.workers.runtime import Runtime
from tests.support.polling import eventually
from tests.support.servers import RedisServer

DAEMON = "jpd1:" + "b" * 32 + "@boot-1"


@pytest.mark.parametrize(("heartbeat", "expected"), [(0.1, 1), (1.0, 1), (2.5, 2), (5.0, 5), (3600.0, 5)])
def test_the_round_is_the_heartbeat_period_within_its_bounds(heartbeat: float, expected: int) -> None:
    assert routed_poll_secs(heartbeat) == expected
    assert ROUTED_POLL_SECS[0] <= expected <= ROUTED_POLL_SECS[1]


def worker(redis_url: str, heartbeat: float) -> tuple[JobpoolWorker, Store]:
    settings = Settings(redis_url=redis_url, pool="routed", heartbeat_secs=heartbeat,
                        lease_secs=max(30.0, 2 * heartbeat))
    store = Store.from_settings(settings)
    boot = Boot(store, "docker", DAEMON)
    return JobpoolWorker(Runtime(store=store, boot_id=boot.id, daemon_id=DAEMON), boot), store


def calls(admin: redis.Redis, command: str) -> int:
    return int(admin.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_an_idle_worker_blocks_on_the_pool_queue_for_its_heartbeat_period(
        redis_server_factory: Callable[[], RedisServer]) -> None:
    server = redis_server_factory()  # its own: the commands counted are this worker's alone
    server.start()
    w, store = worker(server.url, heartbeat=3.0)
    assert [q.name for q in w.queues] == [store.keys.daemon_queue_name(DAEMON), store.keys.rq_queue_name]
    admin = redis.Redis.from_url(server.url)
    get_version(w.connection)  # RQ's one INFO, made and kept on the connection before the count
    admin.config_resetstat()
    with pytest.raises(DequeueTimeout):
        w.queue_class.dequeue_any(w.queues, 6, connection=w.connection, job_class=w.job_class,
                                  serializer=w.serializer)
    reads = int(admin.info("stats")["total_reads_processed"])
    # Rounds of 3 s in 6 s (blocking 3, then 2 and 1 s as the timeout nears, as BLMOVE takes whole seconds):
    # a look at the daemon's queue, then each block on the pool's with a look at the daemon's as it ends;
    # the timeout is found past after the third. With rounds of a second: seven looks and six blocks.
    assert (calls(admin, "lmove"), calls(admin, "blmove")) == (4, 3)
    # In four round trips, not seven: the server read the worker's socket four times (and the INFO above's
    # once; a look alone was a round trip of its own before).
    assert reads == 4 + 1, reads


def test_a_job_routed_to_the_daemon_is_taken_at_the_next_round(redis_url: str) -> None:
    w, _ = worker(redis_url, heartbeat=1.0)
    admin = redis.Redis.from_url(redis_url)
    daemon_queue = w.queues[0]
    job = daemon_queue.enqueue_call("builtins.print", args=("routed",))
    # Taken from the daemon's queue ahead of the pool's, whose block is never reached.
    got = w.queue_class.dequeue_any(w.queues, 5, connection=w.connection, job_class=w.job_class,
                                    serializer=w.serializer)
    assert got is not None and got[0].id == job.id and got[1].name == daemon_queue.name
    # Routed while the worker blocks on the pool's queue: taken as the block ends.
    taken: list[Any] = []
    t = threading.Thread(target=lambda: taken.append(w.queue_class.dequeue_any(
        w.queues, 10, connection=w.connection, job_class=w.job_class, serializer=w.serializer)))
    t.start()
    try:
        # Once it blocks on the pool's queue (a client waits in BLMOVE), route a job to its daemon.
        eventually(lambda: any(c.get("cmd") == "blmove" for c in admin.client_list()), timeout=5)
        later = daemon_queue.enqueue_call("builtins.print", args=("later",))
    finally:
        t.join(10)
    assert not t.is_alive()
    assert taken and taken[0] is not None
    job_, queue = taken[0]
    assert job_.id == later.id and queue.name == daemon_queue.name


def blocked_dequeue(w: JobpoolWorker, timeout: int) -> tuple[threading.Thread, list[Any]]:
    """A dequeue in a thread of its own, as the worker's loop sends it: what it returned or raised."""
    out: list[Any] = []

    def dequeue() -> None:
        try:
            out.append(w.queue_class.dequeue_any(w.queues, timeout, connection=w.connection,
                                                 job_class=w.job_class, serializer=w.serializer))
        except BaseException as exc:  # noqa: BLE001 - what the worker's loop would get
            out.append(exc)
    t = threading.Thread(target=dequeue)
    t.start()
    return t, out


def blocked(admin: redis.Redis) -> int:
    """The id of a client blocked in BLMOVE, once one is."""
    return int(eventually(lambda: next((c["id"] for c in admin.client_list() if c.get("cmd") == "blmove"),
                                       None), timeout=5))


def test_a_round_that_takes_two_jobs_keeps_the_routed_one_and_gives_the_other_back(redis_url: str) -> None:
    # A job routed to the daemon while another reaches the pool's queue: the block ends with the pool's, the
    # look right after it takes the routed one, which goes first, and the pool's is put back at the head of
    # its queue, untaken (no intermediate entry left for the supervisor to read as taken).
    w, _ = worker(redis_url, heartbeat=5.0)
    admin = redis.Redis.from_url(redis_url, decode_responses=True)
    daemon_queue, pool_queue = w.queues
    admin.delete(*(k for q in w.queues for k in (q.key, q.intermediate_queue_key)))  # as an earlier test left
    t, taken = blocked_dequeue(w, 10)
    try:
        blocked(admin)
        routed = daemon_queue.enqueue_call("builtins.print", args=("routed",))
        pooled = pool_queue.enqueue_call("builtins.print", args=("pooled",))  # ends the block
        after = pool_queue.enqueue_call("builtins.print", args=("after",))
    finally:
        t.join(10)
    assert not t.is_alive() and taken and taken[0] is not None
    job_, queue = taken[0]
    assert (job_.id, queue.name) == (routed.id, daemon_queue.name)
    assert admin.lrange(pool_queue.key, 0, -1) == [pooled.id, after.id], "given back, at the head"
    assert admin.lrange(pool_queue.intermediate_queue_key, 0, -1) == []
    assert admin.lrange(daemon_queue.intermediate_queue_key, 0, -1) == [routed.id]


def test_a_failover_during_the_block_is_an_outage_the_worker_waits_out(
        redis_server_factory: Callable[[], RedisServer]) -> None:
    # The server made a replica under the blocked round (Redis 7.0 drops the blocked client; an UNBLOCKED
    # reply, raised as the server said it, is the same): an outage the worker's loop waits out
    # (workers/outage.py), nothing taken.
    server = redis_server_factory()
    server.start()
    w, _ = worker(server.url, heartbeat=5.0)
    admin = redis.Redis.from_url(server.url, decode_responses=True)
    daemon_queue = w.queues[0]
    t, errors = blocked_dequeue(w, 10)
    try:
        blocked(admin)
        routed = daemon_queue.enqueue_call("builtins.print", args=("routed",))
        admin.replicaof("127.0.0.1", "1")  # a primary that is not there: the server stays a replica
    finally:
        t.join(10)
        admin.replicaof("no", "one")
    assert not t.is_alive() and len(errors) == 1
    assert is_transient(errors[0]), errors
    assert admin.lrange(daemon_queue.key, 0, -1) == [routed.id], "the look after the block never ran"
    assert admin.keys("*intermediate*") == []


def test_an_error_that_ends_the_block_keeps_what_the_look_after_it_took(redis_url: str) -> None:
    # The block answered with an error (CLIENT UNBLOCK ... ERROR, as UNBLOCKED is answered) and the look
    # after it took a routed job: that job is kept and run, not left taken in its intermediate list.
    w, _ = worker(redis_url, heartbeat=5.0)
    admin = redis.Redis.from_url(redis_url, decode_responses=True)
    daemon_queue, pool_queue = w.queues
    admin.delete(*(k for q in w.queues for k in (q.key, q.intermediate_queue_key)))
    t, taken = blocked_dequeue(w, 10)
    try:
        client = blocked(admin)
        routed = daemon_queue.enqueue_call("builtins.print", args=("routed",))
        assert admin.client_unblock(client, error=True)
    finally:
        t.join(10)
    assert not t.is_alive() and len(taken) == 1 and isinstance(taken[0], tuple), taken
    assert (taken[0][0].id, taken[0][1].name) == (routed.id, daemon_queue.name)
    # With nothing taken, the error is raised as the server said it: an outage the worker waits out.
    t, taken = blocked_dequeue(w, 10)
    try:
        assert admin.client_unblock(blocked(admin), error=True)
    finally:
        t.join(10)
    assert len(taken) == 1 and isinstance(taken[0], redis.ResponseError), taken
    assert str(taken[0]).startswith("UNBLOCKED") and is_transient(taken[0])
    assert admin.lrange(pool_queue.intermediate_queue_key, 0, -1) == []


def test_a_queue_forgotten_during_the_block_keeps_what_the_look_took_from_it(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    # An "earlier boot" found to be a clone that publishes again is forgotten by the inventory thread while
    # the round blocks: a job pushed to its queue meanwhile is not run here (its checkpoint is on the clone's
    # host) but put back at the head of its queue.
    w, store = worker(redis_url, heartbeat=5.0)
    admin = redis.Redis.from_url(redis_url, decode_responses=True)
    earlier = DAEMON.replace("boot-1", "boot-0")
    w.listen_on_earlier_boot(earlier)
    earlier_queue = next(q for q in w.queues if q.name == store.keys.daemon_queue_name(earlier))
    admin.delete(*(k for q in w.queues for k in (q.key, q.intermediate_queue_key)))
    t, out = blocked_dequeue(w, 3)
    try:
        client = blocked(admin)
        w.forget_earlier_boot(earlier)
        kept = earlier_queue.enqueue_call("builtins.print", args=("on the clone",))
        with caplog.at_level(logging.INFO, logger="jobpool.worker"):
            assert admin.client_unblock(client)  # the block ends with nothing: the look after it runs
            t.join(10)
    finally:
        t.join(10)
    assert not t.is_alive() and len(out) == 1 and isinstance(out[0], DequeueTimeout), out
    assert admin.lrange(earlier_queue.key, 0, -1) == [kept.id]
    assert admin.lrange(earlier_queue.intermediate_queue_key, 0, -1) == []
    assert f"gave job {kept.id} back" in caplog.text and "no longer listened on" in caplog.text
