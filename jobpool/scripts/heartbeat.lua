--[[ heartbeat
Pool keys: none
KEYS[1]     job:<id>      KEYS[2] lease:<id>      KEYS[3] logwatch:<id> (optional)
ARGV[1] boot id   ARGV[2] attempt   ARGV[3] lease ms
Returns {0, pause_requested, cancel_requested, followed}; -1 unknown id; -3 not the owner.
Renew a job's lease. Fenced on (owner boot, attempt): a watcher that no longer owns the
row (evicted, reconciled, finished) is refused and must stop without writing anything else.
`followed` is 1 while someone follows the job's live log (its readers keep `logwatch:<id>`):
the watcher then sends it every second instead of every LIVE_LOG_IDLE_SECS (workers/livelog.py).
]]
local jkey, lkey = KEYS[1], KEYS[2]
local f, detail = fence(jkey, ARGV[1], ARGV[2])
if f ~= 0 then return {f, detail} end
redis.call('SET', lkey, ARGV[1] .. ':' .. ARGV[2], 'PX', ARGV[3])
redis.call('HSET', jkey, 'heartbeat_at', now_ms())
local row = redis.call('HMGET', jkey, 'pause_requested', 'cancel_requested')
local followed = KEYS[3] and redis.call('EXISTS', KEYS[3]) or 0
return {0, row[1], row[2], followed}
