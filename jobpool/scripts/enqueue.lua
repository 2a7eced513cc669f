--[[ enqueue
Pool keys: config paused queued running coalesce events rq_queue rq_queues seq paused_jobs succeeded failed cancelled metrics
Settings: default_slots events_maxlen
KEYS[1..]   promotion candidates: the new jobs' keys, two per job in input order: job:<id>, then
             rq:job:<id> (RQ's job hash, outside the hash tag: RQ's own key)
ARGV[1]      actor
ARGV[2..]    four per job, in the order of its keys: id, spec JSON, coalesce key ('' = none), image
Returns {0, created, promoted, why_stopped, now, then four per job in input order: coalesced 0|1, id, seq,
        state}: a job that coalesced names the queued job it equals (seq and state ''); a new job its own id,
        seq and state (queued, or running when promoted here). -5 when an id exists or repeats, -6 when
        ARGV and KEYS disagree: both before anything is written. A pool with no limit stored yet gets the
        default (DEFAULT_SLOTS, _lib.lua).
why_stopped 'stale' means slots are free but the new jobs are not the head: the caller should run promote;
'full' when no slot is free (paused or not); 'none' when every job coalesced.
Create each job's row, or with a coalesce key find the queued job it equals (queued before this call, or
earlier in it: equal jobs in one call coalesce into the first), and pre-save its RQ job hash in the same
step: RQ's constant fields (RQ_JOB_FIELDS, generated from jobpool/rqjob.py) and the per-job ones, made here.
Then promote the new jobs, in order, while they are the head and a slot is free.
]]
local actor = ARGV[1]
local njobs = (NARGV - 1) / 4
if njobs < 1 or njobs ~= math.floor(njobs) or NKEYS ~= 2 * njobs then
  return {E_BAD_ARG, 'jobs: ' .. NKEYS .. ' job keys for ' .. (NARGV - 1) .. ' job arguments'}
end
-- Every id is checked before anything is written: one that exists, or repeats in this call, refuses all.
-- Each job's coalescing is decided on the way: a job with a coalesce key returns the queued job holding it,
-- or the job earlier in this call that will (looked up in order: equal jobs in one call coalesce into the
-- first); any other job is new.
local seen, twins, mine, created = {}, {}, {}, 0
for i = 1, njobs do
  local id, ck = ARGV[4 * i - 2], ARGV[4 * i]
  if seen[id] or redis.call('EXISTS', KEYS[2 * i - 1]) == 1 then return {E_EXISTS, id} end
  seen[id] = true
  local twin = ck ~= '' and (mine[ck] or coalesce_holder(ck))
  if twin then
    twins[i] = twin
  else
    if ck ~= '' then mine[ck] = id end
    created = created + 1
  end
end
-- The limit, read once (max_slots in _lib.lua reads it the same way); a pool with none stored gets the default.
local stored = redis.call('HGET', KEYS[K_CONFIG], 'max_concurrent_jobs')
if not stored then redis.call('HSET', KEYS[K_CONFIG], 'max_concurrent_jobs', DEFAULT_SLOTS) end
local max = tonumber(stored) or DEFAULT_SLOTS
local now = now_ms()
local rq_created_at = iso_utc(now)
local origin = string.sub(KEYS[K_RQ_QUEUE], #RQ_QUEUE_KEY_PREFIX + 1)
local reply = {0, 0, 0, 'none', now}
local cands, first_id = {}, nil
-- The new jobs take the next `created` numbers of the counter, in order, and are counted once.
local seq = redis.call('INCRBY', KEYS[K_SEQ], created) - created
if created > 0 then count(transition_field('queued', 'enqueued'), created) end
for i = 1, njobs do
  local id, spec, ck, image = ARGV[4 * i - 2], ARGV[4 * i - 1], ARGV[4 * i], ARGV[4 * i + 1]
  local jkey, rqkey = KEYS[2 * i - 1], KEYS[2 * i]
  if twins[i] then
    reply[#reply + 1], reply[#reply + 2], reply[#reply + 3], reply[#reply + 4] = 1, twins[i], '', ''
  else
    seq = seq + 1
    local line = stream_event(id, '', 'queued', 'enqueued', '', actor, now, true)
    -- Born queued, with its first history line: what set_state and event write, in one HSET.
    redis.call('HSET', jkey, 'id', id, 'spec', spec, 'state', 'queued', 'seq', seq, 'created_at', now,
      'attempt', 0, 'coalesce_key', ck, 'recovery_attempts', 0, 'pause_requested', '0',
      'cancel_requested', '0', 'owner_boot', '', 'exit_code', '', 'error_reason', '', 'history', line)
    redis.call('ZADD', KEYS[K_QUEUED], seq, id)
    -- No queued job holds this key (looked up above), so the entry becomes this job's alone.
    if ck ~= '' then set_coalesce_ids(ck, {id}) end
    redis.call('HSET', rqkey, 'created_at', rq_created_at, 'description', 'jobpool ' .. id .. ' (' .. image .. ')',
      'origin', origin, unpack(RQ_JOB_FIELDS))
    cands[#cands + 1], cands[#cands + 2], cands[#cands + 3] = jkey, rqkey, KEYS[K_RQ_QUEUE]
    first_id = first_id or id
    reply[#reply + 1], reply[#reply + 2], reply[#reply + 3], reply[#reply + 4] = 0, id, seq, 'queued'
  end
end
if first_id then
  -- A full pool is the common case under a backlog: it is told with one call, head or not, paused or not.
  local promoted, why = 0, 'full'
  if redis.call('ZCARD', KEYS[K_RUNNING]) < max then
    if redis.call('ZRANGE', KEYS[K_QUEUED], 0, 0)[1] == first_id then
      promoted, why = promote_candidates(1, actor, now, cands)
    elseif redis.call('EXISTS', KEYS[K_PAUSED]) == 1 then
      why = 'paused'
    else
      why = 'stale'
    end
  end
  -- promote_candidates takes the candidates in order and stops at the first it cannot promote (a row made
  -- here is always promotable), so the jobs it promoted are the first `promoted` new ones.
  local left = promoted
  for j = 6, #reply, 4 do
    if left == 0 then break end
    if reply[j] == 0 then reply[j + 3], left = 'running', left - 1 end
  end
  reply[2], reply[3], reply[4] = #cands / 3, promoted, why
end
return reply
