--[[ evict
Pool keys: config paused queued running coalesce events rq_queue rq_queues paused_jobs succeeded failed cancelled metrics ready
           blocked passed wake fair limits limit_used holds seq waiting dependents deps running_by running_daemons running_on
Settings: default_slots events_maxlen reserve_after_ms retry_delay_max_ms
KEYS[1]     job:<id>      KEYS[2] lease:<id>
KEYS[3..]   promotion candidates
ARGV[1] id   ARGV[2] expected attempt   ARGV[3] reason   ARGV[4] evidence   ARGV[5] actor
ARGV[6] expected daemon id (optional; '' = any): the daemon whose containers of the attempt were stopped
Returns {0, 'failed', promoted, why_stopped}; -1; -2 not running; -4 the attempt (or its daemon) changed.
An operator frees the slot of a running job (after its container was stopped by label).
Compare-and-set on the attempt the operator looked at, and on the daemon the stop was done on when given (a
routed eviction, jobpool/daemoncommands.py: after a Redis rollback the same attempt number may run elsewhere, and a
stop on the old daemon proves nothing there); the old owner's next fenced write is refused.
]]
local jkey, lkey = KEYS[1], KEYS[2]
local id, attempt, reason, evidence, actor = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local daemon = NARGV >= 6 and ARGV[6] or ''
if redis.call('EXISTS', jkey) == 0 then return {E_NOT_FOUND, id} end
local row = redis.call('HMGET', jkey, 'state', 'attempt', 'daemon_id')
if row[1] ~= 'running' then return {E_INVALID_STATE, row[1]} end
if row[2] ~= attempt then return {E_CONFLICT, row[2]} end
if daemon ~= '' and row[3] ~= daemon then return {E_CONFLICT, 'daemon ' .. tostring(row[3] or '')} end
local now = now_ms()
end_running(jkey, lkey, id, 'failed', reason, evidence, actor, now, true)  -- an eviction is never retried
local promoted, why = promote_candidates(3, actor, now)
return {0, 'failed', promoted, why}
