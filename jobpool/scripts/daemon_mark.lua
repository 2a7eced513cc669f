--[[ daemon_mark
KEYS[1..14]  common keys (see _lib.lua)
KEYS[15]     daemon_mark:<process id>   KEYS[16] daemon_marks
ARGV[1] process id   ARGV[2] record ttl ms   ARGV[3] forget ms (index entries older than this are trimmed)
ARGV[4..NARGV] field, value, field, value, ... (jobpool/daemonmark.py FIELDS)
Returns {0, at} (ms, the server's time); -6 bad arguments.
Register (or refresh) one process that marked its Docker daemon (jobpool/daemonmark.py): its record, written
whole, lives ARGV[2] ms unless refreshed, so a process that dies drops out on its own; the index says when
each was last refreshed, for the readers (every process comparing marks, `status`).
]]
local rec, index = KEYS[15], KEYS[16]
local id, ttl, forget = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if id == '' or not ttl or ttl <= 0 or ttl ~= math.floor(ttl) or not forget or (NARGV - 3) % 2 ~= 0 then
  return {E_BAD_ARG, 'daemon mark'}
end
local at = now_ms()
redis.call('DEL', rec)
local fields = {'at', at}
for i = 4, NARGV, 2 do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
end
redis.call('HSET', rec, unpack(fields))
redis.call('PEXPIRE', rec, ttl)
redis.call('ZADD', index, at, id)
redis.call('ZREMRANGEBYSCORE', index, '-inf', at - forget)
return {0, at}
