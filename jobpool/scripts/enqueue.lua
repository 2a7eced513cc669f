--[[ enqueue
KEYS[1..14]  common keys (see _lib.lua)
KEYS[15]     job:<id>
KEYS[16]     rq:job:<id>   RQ's job hash (outside the hash tag: RQ's own key)
ARGV[1] id   ARGV[2] spec JSON   ARGV[3] coalesce key ('' = none)   ARGV[4] actor
ARGV[5..]    RQ job hash field/value pairs (status 'created'; promote flips it to 'queued')
Returns {0, id, promoted, why_stopped, coalesced 0|1, state, seq, created_at, attempt, promoted_at};
        -5 when the id exists. A pool with no limit stored yet gets the default (DEFAULT_SLOTS, _lib.lua).
why_stopped 'stale' means slots are free but this job is not the head: the caller should run promote.
Create a job row (or return the queued job with the same coalesce key), pre-save its RQ
job hash in the same step, and promote it at once if it is the head and a slot is free.
]]
local jkey, rqkey = KEYS[15], KEYS[16]
local id, spec, ck, actor = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if ck ~= '' then
  local existing = redis.call('HGET', KEYS[K_COALESCE], ck)
  if existing and redis.call('ZSCORE', KEYS[K_QUEUED], existing) then
    return {0, existing, 0, 'coalesced', 1}
  end
end
if redis.call('EXISTS', jkey) == 1 then return {E_EXISTS, id} end
redis.call('HSETNX', KEYS[K_CONFIG], 'max_concurrent_jobs', DEFAULT_SLOTS)
local now = now_ms()
local seq = redis.call('INCR', KEYS[K_SEQ])
redis.call('HSET', jkey, 'id', id, 'spec', spec, 'seq', seq, 'created_at', now, 'attempt', 0,
  'coalesce_key', ck, 'recovery_attempts', 0, 'pause_requested', '0', 'cancel_requested', '0',
  'owner_boot', '', 'exit_code', '', 'error_reason', '')
set_state(jkey, id, '', 'queued', seq)
add_coalesce(jkey, id)
local rq = {}
for i = 5, NARGV do rq[#rq + 1] = ARGV[i] end
if #rq > 0 then redis.call('HSET', rqkey, unpack(rq)) end
event(jkey, id, '', 'queued', 'enqueued', '', actor, now)
-- Only this job can be a candidate here; when it is not the head, tell the caller whether to promote.
local promoted, why = 0, 'full'
if redis.call('ZRANGE', KEYS[K_QUEUED], 0, 0)[1] == id then
  promoted, why = promote_candidates(15, actor, now)
elseif redis.call('EXISTS', KEYS[K_PAUSED]) == 1 then
  why = 'paused'
elseif redis.call('ZCARD', KEYS[K_RUNNING]) < max_slots() then
  why = 'stale'
end
-- Only what this script set: the caller already holds the spec, so no row is read back.
local row = redis.call('HMGET', jkey, 'state', 'seq', 'attempt', 'promoted_at')
return {0, id, promoted, why, 0, row[1], row[2], now, row[3], row[4] or ''}
