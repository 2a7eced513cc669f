"""Only jobpool/store/ talks to Redis: every other module calls the store's typed methods
(jobpool/store/calls.py and the reads beside it), so no KEYS, ARGV or reply position is written outside it,
and no Redis command is sent but through it. The one exception is RQ's own (docs/architecture.md, "Only the
store talks to Redis"): jobpool's subclasses of RQ's worker batch RQ's bookkeeping calls in pipelines of
the connection RQ is given, which the store makes (jobpool/store/rqconnection.py)."""

from __future__ import annotations

import re
from pathlib import Path

import jobpool
from jobpool.store.runner import SCRIPT_NAMES

ROOT = Path(jobpool.__file__).parent
#: A script named in a call: `run("claim", ...)`, `scripts.run("enqueue", ...)`, `register_script(...)`.
CALL = re.compile(r"""\brun\(\s*["'](""" + "|".join(SCRIPT_NAMES) + r""")["']|register_script\(""")

#: redis-py's client methods named after a Redis command that nothing else in the package is called (so not
#: get, set, delete, exists, keys, time or ping, which dicts, events, paths, clocks and Docker clients have).
COMMANDS = """
    pipeline execute_command eval evalsha script_load watch multi unwatch
    hget hgetall hmget hset hsetnx hdel hexists hincrby hincrbyfloat hkeys hvals hlen
    zadd zrem zrange zrevrange zrangebyscore zrevrangebyscore zremrangebyscore zremrangebyrank zscore zcard
    zcount zrank lpush rpush lpop rpop lrange llen lrem lpos lindex lmove blmove blpop brpop
    sadd srem smembers sismember scard xadd xrange xrevrange xlen xread xtrim
    incr incrby decr expire pexpire expireat pexpireat pttl ttl mget mset setex psetex setnx getset getdel
    scan_iter flushdb flushall config_get config_set dbsize
"""
#: INFO with a section (a Docker client's `info()` takes none, a logger's `info` takes a message).
INFO_SECTIONS = "server clients memory persistence stats replication cpu commandstats keyspace all default"
#: A Redis client used: a command sent on one, or a client or a connection pool made.
CLIENT_USE = re.compile(
    r"\.(?:" + "|".join(COMMANDS.split()) + r")\("
    + r"""|\.info\(\s*["'](?:""" + "|".join(INFO_SECTIONS.split()) + r""")["']"""
    + r"|\bredis\.(?:Strict)?Redis\(|\b(?:redis|Redis)\.from_url\(|\bSentinel\(|\bConnectionPool\("
    + r"|\.master_for\(|\bredisurl\.client\(")
#: The exception: RQ's worker bookkeeping, batched in a pipeline of RQ's own connection (`self.connection`).
RQ_BOOKKEEPING = {"workers/rqbookkeeping.py", "workers/horses.py"}
RQ_PIPELINE = re.compile(r"\bself\.connection\.pipeline\(|\bpipe\.\w+\(")
#: And RQ's own move of a queue's head, which the worker's queue class passes on to (`RoutedQueue.lmove`).
RQ_OWN = {"workers/routedqueue.py": re.compile(r"\bsuper\(\)\.lmove\(")}
#: What a module outside the store may name of redis-py: its exception classes, and the client's type.
REDIS_NAME = re.compile(r"""(?<![\w."'/])redis\.(\w+)""")


def outside_store() -> list[Path]:
    outside = [p for p in ROOT.rglob("*.py") if "store" not in p.relative_to(ROOT).parts[:1]]
    assert len(outside) > 20, "the scan found the package"
    return outside


def lines(path: Path) -> list[tuple[int, str]]:
    return list(enumerate(path.read_text().splitlines(), 1))


def test_only_the_store_names_a_script() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}" for p in outside_store()
             for n, line in lines(p) if CALL.search(line)]
    assert found == []


def test_the_scan_finds_a_call_by_name() -> None:
    assert CALL.search('reply = self.pool.run("claim", keys, args)')
    assert CALL.search("pool.store.scripts.run('prune', keys, args)")
    assert not CALL.search("pool.store.claim(job_id, boot_id, 1, 30_000, '', '', token)")


def test_nothing_outside_the_store_uses_a_redis_client() -> None:
    found, rq = [], set()
    for path in outside_store():
        name = path.relative_to(ROOT).as_posix()
        for n, line in lines(path):
            if not CLIENT_USE.search(line):
                continue
            own = RQ_OWN.get(name)
            if (name in RQ_BOOKKEEPING and RQ_PIPELINE.search(line)) or (own and own.search(line)):
                rq.add(name)
            else:
                found.append(f"{name}:{n}: {line.strip()}")
    assert found == []
    assert rq == RQ_BOOKKEEPING | set(RQ_OWN), "an exception that is no longer needed goes from the list"


def test_the_scan_finds_a_client_used() -> None:
    for used in ['pipe = conn.pipeline(transaction=False)', 'state = connection.hget(key, "state")',
                 'info = self.client.info("server")', "client = redis.Redis.from_url(url)",
                 "redis.Redis(host='localhost')", "connection=redisurl.client(url)",
                 "self.client.zrange(key, 0, -1)", 'pool.store.client.xadd(k, {"a": "b"})']:
        assert CLIENT_USE.search(used), used
    for other in ['log.info("server started")', 'enabled = api.info().get("LiveRestoreEnabled")',
                  "pool = Pool.from_url(url)", "client = docker.from_env()", "store.rows_found(ids, what)",
                  "self.client.api.stop(container_id)", "time.time()",
                  "self.runtime.store.give_back(q)"]:
        assert not CLIENT_USE.search(other), other
    assert RQ_PIPELINE.search("with self.connection.pipeline() as pipe:")
    assert not RQ_PIPELINE.search("self.connection.lrem(queue.intermediate_queue_key, 1, job_id)")


def test_outside_the_store_redis_py_is_named_for_its_errors_and_its_type_only() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in outside_store() for n, line in lines(p)
             for m in REDIS_NAME.finditer(line)
             if not (m.group(1) in ("exceptions", "Redis") or m.group(1).endswith("Error"))]
    assert found == []
    assert REDIS_NAME.search("except (redis.ConnectionError, redis.TimeoutError):")
    assert not REDIS_NAME.search('stack.redis.log, root / "redis.log"')
