--[[ release_waiting
Pool keys: config queued running coalesce events paused_jobs succeeded failed cancelled metrics ready blocked passed wake fair
           limits limit_used waiting dependents deps seq
Settings: events_maxlen reserve_after_ms
KEYS[1..]   job:<id> of each job to look at (the due head of `waiting`, read by the caller just before)
ARGV[1] actor   ARGV[2..] their ids, in the order of their keys
Returns {0, queued, cancelled, still waiting}; -6 when the keys are not the ids' rows.
The waiting jobs that are due (their time came, or a job they wait for ended): each is judged again here
(judge_hold, _lib.lua): queued at a new turn when nothing holds it any more, cancelled when a job it waited
for failed or was cancelled (its own dependents are then due: the next call cancels them, one link per
step), or left waiting, scored by when to look again. A job no longer in `waiting` (released by another
supervisor, paused, cancelled) is left alone, so a stale read or a call sent twice changes nothing twice. A
row that is gone or says another state leaves the index; when it is gone, the jobs waiting for it are cancelled in turn
(what it waited for is on its row: its own entries in `dependents` stay, so those jobs are kept from
retention). The caller promotes afterwards (Store.promote_all).
]]
local actor = ARGV[1]
if NARGV - 1 ~= NKEYS then return {E_BAD_ARG, 'keys'} end
local now = now_ms()
local counts = {queued = 0, cancelled = 0, waiting = 0}
for i = 1, NKEYS do  -- every key checked before the first job is judged: a refusal writes nothing
  if not is_row_key(KEYS[i], ARGV[1 + i]) then return {E_BAD_ARG, 'keys of ' .. ARGV[1 + i]} end
end
for i = 1, NKEYS do
  local id, jkey = ARGV[1 + i], KEYS[i]
  if redis.call('ZSCORE', KEYS[K_WAITING], id) then
    if key_type(jkey) ~= 'hash' or redis.call('HGET', jkey, 'state') ~= 'waiting' then
      redis.call('ZREM', KEYS[K_WAITING], id)
      event(nil, id, 'waiting', '', 'dropped_corrupt_row', 'its row is gone or not waiting', actor, now)
      -- A row that is gone (or is not a row at all) will never succeed: those waiting for it are cancelled.
      -- One in another state is still that job, which may.
      if key_type(jkey) ~= 'hash' then tell_dependents(id, 'cancelled', now) end
    else
      local to = judge_hold(jkey, id, 'waiting', actor, now, 'wait_over')
      counts[to] = counts[to] + 1
    end
  end
end
return {0, counts.queued, counts.cancelled, counts.waiting}
