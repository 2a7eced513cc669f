--[[ drop_ghost
Pool keys: config paused queued running coalesce events rq_queue rq_queues paused_jobs succeeded failed cancelled metrics ready
           blocked passed wake fair limits limit_used holds seq waiting dependents deps running_by running_daemons running_on
Settings: default_slots events_maxlen reserve_after_ms
KEYS[1]     job:<id>      KEYS[2] lease:<id>
KEYS[3..]   promotion candidates
ARGV[1] id   ARGV[2] evidence   ARGV[3] actor
Returns {0, dropped 0|1, promoted, why_stopped}; -4 when the row is a hash again or a lease with a TTL
        exists (a worker may still hold the job: judge it again next sweep).
Free the slot of a running id that has no row: its key is missing or not a hash, so nothing can ever end
it and it would hold its slot for ever. The supervisor calls this only after a probe by label found no
container of the job; the id leaves `running`, its lease and any undelivered RQ entry go, and what it held
(its slots and named limit units: `holds`, kept apart from the row) is promoted at once; the jobs waiting for
it are due, to be cancelled. An id no longer in `running` is left alone (dropped 0).
]]
local jkey, lkey = KEYS[1], KEYS[2]
local id, evidence, actor = ARGV[1], ARGV[2], ARGV[3]
if key_type(jkey) == 'hash' then return {E_CONFLICT, 'row'} end
if not redis.call('ZSCORE', KEYS[K_RUNNING], id) then return {0, 0, 0, 'none'} end
if redis.call('PTTL', lkey) > 0 then return {E_CONFLICT, 'lease'} end
local now = now_ms()
release_hold(id)  -- first: a pool from before weights counts its slots in use from `running` (slots_used)
redis.call('ZREM', KEYS[K_RUNNING], id)
place_running(nil, id)  -- no row: what it was placed under is taken back
redis.call('DEL', lkey)
redis.call('LREM', KEYS[K_RQ_QUEUE], 0, id)
event(nil, id, 'running', '', 'dropped_ghost', evidence, actor, now)
-- It will never succeed: the jobs waiting for it are due now, and are cancelled.
tell_dependents(id, 'cancelled', now)
local promoted, why = promote_candidates(3, actor, now)
return {0, 1, promoted, why}
