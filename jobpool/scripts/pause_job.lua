--[[ pause_job
Pool keys: config paused queued running coalesce events rq_queue rq_queues paused_jobs succeeded failed cancelled metrics ready
           blocked passed wake fair limits limit_used holds seq waiting dependents deps running_by running_daemons running_on
Settings: default_slots events_maxlen reserve_after_ms retry_delay_max_ms
KEYS[1]     job:<id>      KEYS[2] lease:<id>
KEYS[3..]   promotion candidates
ARGV[1] id   ARGV[2] reason   ARGV[3] actor
Returns {0, state after (paused | running), promoted, why_stopped}; -1; -2 when paused or finished already.
A user's pause. A waiting job is paused and keeps what it waits for. A queued job (or a promoted one no worker has claimed yet) is paused at
once and keeps its place; a claimed running job gets a persisted pause request that its watcher acts on
(and that crash recovery honours), so the request survives the worker dying first.
]]
local jkey, lkey = KEYS[1], KEYS[2]
local id, reason, actor = ARGV[1], ARGV[2], ARGV[3]
if redis.call('EXISTS', jkey) == 0 then return {E_NOT_FOUND, id} end
local row = redis.call('HMGET', jkey, 'state', 'owner_boot', 'seq')
local state, now = row[1], now_ms()
if state == 'queued' then
  drop_coalesce(jkey, id)
  set_state(jkey, id, 'queued', 'paused', tonumber(row[3]))
  redis.call('HSET', jkey, 'paused_at', now, 'pause_reason', reason)
  event(jkey, id, 'queued', 'paused', 'pause', reason, actor, now)
  -- A queued job that held the reservation gives it up: what was held back for it may start now.
  if redis.call('EXISTS', KEYS[K_WAKE]) == 1 then
    local promoted, why = promote_candidates(3, actor, now)
    return {0, 'paused', promoted, why}
  end
  return {0, 'paused', 0, 'none'}
elseif state == 'waiting' then
  -- Keeps what it waits for: its resume judges it again (judge_hold).
  set_state(jkey, id, 'waiting', 'paused', tonumber(row[3]))
  redis.call('HSET', jkey, 'paused_at', now, 'pause_reason', reason)
  event(jkey, id, 'waiting', 'paused', 'pause', reason, actor, now)
  return {0, 'paused', 0, 'none'}
elseif state == 'running' and row[2] == '' then
  redis.call('HSET', jkey, 'pause_reason', reason)
  end_running(jkey, lkey, id, 'paused', 'pause', reason, actor, now)
  local promoted, why = promote_candidates(3, actor, now)
  return {0, 'paused', promoted, why}
elseif state == 'running' then
  redis.call('HSET', jkey, 'pause_requested', '1', 'pause_reason', reason)
  event(jkey, id, 'running', 'running', 'pause_requested', reason, actor, now)
  return {0, 'running', 0, 'none'}
end
return {E_INVALID_STATE, state}
