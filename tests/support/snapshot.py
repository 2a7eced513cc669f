"""One keyspace snapshot for every test that proves "nothing was written": equal snapshots, no write.

Values are read by type (HGETALL, ZRANGE WITHSCORES, LRANGE, SMEMBERS, GET, XRANGE) with whether the key has
a TTL, never with DUMP: DUMP serializes a hash stored as a hashtable in bucket order, which incremental
rehashing changes on mere reads, so two DUMPs of an unchanged key can differ.
"""

from __future__ import annotations

from typing import Any

import redis

Snapshot = dict[bytes, tuple[bytes, Any, bool]]

#: Test-only Lua (scripts in jobpool/ may never do this): the whole keyspace in one round trip, so a snapshot
#: costs one call however many keys there are (the state machine takes hundreds).
_SNAPSHOT_LUA = """
local out = {}
for _, key in ipairs(redis.call('KEYS', '*')) do
  local kind = redis.call('TYPE', key)['ok']
  local value
  if kind == 'hash' then value = redis.call('HGETALL', key)
  elseif kind == 'zset' then value = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  elseif kind == 'list' then value = redis.call('LRANGE', key, 0, -1)
  elseif kind == 'set' then value = redis.call('SMEMBERS', key)
  elseif kind == 'stream' then value = redis.call('XRANGE', key, '-', '+')
  elseif kind == 'string' then value = {redis.call('GET', key)}
  else value = {} end
  out[#out + 1] = {key, kind, value, redis.call('PTTL', key) > 0 and 1 or 0}
end
return out
"""


def _freeze(value: Any) -> Any:
    return tuple(_freeze(v) for v in value) if isinstance(value, list) else value


def keyspace(raw: redis.Redis) -> Snapshot:
    """Every key with its type, full value and whether it has a TTL: equal snapshots mean nothing was written.

    `raw` must return bytes (no decode_responses), so an RQ hash (zlib data) compares byte for byte.
    """
    out: Snapshot = {}
    for key, kind, stored, has_ttl in raw.eval(_SNAPSHOT_LUA, 0):
        value = stored
        if kind in (b"hash", b"zset"):  # field order is not part of the value
            value = sorted(zip(stored[::2], stored[1::2], strict=True))
        elif kind == b"set":
            value = sorted(stored)
        out[key] = (kind, _freeze(value), bool(has_ttl))
    return dict(sorted(out.items()))

