--[[ set_slots
Pool keys: config paused queued running coalesce events rq_queue rq_queues paused_jobs succeeded failed cancelled metrics ready
           blocked passed wake fair limits limit_used holds seq waiting dependents deps running_by running_daemons running_on
Settings: default_slots events_maxlen reserve_after_ms
KEYS[1..]   promotion candidates
ARGV[1] new limit (integer 0..MAX_SLOTS)   ARGV[2] actor
Returns {0, old limit, promoted, why_stopped}; -6 when the limit is not a non-negative integer.
Change the fleet-wide limit. Lowering it never stops a running job: promotion simply
waits until running drops below the new limit. Raising it promotes at once.
]]
local n = tonumber(ARGV[1])
if not n or n < 0 or n > MAX_SLOTS or n ~= math.floor(n) then return {E_BAD_ARG, ARGV[1]} end
local old = max_slots()
local now = now_ms()
redis.call('HSET', KEYS[K_CONFIG], 'max_concurrent_jobs', n)
-- More slots: jobs parked for their weight may fit now.
if n > old and redis.call('EXISTS', KEYS[K_BLOCKED]) == 1 then redis.call('HSET', KEYS[K_WAKE], '#slots ', '') end
event(nil, '', '', '', 'slots_set', old .. '->' .. n, ARGV[2], now)
local promoted, why = promote_candidates(1, ARGV[2], now)
return {0, old, promoted, why}
