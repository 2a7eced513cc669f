--[[ enqueue
Pool keys: config paused queued running coalesce events rq_queue rq_queues seq paused_jobs succeeded failed
           cancelled metrics ready blocked passed wake fair limits limit_used holds
Settings: default_slots events_maxlen reserve_after_ms
KEYS[1..]   promotion candidates: the new jobs' keys, two per job in input order: job:<id>, then
             rq:job:<id> (RQ's job hash, outside the hash tag: RQ's own key)
ARGV[1]      actor
ARGV[2..]    five per job, in the order of its keys: id, spec JSON, coalesce key ('' = none), image, and its
             order and limits ('' = priority 0, one slot, no group, no named limit; else
             'priority;slots;group;name=amount,name=amount...', from the spec: jobpool/store/calls.py)
Returns {0, created, promoted, why_stopped, now, then four per job in input order: coalesced 0|1, id, seq,
        state}: a job that coalesced names the queued job it equals (seq and state ''); a new job its own id,
        seq and state (queued, or running when promoted here). -5 when an id exists or repeats, -6 when
        ARGV and KEYS disagree or a job's order and limits do not read, -7 when a job needs more slots than
        the pool has, or more of a name than its limit (a limit of 0 holds every job, whatever it needs), or
        no limit covers a name it uses: all before anything is
        written. A pool with no limit stored yet gets the default (DEFAULT_SLOTS, _lib.lua).
why_stopped 'stale' means slots are free but the new jobs are not the head: the caller should run promote;
'full' when no slot is free (paused or not); 'none' when every job coalesced.
Create each job's row, or with a coalesce key find the queued job it equals (queued before this call, or
earlier in it: equal jobs in one call coalesce into the first), and pre-save its RQ job hash in the same
step: RQ's constant fields (RQ_JOB_FIELDS, generated from jobpool/rqjob.py) and the per-job ones, made here.
Then promote the new jobs, in order, while they are the head and a slot is free.
]]
local actor = ARGV[1]
local PER = 5
local njobs = (NARGV - 1) / PER
if njobs < 1 or njobs ~= math.floor(njobs) or NKEYS ~= 2 * njobs then
  return {E_BAD_ARG, 'jobs: ' .. NKEYS .. ' job keys for ' .. (NARGV - 1) .. ' job arguments'}
