--[[ daemon_mark
Pool keys: events metrics
Settings: events_maxlen
KEYS[1]     daemon_mark:<process id>   KEYS[2] daemon_marks   KEYS[3] shared_daemons
ARGV[1] process id   ARGV[2] record ttl ms   ARGV[3] forget ms (index entries older than this are trimmed)
ARGV[4..NARGV] field, value, field, value, ... (jobpool/fleet/daemonmark.py FIELDS)
Returns {0, at, recorded} (at: ms, the server's time; recorded: 1 when this call recorded a new collision);
-6 bad arguments.
Register (or refresh) one process that marked its Docker daemon (jobpool/fleet/daemonmark.py): its record, written
whole, lives ARGV[2] ms unless refreshed, so a process that dies drops out on its own; the index says when
each was last refreshed, for the readers (every process comparing marks, `status`).
A record whose `collision` is not empty (this process concluded that two daemons share its `daemon_id`) is
also remembered in shared_daemons (daemon identity -> JSON {line, at, by}), the first report kept, with a
pool-wide `daemon_collision` event: it stands, whatever becomes of the processes, until an operator clears
it (forget_collision.lua).
]]
local rec, index, shared = KEYS[1], KEYS[2], KEYS[3]
local id, ttl, forget = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if id == '' or not ttl or ttl <= 0 or ttl ~= math.floor(ttl) or not forget or (NARGV - 3) % 2 ~= 0 then
  return {E_BAD_ARG, 'daemon mark'}
end
local at = now_ms()
redis.call('DEL', rec)
local fields = {'at', at}
local daemon, collision = '', ''
for i = 4, NARGV, 2 do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
  if ARGV[i] == 'daemon_id' then daemon = ARGV[i + 1] end
  if ARGV[i] == 'collision' then collision = ARGV[i + 1] end
end
redis.call('HSET', rec, unpack(fields))
redis.call('PEXPIRE', rec, ttl)
redis.call('ZADD', index, at, id)
redis.call('ZREMRANGEBYSCORE', index, '-inf', at - forget)
local recorded = 0
if collision ~= '' and daemon ~= '' then
  if key_type(shared) ~= 'hash' and key_type(shared) ~= 'none' then redis.call('DEL', shared) end
  recorded = redis.call('HSETNX', shared, daemon, cjson.encode({line = collision, at = at, by = id}))
  if recorded == 1 then
    event(nil, '', '', '', 'daemon_collision', 'daemon=' .. daemon .. '; ' .. collision, 'process ' .. id, at)
  end
end
return {0, at, recorded}
