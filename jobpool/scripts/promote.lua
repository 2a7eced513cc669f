--[[ promote
KEYS[1..14]  common keys (see _lib.lua)
KEYS[15..]   promotion candidates: job:<id>, rq:job:<id> pairs for the head of `queued`
ARGV[1] actor
Returns {0, promoted, why_stopped} (paused | full | empty | stale | batch).
Move the oldest queued jobs to running while the queue is unpaused and slots are free.
The slot check and the flip to running are one step, so concurrent promoters never overshoot.
]]
local promoted, why = promote_candidates(15, ARGV[1], now_ms())
return {0, promoted, why}
