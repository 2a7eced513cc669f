--[[ heartbeat
Pool keys: none
KEYS[1]     job:<id>      KEYS[2] lease:<id>
ARGV[1] boot id   ARGV[2] attempt   ARGV[3] lease ms
Returns {0, pause_requested, cancel_requested}; -1 unknown id; -3 not the owner.
Renew a job's lease. Fenced on (owner boot, attempt): a watcher that no longer owns the
row (evicted, reconciled, finished) is refused and must stop without writing anything else.
]]
local jkey, lkey = KEYS[1], KEYS[2]
local f, detail = fence(jkey, ARGV[1], ARGV[2])
if f ~= 0 then return {f, detail} end
redis.call('SET', lkey, ARGV[1] .. ':' .. ARGV[2], 'PX', ARGV[3])
redis.call('HSET', jkey, 'heartbeat_at', now_ms())
local row = redis.call('HMGET', jkey, 'pause_requested', 'cancel_requested')
return {0, row[1], row[2]}
