--[[ resume_job
Pool keys: config paused queued running coalesce events rq_queue rq_queues paused_jobs succeeded failed cancelled metrics ready
           blocked passed wake fair limits limit_used holds seq waiting dependents deps running_by running_daemons running_on
Settings: default_slots events_maxlen reserve_after_ms
KEYS[1]     job:<id>
KEYS[2..]   promotion candidates
ARGV[1] id   ARGV[2] actor   ARGV[3] '1' = anywhere: release the job's daemon affinity (optional)
ARGV[4] (optional, with ARGV[3] '1') the affinity expected: release it only, and only if the row still names
        it; nothing else is resumed or withdrawn (the supervisor, for a daemon declared gone: sweep.py)
Returns {0, state after, promoted, why_stopped}; -1; -2 when there is nothing to resume; -4 'affinity' when the
row names another affinity than ARGV[4].
A paused job goes back to `queued` at its original place (one paused while it waited goes back to waiting
while it is still held, or is cancelled when a job it waited for failed meanwhile); a running job whose pause
was requested but has not ended yet has the request withdrawn. Its watcher may have sent the stop signal
already: it calls off its SIGKILL, and `pause_withdrawn` (= the attempt) lets the exit of a job that stops
anyway hand it back as 'pause_withdrawn_handback' (verdict_for_exit in _lib.lua) instead of failing it.
With 'anywhere', the row's `affinity` (the daemon holding its checkpoint, finish.lua) is dropped first, with
an 'affinity_released' event naming it, so its next attempt may run on any daemon (for a daemon gone for
good; its checkpoint is lost with it). A queued or running job with an affinity and nothing else to resume
has only that done; without an affinity or 'anywhere', such a job is -2 as before.
]]
local jkey = KEYS[1]
local id, actor = ARGV[1], ARGV[2]
local anywhere = NARGV >= 3 and ARGV[3] == '1'
if redis.call('EXISTS', jkey) == 0 then return {E_NOT_FOUND, id} end
local row = redis.call('HMGET', jkey, 'state', 'seq', 'pause_requested', 'attempt', 'affinity')
local now = now_ms()
local released = false
local expected = anywhere and NARGV >= 4 and ARGV[4] ~= '' and ARGV[4] or nil
if expected and row[5] ~= expected then return {E_CONFLICT, 'affinity'} end
if anywhere and row[5] and row[5] ~= '' and (row[1] == 'queued' or row[1] == 'running' or row[1] == 'paused') then
  redis.call('HDEL', jkey, 'affinity', 'affinity_queue')
  if row[1] == 'running' then place_running(jkey, id) end  -- no longer waiting for that daemon
  event(jkey, id, row[1], row[1], 'affinity_released', 'daemon=' .. row[5], actor, now)
  released = true
end
if expected then return {0, row[1], 0, 'none'} end
if row[1] == 'paused' then
  redis.call('HSET', jkey, 'pause_requested', '0', 'pause_reason', '')
  -- Back to its place in the queue, or to waiting while what it waited for still holds it (judge_hold).
  if judge_hold(jkey, id, 'paused', actor, now, 'resume') ~= 'queued' then
    return {0, redis.call('HGET', jkey, 'state'), 0, 'none'}
  end
  local promoted, why = promote_candidates(2, actor, now)
  return {0, redis.call('HGET', jkey, 'state'), promoted, why}
elseif row[1] == 'running' and row[3] == '1' then
  redis.call('HSET', jkey, 'pause_requested', '0', 'pause_reason', '', 'pause_withdrawn', row[4] or '')
  event(jkey, id, 'running', 'running', 'pause_withdrawn', '', actor, now)
  return {0, 'running', 0, 'none'}
elseif released then
  return {0, row[1], 0, 'none'}
end
return {E_INVALID_STATE, row[1]}