end
-- The limit, read once (max_slots in _lib.lua reads it the same way); a pool with none stored gets the default.
local stored = redis.call('HGET', KEYS[K_CONFIG], 'max_concurrent_jobs')
local max = tonumber(stored) or DEFAULT_SLOTS
-- A job's order and limits, read and checked before anything is written: {priority, slots, group, uses}
-- with each name's covering limit resolved (limit_for), or an error reply.
local function schedule_of(text)
  if text == '' then
    local s = {0, 1, '', {}}
    return s
  end
  local p, w, group, uses_text = string.match(text, '^(-?%d+);(%d+);([^;]*);(.*)$')
  p, w = tonumber(p), tonumber(w)
  if not p or p < -MAX_PRIORITY or p > MAX_PRIORITY or not w or w < 1 then
    return nil, {E_BAD_ARG, 'schedule'}
  end
  if max > 0 and w > max then  -- a limit of 0 holds every job: any weight waits then
    return nil, {E_BAD_SPEC, 'it needs ' .. w .. ' slots; the pool has ' .. max}
  end  -- 0 holds everything: any weight waits
  local uses = {}
  for name, amount in string.gmatch(uses_text, '([^=,]+)=(%d+)') do
    local limit = limit_for(name)
    if not limit then
      return nil, {E_BAD_SPEC, 'no limit covers ' .. name .. ' (jobpool limit ' .. name .. ' N sets one)'}
    end
    local size = tonumber(redis.call('HGET', KEYS[K_LIMITS], limit)) or 0
    if size > 0 and tonumber(amount) > size then  -- a limit of 0 holds every job: any amount waits then
      return nil, {E_BAD_SPEC, 'it needs ' .. amount .. ' of ' .. name .. '; its limit ' .. limit .. ' is ' .. size}
    end
    uses[#uses + 1] = {name, tonumber(amount), limit}
  end
  local s = {p, w, group, uses}
  return s
end
-- Every id is checked before anything is written: one that exists, or repeats in this call, refuses all.
-- Each job's coalescing is decided on the way: a job with a coalesce key returns the queued job holding it,
-- or the job earlier in this call that will (looked up in order: equal jobs in one call coalesce into the
-- first); any other job is new.
local seen, twins, mine, created, sched = {}, {}, {}, 0, {}
for i = 1, njobs do
  local id, ck = ARGV[PER * (i - 1) + 2], ARGV[PER * (i - 1) + 4]
  if seen[id] or redis.call('EXISTS', KEYS[2 * i - 1]) == 1 then return {E_EXISTS, id} end
  seen[id] = true
  local s, refused = schedule_of(ARGV[PER * (i - 1) + 6])
  if not s then return refused end
  sched[i] = s
  local twin = ck ~= '' and (mine[ck] or coalesce_holder(ck))
  if twin then
    twins[i] = twin
  else
    if ck ~= '' then mine[ck] = id end
    created = created + 1
  end
end
if not stored then  -- a new pool: its queued jobs are in `ready` from the start (promote_candidates)
  redis.call('HSET', KEYS[K_CONFIG], 'max_concurrent_jobs', DEFAULT_SLOTS, 'ready_kept', 1)
end
local now = now_ms()
local rq_created_at = iso_utc(now)
local origin = string.sub(KEYS[K_RQ_QUEUE], #RQ_QUEUE_KEY_PREFIX + 1)
local reply = {0, 0, 0, 'none', now}
local cands, first_id, turns = {}, nil, {}
-- The new jobs take the next `created` numbers of the counter, in order, and are counted once.
local seq = redis.call('INCRBY', KEYS[K_SEQ], created) - created
local start = seq  -- a priority nothing reached yet: its first turn is the first new job's seq (next_turn)
if created > 0 then count(transition_field('queued', 'enqueued'), created) end
for i = 1, njobs do
  local at = PER * (i - 1)
  local id, spec, ck, image = ARGV[at + 2], ARGV[at + 3], ARGV[at + 4], ARGV[at + 5]
  local jkey, rqkey = KEYS[2 * i - 1], KEYS[2 * i]
  if twins[i] then
    reply[#reply + 1], reply[#reply + 2], reply[#reply + 3], reply[#reply + 4] = 1, twins[i], '', ''
  else
    seq = seq + 1
    local s = sched[i]
    local order = -s[1] * ORDER_BAND + next_turn(turns, s[1], s[3], start)
    local line = stream_event(id, '', 'queued', 'enqueued', '', actor, now, true)
    -- Born queued, with its first history line: what set_state and event write, in one HSET.
    redis.call('HSET', jkey, 'id', id, 'spec', spec, 'state', 'queued', 'seq', seq, 'created_at', now,
      'attempt', 0, 'coalesce_key', ck, 'recovery_attempts', 0, 'pause_requested', '0',
      'cancel_requested', '0', 'owner_boot', '', 'exit_code', '', 'error_reason', '', 'history', line,
      'order', order)
    if s[1] ~= 0 or s[2] ~= 1 or s[3] ~= '' or #s[4] > 0 then
      redis.call('HSET', jkey, 'priority', s[1], 'slots', s[2], 'group', s[3], 'uses', format_uses(s[4]))
    end
    redis.call('ZADD', KEYS[K_QUEUED], order, id)
    redis.call('ZADD', KEYS[K_READY], order, id)
    -- No queued job holds this key (looked up above), so the entry becomes this job's alone.
    if ck ~= '' then set_coalesce_ids(ck, {id}) end
    redis.call('HSET', rqkey, 'created_at', rq_created_at, 'description', 'jobpool ' .. id .. ' (' .. image .. ')',
      'origin', origin, unpack(RQ_JOB_FIELDS))
    cands[#cands + 1], cands[#cands + 2], cands[#cands + 3] = jkey, rqkey, KEYS[K_RQ_QUEUE]
    first_id = first_id or id
    reply[#reply + 1], reply[#reply + 2], reply[#reply + 3], reply[#reply + 4] = 0, id, seq, 'queued'
  end
end
save_turns(turns)
if first_id then
  -- A full pool is the common case under a backlog: it is told with one call, head or not, paused or not.
  local promoted, why, started = 0, 'full', {}
  if slots_used() < max then
    if redis.call('ZRANGE', KEYS[K_READY], 0, 0)[1] == first_id then
      promoted, why = promote_candidates(1, actor, now, cands, started)
    elseif redis.call('EXISTS', KEYS[K_PAUSED]) == 1 then
      why = 'paused'
    else
      why = 'stale'
    end
  end
  -- The jobs promote_candidates started (it may park some, and go on past them).
  local running = {}
  for _, id in ipairs(started) do running[id] = true end
  for j = 6, #reply, 4 do
    if reply[j] == 0 and running[reply[j + 1]] then reply[j + 3] = 'running' end
  end
  reply[2], reply[3], reply[4] = #cands / 3, promoted, why
end
return reply
