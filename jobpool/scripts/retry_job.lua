--[[ retry_job
Pool keys: config queued running coalesce events paused_jobs succeeded failed cancelled metrics ready blocked passed
           wake fair limits limit_used waiting dependents deps seq
Settings: events_maxlen reserve_after_ms
KEYS[1]     job:<id>
ARGV[1] id   ARGV[2] actor
Returns {0, state after (queued | waiting)}; -1; -2 unless failed or cancelled; -7 when a job it waits for
(`after`) failed, was cancelled or is gone: retry that one first.
An operator's retry: a failed or cancelled job goes again as a new attempt, its history kept, with its
retries and recovery budget whole again. A job that waits for others waits for those not yet succeeded again
(each must still exist and not have failed; a job that ran waits for none again, its dependencies having
succeeded), and for its start time (`not_before`) if that is still to
come; one with nothing left to wait for takes a new turn in the queue. RQ's record of the job, deleted when it ended
(jobpool/rqjob.py), is made again when it is promoted (rq_record, _lib.lua).
The caller promotes afterwards.
]]
local jkey = KEYS[1]
local id, actor = ARGV[1], ARGV[2]
if redis.call('EXISTS', jkey) == 0 then return {E_NOT_FOUND, id} end
local row = redis.call('HMGET', jkey, 'state', 'after', 'attempt')
local state = row[1]
if state ~= 'failed' and state ~= 'cancelled' then return {E_INVALID_STATE, state} end
-- A job that ran (an attempt claimed) was released once every job it waits for had succeeded, and a success
-- is for good: those may since have been pruned by retention, and it waits for none of them again.
local ran = (tonumber(row[3]) or 0) > 0
local live = {}
for dep in string.gmatch(ran and '' or (row[2] or ''), '%S+') do
  if not redis.call('ZSCORE', KEYS[K_SUCCEEDED], dep) then
    if redis.call('ZSCORE', KEYS[K_FAILED], dep) or redis.call('ZSCORE', KEYS[K_CANCELLED], dep) then
      return {E_BAD_SPEC, 'job ' .. dep .. ', which it waits for, ended ' ..
        (redis.call('ZSCORE', KEYS[K_FAILED], dep) and 'failed' or 'cancelled') .. ': retry that one first'}
    end
    local found = false
    for _, s in ipairs({'queued', 'waiting', 'running', 'paused'}) do
      if redis.call('ZSCORE', KEYS[STATE_INDEX[s]], dep) then found = true end
    end
    if not found then return {E_BAD_SPEC, 'job ' .. dep .. ', which it waits for, is gone'} end
    live[#live + 1] = dep
  end
end
local now = now_ms()
for _, dep in ipairs(live) do redis.call('ZADD', KEYS[K_DEPENDENTS], 0, dep .. ' ' .. id) end
if #live > 0 then redis.call('HSET', KEYS[K_DEPS], id, #live) end
redis.call('HDEL', jkey, 'finished_at', 'finished_by', 'finished_as', 'exit_code', 'order', 'timed_out',
  'wait_until', 'wait_reason')
-- A start time still to come stays: a delayed job cancelled before it and retried waits for it again.
local not_before = tonumber(redis.call('HGET', jkey, 'not_before'))
if not_before and not_before > now then
  redis.call('HSET', jkey, 'wait_until', not_before, 'wait_reason', 'not_before')
end
redis.call('HSET', jkey, 'retries_used', 0, 'recovery_attempts', 0, 'error_reason', '', 'pause_requested', '0',
  'cancel_requested', '0', 'owner_boot', '')
return {0, judge_hold(jkey, id, state, actor, now, 'retried')}
