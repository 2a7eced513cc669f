--[[ resume_queue
Pool keys: config paused queued running coalesce events rq_queue rq_queues paused_jobs succeeded failed cancelled metrics ready
           blocked passed wake fair limits limit_used holds seq waiting dependents deps running_by running_daemons running_on
Settings: default_slots events_maxlen reserve_after_ms
KEYS[1..]   promotion candidates
ARGV[1] actor
Returns {0, was paused 0|1, promoted, why_stopped}.
Let promotion run again, and promote at once.
]]
local now = now_ms()
local was = redis.call('DEL', KEYS[K_PAUSED])
if was == 1 then event(nil, '', '', '', 'queue_resumed', '', ARGV[1], now) end
local promoted, why = promote_candidates(1, ARGV[1], now)
return {0, was, promoted, why}
