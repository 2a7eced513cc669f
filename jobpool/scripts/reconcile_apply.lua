--[[ reconcile_apply
Pool keys: config paused queued running coalesce events rq_queue rq_queues paused_jobs succeeded failed cancelled metrics ready
           blocked passed wake fair limits limit_used holds seq waiting dependents deps running_by running_daemons running_on
Settings: default_slots events_maxlen reserve_after_ms retry_delay_max_ms
KEYS[1]     job:<id>      KEYS[2] lease:<id>      KEYS[3] rq:job:<id>
KEYS[4]     only when ARGV[11] is given: inventory:<daemon id>, the inventory the evidence came from;
             for 'redispatch' (which promotes nothing, so takes no candidates): the RQ list the row routes to,
             its `affinity_queue` (the daemon holding its checkpoint) or else the pool's queue; -4 'route' if not
KEYS[5..]   promotion candidates (from KEYS[4] when ARGV[11] is not given)
ARGV[1] id   ARGV[2] expected attempt   ARGV[3] expected owner ('' = unclaimed)
ARGV[4] expected container id   ARGV[5] verdict   ARGV[6] reason   ARGV[7] exit code
ARGV[8] recovery budget   ARGV[9] evidence   ARGV[10] actor
ARGV[11] (optional) the `at` of the daemon inventory the evidence came from (jobpool/supervisor/remote.py)
ARGV[12] (with ARGV[11]) the most an inventory may have aged, in ms (JOBPOOL_INVENTORY_STALE_SECS)
Returns {0, state after, promoted, why_stopped}; -1; -4 the row, its lease or the inventory changed; -6 unknown
verdict, an exit verdict without a code, or 'crashed' without a reason.
Evidence read from a daemon's inventory (a daemon the supervisor cannot ask) is fenced too: the inventory in
KEYS[4] must still be the very one judged (same `at`) and still fresh by the server's clock.
Apply a supervisor verdict, only if the row is exactly as it was when the evidence
was taken (state running, same attempt, same owner, same container) and the owner's lease is still gone:
judged by its value, as the sweep judged it, so a lease key holding anything but '<owner>:<attempt>' is gone.
Verdicts:
  exited      the container exited with ARGV[7]: ends as a finish would (exit 0 -> succeeded; persisted
              cancel/pause win; exit EXIT_TEMPFAIL -> queued, no budget spent; else failed)
  oom         the container exited with ARGV[7] and the kernel's OOM killer had ended it: as 'exited', but a
              non-zero exit fails with REASON_OOM_KILLED, even an EXIT_TEMPFAIL one
  crashed     the container exited with ARGV[7] because its daemon or host ended it (jobpool/exits.py):
              as 'exited', but a non-zero exit is recovered as 'absent' is, with reason ARGV[6]
The exit verdicts are judged by verdict_for_exit in _lib.lua, as a worker's finish is.
  absent      no container / dead process: persisted cancel -> cancelled; persisted pause -> paused;
              recovery budget ARGV[8] left -> queued (recovery_attempts + 1, original place); else failed
              with reason ARGV[6]
  redispatch  promoted but never claimed and lost from RQ: push again with a new attempt, slot kept, on the
              list its row routes it to (KEYS[4]; RQ's origin set to it, as promote_candidates does); RQ's
              record is written whole again if it lost its fields (rq_record, _lib.lua)
]]
local jkey, lkey, rqkey = KEYS[1], KEYS[2], KEYS[3]
local id, attempt, owner, cid = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local verdict, reason, code, budget, evidence, actor = ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8]), ARGV[9], ARGV[10]
if redis.call('EXISTS', jkey) == 0 then return {E_NOT_FOUND, id} end
local row = redis.call('HMGET', jkey, 'state', 'attempt', 'owner_boot', 'container_id', 'recovery_attempts')
if row[1] ~= 'running' or row[2] ~= attempt or row[3] ~= owner or row[4] ~= cid then
  return {E_CONFLICT, row[1]}
end
if owner ~= '' and key_type(lkey) == 'string' and redis.call('GET', lkey) == owner .. ':' .. attempt then
  return {E_CONFLICT, 'lease'}
end
local now = now_ms()
local first_candidate = 4
if NARGV >= 12 and ARGV[11] ~= '' then
  local ikey = KEYS[4]
  first_candidate = 5
  local at = key_type(ikey) == 'hash' and redis.call('HGET', ikey, 'at') or false
  if at ~= ARGV[11] or now - (tonumber(at) or 0) > (tonumber(ARGV[12]) or 0) then
    return {E_CONFLICT, 'inventory'}
  end
end
local to
local EXIT_CAUSE = {exited = '', oom = 'oom', crashed = 'crashed'}
if EXIT_CAUSE[verdict] and tonumber(code) and not (verdict == 'crashed' and (reason or '') == '') then
  local why, spend
  -- EXIT_TEMPFAIL is the container saying "interrupted at a boundary, resumable": hand it back.
  to, why, spend = verdict_for_exit(jkey, tonumber(code), tonumber(code) == EXIT_TEMPFAIL, EXIT_CAUSE[verdict],
    reason, budget)
  if spend then
    redis.call('HSET', jkey, 'recovery_attempts', whole(row[5]) + 1)
    count('recoveries')
  end
  redis.call('HSET', jkey, 'exit_code', code)
  if verdict == 'exited' then note_affinity(jkey, to) end  -- its own exit: its checkpoint is on its daemon
  to = end_running(jkey, lkey, id, to, why, evidence, actor, now)
elseif verdict == 'absent' then
  if redis.call('HGET', jkey, 'cancel_requested') == '1' then
    to, reason = 'cancelled', 'cancel_requested'
  elseif redis.call('HGET', jkey, 'pause_requested') == '1' then
    to, reason = 'paused', 'pause_requested'
  elseif whole(row[5]) < (budget or 0) then
    to = 'queued'
    redis.call('HSET', jkey, 'recovery_attempts', whole(row[5]) + 1)
    count('recoveries')
  else
    to = 'failed'
  end
  end_running(jkey, lkey, id, to, reason, evidence, actor, now, true)  -- a crash is never retried
elseif verdict == 'redispatch' and owner == '' then
  local route = redis.call('HGET', jkey, 'affinity_queue')
  if not route or route == '' then route = KEYS[K_RQ_QUEUE] end
  if KEYS[4] ~= route then return {E_CONFLICT, 'route'} end
  local rq_list = KEYS[4]
  local next_attempt = whole(row[2]) + 1
  redis.call('HSET', jkey, 'attempt', next_attempt, 'promoted_at', now)
  redis.call('ZADD', KEYS[K_RUNNING], now, id)
  rq_record(jkey, rqkey, id, next_attempt, rq_list, now)
  redis.call('LREM', rq_list, 0, id)
  redis.call('RPUSH', rq_list, id)
  redis.call('SADD', KEYS[K_RQ_QUEUES], rq_list)
  event(jkey, id, 'running', 'running', 'redispatched', evidence, actor, now)
  return {0, 'running', 0, 'none'}
else
  return {E_BAD_ARG, verdict}
end
local promoted, why = promote_candidates(first_candidate, actor, now)
return {0, to, promoted, why}
