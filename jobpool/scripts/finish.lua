--[[ finish
Pool keys: config paused queued running coalesce events rq_queue rq_queues paused_jobs succeeded failed cancelled metrics ready
           blocked passed wake fair limits limit_used holds seq waiting dependents deps running_by running_daemons running_on
Settings: default_slots events_maxlen reserve_after_ms retry_delay_max_ms
KEYS[1]     job:<id>      KEYS[2] lease:<id>
KEYS[3..]   promotion candidates
ARGV[1] id   ARGV[2] boot   ARGV[3] attempt   ARGV[4] kind   ARGV[5] exit code ('' if none)
ARGV[6] reason (for 'error' and 'crashed')   ARGV[7] log tail   ARGV[8] recovery budget (for 'crashed')
ARGV[9] evidence: how the end was seen, in words ('' for none; recorded with the transition)
Returns {0, new state (waiting when a failure is retried: end_running), promoted, why_stopped}; -1; -3; -6 unknown kind, or 'crashed' or 'handback' without a
reason.
The owner reports how its attempt ended; release the slot and promote in the same step.
Fenced on (boot, attempt). kind:
  'exit'         the container exited with ARGV[5], by its own process
  'interrupted'  it exited after its watcher sent it the stop signal (for a drain, or for a pause or cancel
                 request); a non-zero exit with no persisted cancel/pause (e.g. a pause withdrawn by a
                 resume) hands the job back to its place without spending recovery budget
  'oom'          the kernel's OOM killer ended it (Docker's OOMKilled): a non-zero exit fails it
  'crashed'      its daemon or host ended it, not its own process (jobpool/exits.py): recovered as a
                 crash, with reason ARGV[6] and recovery budget ARGV[8]
  'error'        it never ran (launch failure): ends failed with ARGV[6]
  'handback'     it never ran because the worker's own host failed before anything of it was sent to run
                 (jobpool/workers/executors/base.py, HostFault): back to the queue at its place, reason
                 ARGV[6], no recovery budget spent, as a drain's handback; a persisted cancel or pause wins
The exit kinds are judged by verdict_for_exit in _lib.lua.
A job that ran on a daemon and comes back resumable from its own exit (handed back to `queued`, or `paused`)
gets an affinity to that daemon (note_affinity, _lib.lua): its checkpoint volume lives there, and its next
attempt is pushed on that daemon's queue until an operator releases it (resume_job.lua, ARGV[3] 'anywhere').
A crash leaves the affinity as it was (the daemon may be gone); a terminal state drops it (LIVE_ONLY).
The row keeps finished_by = '<boot>:<attempt>' and finished_as = the state it ended in, so a finish sent
again after its reply was lost gets the same answer instead of a refusal.
]]
local jkey, lkey = KEYS[1], KEYS[2]
local id, boot, attempt, kind, code, reason, tail = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
-- Callers that predate ARGV[8..9] send seven: read them only when sent (NARGV, _lib.lua).
local budget, seen = NARGV >= 8 and ARGV[8] or '0', NARGV >= 9 and ARGV[9] or ''
local EXIT_CAUSE = {exit = '', interrupted = '', oom = 'oom', crashed = 'crashed'}
local f, detail = fence(jkey, boot, attempt)
if f ~= 0 then
  -- The same finish sent again because its reply was lost: it landed, so answer as it did then. No one else
  -- writes finished_by for this boot and attempt, so this cannot take a finish that was not ours.
  if f == E_NOT_OWNER and redis.call('HGET', jkey, 'finished_by') == boot .. ':' .. attempt then
    return {0, redis.call('HGET', jkey, 'finished_as'), 0, 'none'}
  end
  return {f, detail}
end
local to, why, spend
if (kind == 'error' or kind == 'handback') and redis.call('HGET', jkey, 'cancel_requested') == '1' then
  to, why = 'cancelled', 'cancel_requested'  -- what the user asked for happened: nothing runs
elseif kind == 'error' then
  to, why = 'failed', reason
elseif kind == 'handback' and (reason or '') ~= '' then
  -- Nothing ran, so nothing of the job's own is judged: only what the user asked for, else its place back.
  if redis.call('HGET', jkey, 'pause_requested') == '1' then to, why = 'paused', 'pause_requested'
  else to, why = 'queued', reason end
elseif EXIT_CAUSE[kind] and tonumber(code) and not (kind == 'crashed' and (reason or '') == '') then
  to, why, spend = verdict_for_exit(jkey, tonumber(code), kind == 'interrupted', EXIT_CAUSE[kind], reason,
    budget)
else
  return {E_BAD_ARG, kind}
end
if spend then
  redis.call('HSET', jkey, 'recovery_attempts', whole(redis.call('HGET', jkey, 'recovery_attempts')) + 1)
  count('recoveries')
end
local now = now_ms()
local evidence = 'exit_code=' .. code
if kind == 'handback' then evidence = '' end  -- nothing ran: no exit to name
if seen and seen ~= '' then evidence = evidence == '' and seen or (evidence .. '; ' .. seen) end
redis.call('HSET', jkey, 'exit_code', code, 'log_tail', tail)
if kind == 'exit' or kind == 'interrupted' then note_affinity(jkey, to) end
to = end_running(jkey, lkey, id, to, why, evidence, boot, now)
redis.call('HSET', jkey, 'finished_by', boot .. ':' .. attempt, 'finished_as', to)
local promoted, stopped = promote_candidates(3, boot, now)
return {0, to, promoted, stopped}
