--[[ daemon_mark_index
Pool keys: none
KEYS[2i-1]  daemon_mark:<process id>   KEYS[2i] daemon_marks_of:<daemon identity>, a pair per record
ARGV[2i-1]  process id   ARGV[2i] daemon identity (the record's `daemon_id` as the caller read it)
Returns {0, indexed} (the records indexed); -6 bad arguments.
Index records that do not index themselves (written by a release before the per-identity indexes, whose
daemon_mark.lua did not): the process holding the pool's turn (daemon_mark.lua's reply) reads every record of
`daemon_marks` that lacks `indexed` and passes them here. Each is entered in its identity's index scored by
when it expires, as daemon_mark.lua enters its own, if it still lacks `indexed` and still names that
identity (a compare-and-set on what the caller read); entries past their score are trimmed.
]]
if NKEYS ~= NARGV or NKEYS % 2 ~= 0 then return {E_BAD_ARG, 'pairs'} end
local now = now_ms()
local indexed = 0
for i = 1, NKEYS, 2 do
  local rec, of_daemon, id, daemon = KEYS[i], KEYS[i + 1], ARGV[i], ARGV[i + 1]
  local prefix = string.sub(rec, 1, -#('daemon_mark:' .. id) - 1)
  if id == '' or daemon == '' or rec ~= prefix .. 'daemon_mark:' .. id
      or of_daemon ~= prefix .. 'daemon_marks_of:' .. daemon then
    return {E_BAD_ARG, 'daemon mark index'}
  end
  local left = redis.call('PTTL', rec)
  if key_type(rec) == 'hash' and left > 0 and redis.call('HEXISTS', rec, 'indexed') == 0
      and redis.call('HGET', rec, 'daemon_id') == daemon then
    local kind = key_type(of_daemon)
    if kind ~= 'zset' and kind ~= 'none' then redis.call('DEL', of_daemon) end
    redis.call('ZADD', of_daemon, now + left, id)
    redis.call('ZREMRANGEBYSCORE', of_daemon, '-inf', now)
    redis.call('PEXPIREAT', of_daemon, tonumber(redis.call('ZRANGE', of_daemon, -1, -1, 'WITHSCORES')[2]))
    indexed = indexed + 1
  end
end
return {0, indexed}
