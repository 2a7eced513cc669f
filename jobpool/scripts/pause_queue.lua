--[[ pause_queue
Pool keys: paused events metrics
Settings: events_maxlen
KEYS        none of its own: its pool keys only
ARGV[1] by   ARGV[2] reason
Returns {0, 1 if newly paused else 0}.
Hold promotion (reconciling goes on). Idempotent; the first pause's record is kept.
]]
if redis.call('EXISTS', KEYS[K_PAUSED]) == 1 then return {0, 0} end
local now = now_ms()
redis.call('HSET', KEYS[K_PAUSED], 'by', ARGV[1], 'reason', ARGV[2], 'since', now)
event(nil, '', '', '', 'queue_paused', ARGV[2], ARGV[1], now)
return {0, 1}
