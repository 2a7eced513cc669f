--[[ resume_queue
KEYS[1..14]  common keys (see _lib.lua)
KEYS[15..]   promotion candidates
ARGV[1] actor
Returns {0, was paused 0|1, promoted, why_stopped}.
Let promotion run again, and promote at once.
]]
local now = now_ms()
local was = redis.call('DEL', KEYS[K_PAUSED])
if was == 1 then event(nil, '', '', '', 'queue_resumed', '', ARGV[1], now) end
local promoted, why = promote_candidates(15, ARGV[1], now)
return {0, was, promoted, why}
