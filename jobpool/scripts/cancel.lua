--[[ cancel
Pool keys: config paused queued running coalesce events rq_queue rq_queues paused_jobs succeeded failed cancelled metrics ready
           blocked passed wake fair limits limit_used holds seq waiting dependents deps running_by running_daemons running_on
Settings: default_slots events_maxlen reserve_after_ms retry_delay_max_ms
KEYS[1]     job:<id>      KEYS[2] lease:<id>
KEYS[3..]   promotion candidates
ARGV[1] id   ARGV[2] reason   ARGV[3] actor
Returns {0, state after (cancelled | running), promoted, why_stopped, owner boot, attempt}; -1; -2 when
        finished.
A queued, waiting, paused, or promoted-but-unclaimed job is cancelled at once (the jobs that wait for it
are then due: release_waiting.lua cancels them); a claimed running job
gets a persisted cancel request: its watcher stops the container, or, when its owner is gone, the
caller stops it by container label and crash recovery honours the request.
]]
local jkey, lkey = KEYS[1], KEYS[2]
local id, reason, actor = ARGV[1], ARGV[2], ARGV[3]
if redis.call('EXISTS', jkey) == 0 then return {E_NOT_FOUND, id} end
local row = redis.call('HMGET', jkey, 'state', 'owner_boot', 'attempt')
local state, now = row[1], now_ms()
if state == 'queued' or state == 'paused' or state == 'waiting' then
  drop_coalesce(jkey, id)
  set_state(jkey, id, state, 'cancelled', now)
  redis.call('HSET', jkey, 'finished_at', now, 'error_reason', 'cancelled')
  event(jkey, id, state, 'cancelled', 'cancel', reason, actor, now)
  -- A queued job that held the reservation gives it up: what was held back for it may start now.
  if redis.call('EXISTS', KEYS[K_WAKE]) == 1 then
    local promoted, why = promote_candidates(3, actor, now)
    return {0, 'cancelled', promoted, why, '', row[3]}
  end
  return {0, 'cancelled', 0, 'none', '', row[3]}
elseif state == 'running' and row[2] == '' then
  end_running(jkey, lkey, id, 'cancelled', 'cancel', reason, actor, now)
  local promoted, why = promote_candidates(3, actor, now)
  return {0, 'cancelled', promoted, why, '', row[3]}
elseif state == 'running' then
  redis.call('HSET', jkey, 'cancel_requested', '1')
  event(jkey, id, 'running', 'running', 'cancel_requested', reason, actor, now)
  return {0, 'running', 0, 'none', row[2], row[3]}
end
return {E_INVALID_STATE, state}
