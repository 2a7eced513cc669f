--[[ heartbeat
KEYS[1..14]  common keys (see _lib.lua)
KEYS[15]     job:<id>      KEYS[16] lease:<id>
ARGV[1] boot id   ARGV[2] attempt   ARGV[3] lease ms
Returns {0, pause_requested, cancel_requested}; -1 unknown id; -3 not the owner.
Renew a job's lease. Fenced on (owner boot, attempt): a watcher that no longer owns the
row (evicted, reconciled, finished) is refused and must stop without writing anything else.
]]
local jkey, lkey = KEYS[15], KEYS[16]
local f = fence(jkey, ARGV[1], ARGV[2])
if f ~= 0 then return {f} end
redis.call('SET', lkey, ARGV[1] .. ':' .. ARGV[2], 'PX', ARGV[3])
redis.call('HSET', jkey, 'heartbeat_at', now_ms())
local row = redis.call('HMGET', jkey, 'pause_requested', 'cancel_requested')
return {0, row[1], row[2]}
