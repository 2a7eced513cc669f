--[[ promote
Pool keys: config paused queued running coalesce events rq_queue rq_queues paused_jobs succeeded failed cancelled metrics ready
           blocked passed wake fair limits limit_used holds seq waiting dependents deps running_by running_daemons running_on
Settings: default_slots events_maxlen reserve_after_ms
KEYS[1..]   promotion candidates: job:<id>, rq:job:<id> pairs for the head of `queued`
ARGV[1] actor
Returns {0, '', promoted, why_stopped} (paused | full | empty | stale | batch): a slot-freeing script's
shape (_lib.lua), with no result of its own.
Move the oldest queued jobs to running while the queue is unpaused and slots are free.
The slot check and the flip to running are one step, so concurrent promoters never overshoot.
]]
local promoted, why = promote_candidates(1, ARGV[1], now_ms())
return {0, '', promoted, why}
