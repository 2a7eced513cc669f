"""What a call costs Redis when calls are spaced apart (as in bench/scale.py's part 2: a few a second) against
back to back, and whether loading the shared Lua definitions once, as a Redis Function library, changes it.

On a private redis-server (7.0 or later for the Function rows), each kind of call is sent `--calls` times
back to back ("hot") and `--calls` times `--pace` seconds apart ("paced"), and SLOWLOG (threshold 0) gives
each call's server time; the median is printed. The kinds:

- PING, and one HSET: a command's floor;
- EVALSHA of `return 1`: a script call's floor;
- heartbeat.lua, the job's most frequent call (12 of a 60 s job's 16 script calls), on a claimed job, as
  jobpool sends it (EVALSHA of its loaded text: the shared definitions it reaches, then the script,
  jobpool/store/luatext.py);
- the same text as a Function (FCALL): a library whose top level makes the definitions once, at load, and
  registers the script as a function, so a call runs the script alone.

    python3 -m bench.cold_calls [--calls 100] [--pace 0.05]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import redis

from jobpool import Pool
from jobpool.config import Settings
from jobpool.store import luatext
from jobpool.workers.attempt import Attempt
from tests.support.servers import RedisServer

#: The names a script's prelude (luatext.prelude) defines: in the library they are its top-level locals,
#: which each function sets on entry (Redis runs one call at a time), so the shared definitions reach them.
_PRELUDE_NAME = r"^local (\w+) = "


def function_library(name: str, op: str) -> str:
    """Library `name` registering script `op` as function `op`: the definitions it reaches made once at
    load, its prelude and text run per call. A Function may reach at most 60 outer locals (Lua 5.1's limit
    on upvalues), which the larger scripts (enqueue) exceed: this is for the small ones."""

    own = luatext._own(op)
    shared = luatext.needed(luatext.definitions(luatext._shared()), own)
    pre = luatext.prelude(luatext.shape(op), luatext._LINE_COMMENT.sub("", luatext._BLOCK_COMMENT.sub(
        "", shared + own)))
    names = ["KEYS", "ARGV", *re.findall(_PRELUDE_NAME, pre, re.MULTILINE)]
    body = re.sub(r"^local ", "", pre, flags=re.MULTILINE)
    entry = f"redis.register_function('{op}', function(keys, argv)\nKEYS, ARGV = keys, argv\n"
    return f"#!lua name={name}\nlocal {', '.join(names)}\n{shared}\n{entry}{body}{own}\nend)\n"


def server_usecs(client: redis.Redis, word: bytes, call: Callable[[], Any], n: int, pace: float) -> float:
    """The median server time of `n` calls of `call`, `pace` seconds apart: SLOWLOG's entries of command
    `word` (SLOWLOG lists a script's own commands too, each on its own line: those are left out)."""
    client.slowlog_reset()
    for _ in range(n):
        call()
        if pace:
            time.sleep(pace)
    entries = [e for e in client.slowlog_get(-1) if e["command"].split(b" ", 1)[0] == word]
    assert len(entries) == n, (word, len(entries))
    return float(statistics.median(e["duration"] for e in entries))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--pace", type=float, default=0.05, help="seconds between paced calls")
    args = ap.parse_args()
    rs = RedisServer()
    try:
        rs.start()
        raw = redis.Redis.from_url(rs.url)
        pool = Pool(redis.Redis.from_url(rs.url, decode_responses=True), Settings(max_concurrent_jobs=10))
        job = pool.enqueue(image="busybox", command=["true"])
        attempt = Attempt(pool.store, job.id, "boot-bench", pool.get(job.id).attempt)
        attempt.claim()
        store = pool.store
        keys = [store.keys.job(job.id), store.keys.lease(job.id), store.keys.log_watch(job.id),
                *store._pool_keys["heartbeat"]]
        hb_args = ["boot-bench", attempt.attempt, 30_000, *store.scripts._settings["heartbeat"]]
        trivial = raw.script_load("return 1")
        kinds: list[tuple[str, bytes, Callable[[], Any]]] = [
            ("PING", b"PING", raw.ping),
            ("HSET", b"HSET", lambda: raw.hset("bench:h", "a", "1")),
            ("EVALSHA `return 1`", b"EVALSHA", lambda: raw.evalsha(trivial, 0)),
            ("heartbeat.lua (EVALSHA, as jobpool sends it)", b"EVALSHA", attempt.heartbeat),
        ]
        version = tuple(int(p) for p in raw.info("server")["redis_version"].split(".")[:2])
        if version >= (7, 0):
            raw.function_load(function_library("jobpool_bench", "heartbeat"), replace=True)
            kinds.append(("heartbeat.lua as a Function (FCALL)", b"FCALL",
                          lambda: raw.fcall("heartbeat", len(keys), *keys, *hb_args)))
        else:
            print(f"redis-server {version}: no Functions, their row left out")
        raw.config_set("slowlog-log-slower-than", 0)
        raw.config_set("slowlog-max-len", 20 * args.calls)
        print(f"server time per call, median of {args.calls} (us): hot (back to back) and paced "
              f"({args.pace * 1000:g} ms apart); SLOWLOG counts whole microseconds")
        for name, word, call in kinds:
            call()  # loaded and run once
            hot = server_usecs(raw, word, call, args.calls, 0)
            paced = server_usecs(raw, word, call, args.calls, args.pace)
            ratio = f"{paced / hot:5.1f}x" if hot >= 1 else "    -"
            print(f"  {name:46s} hot {hot:6.1f}   paced {paced:6.1f}   paced/hot {ratio}")
        return 0
    finally:
        rs.close()


if __name__ == "__main__":
    sys.exit(main())
