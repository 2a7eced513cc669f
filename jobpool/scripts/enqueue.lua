--[[ enqueue
KEYS[1..]   promotion candidates: the new jobs' keys, two per job in input order: job:<id>, then
             rq:job:<id> (RQ's job hash, outside the hash tag: RQ's own key; written if promoted here)
ARGV[1]      actor
ARGV[2]      a schedule's fire ('' = none; then exactly one job): 'name|tick ms|next tick ms' (below)
ARGV[3..]    six per job, in the order of its keys: id, spec JSON, coalesce key ('' = none), its order
             and limits ('' = priority 0, one slot, no group, no named limit; else
             'priority;slots;group;name=amount,name=amount...', from the spec: jobpool/store/calls.py), what it
             waits for ('' = nothing; else 'not before ms;id id ...': the jobs it waits for, existing ones or
             earlier ones of this call), and its retries ('' = none; else 'retries;first delay ms;code,...')
Pool keys: config paused queued running coalesce events rq_queue rq_queues seq paused_jobs succeeded failed cancelled metrics
           ready blocked passed wake fair limits limit_used holds waiting dependents deps schedules schedule_ticks schedule_next
           running_by running_daemons running_on
Settings: default_slots events_maxlen reserve_after_ms
Returns {0, created, promoted, why_stopped, now, then four per job in input order: coalesced 0|1, id, seq,
        state}: a job that coalesced names the queued job it equals (seq and state ''); a new job its own id,
        seq and state (queued, waiting, or running when promoted here). -5 when an id exists or repeats, -6 when
        ARGV and KEYS disagree or a job's order and limits do not read, -7 when a job needs more slots than
        the pool has, or more of a name than its limit (a limit of 0 holds every job, whatever it needs), or
        no limit covers a name it uses, or it waits for a job that does not exist: all before anything is
        written. A pool with no limit stored yet gets the default (DEFAULT_SLOTS, _lib.lua).
why_stopped 'stale' means slots are free but the new jobs are not the head: the caller should run promote;
'full' when no slot is free (paused or not); 'none' when every job coalesced or waits.
Create each job's row, or with a coalesce key find the queued job it equals (queued before this call, or
earlier in it: equal jobs in one call coalesce into the first). RQ's job hash is not written here: a job's
first promotion writes it (rq_record, _lib.lua), so a queued job costs Redis only its row and its places.
A job with a start time still to come, or jobs to wait for that have not succeeded yet, is born `waiting`
(_lib.lua "Time and dependencies"): no turn in the queue yet. One that waits for a job that failed or was
cancelled is born waiting and due at once: the release step cancels it, as it would
have had that job ended after it (REASON_DEPENDENCY_FAILED). Then promote the new jobs, in order, while they are the head and a slot
is free.
A schedule's fire (jobpool/schedules.py) is this call with one job and ARGV[2]: it fires only if `tick` is
after the schedule's last tick (`schedule_ticks`), so each tick makes one job however many supervisors try
it (-5 'tick' for one fired already; -1 for a schedule that is gone, -2 for a paused one); with overlap
'skip' (its definition's) a tick whose last job still waits or runs makes none and is recorded as skipped
(reply why_stopped 'skipped', no job). Either way the tick is recorded and the schedule's next is `next`.
The job's row names its schedule and tick.
]]
local actor, guard = ARGV[1], ARGV[2]
local PER, FIRST = 6, 3
local njobs = (NARGV - 2) / PER
if njobs < 1 or njobs ~= math.floor(njobs) or NKEYS ~= 2 * njobs then
  return {E_BAD_ARG, 'jobs: ' .. NKEYS .. ' job keys for ' .. (NARGV - 2) .. ' job arguments'}
end
-- A schedule's fire: judged first, since a tick fired already writes nothing.
local fire
if guard ~= '' then
  local name, tick, later = string.match(guard, '^(.+)|(%d+)|(%d+)$')
  if not name or njobs ~= 1 then return {E_BAD_ARG, 'schedule fire'} end
  local def = redis.call('HGET', KEYS[K_SCHEDULES], name)
  if not def then return {E_NOT_FOUND, 'schedule ' .. name} end
  local last = redis.call('HGET', KEYS[K_SCHEDULE_TICKS], name) or ''
  if (tonumber(string.match(last, '^(%d+)|')) or -1) >= tonumber(tick) then return {E_EXISTS, 'tick'} end
  local ok, d = pcall(cjson.decode, def)
  if not ok or type(d) ~= 'table' then d = {} end
  if d.paused then return {E_INVALID_STATE, 'paused'} end
  fire = {name = name, tick = tick, later = later}
  local last_job = string.match(last, '^%d+|([^|]*)|') or ''
  if d.overlap ~= 'queue' and last_job ~= '' then
    for _, s in ipairs({'queued', 'waiting', 'running', 'paused'}) do
      if redis.call('ZSCORE', KEYS[STATE_INDEX[s]], last_job) then
        local now = now_ms()
        redis.call('HSET', KEYS[K_SCHEDULE_TICKS], name, tick .. '|' .. last_job .. '|' .. now)
        redis.call('ZADD', KEYS[K_SCHEDULE_NEXT], later, name)
        event(nil, last_job, '', '', 'schedule_skipped', 'schedule ' .. name .. ' tick ' .. iso_utc(tonumber(tick))
          .. ': its last job is ' .. s, actor, now)
        return {0, 0, 0, 'skipped', now}
      end
    end
  end
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
-- What a job waits for, read and checked before anything is written: {not before ms, its jobs (each once;
-- one of this call that coalesced named by the job it equals), those not ended yet, the first that failed or was cancelled}, or nil for nothing; an error
-- reply for a job that does not exist. `seen` maps the ids of this call's earlier jobs to the job each is
-- (its own, or the queued job it coalesced into).
local function holds_of(text, seen)
  if text == '' then return nil end
  local nb, ids = string.match(text, '^(%d*);(.*)$')
  if not nb then return nil, {E_BAD_ARG, 'after'} end
  local h = {tonumber(nb) or 0, {}, {}, nil}
  local named = {}
  for given in string.gmatch(ids, '%S+') do
    local dep = seen[given] or given  -- an earlier job of this call that coalesced: the job it equals
    if not named[dep] then
      named[dep] = true
      h[2][#h[2] + 1] = dep
    end
    if seen[given] then
      if not named[' ' .. dep] then h[3][#h[3] + 1] = dep end
      named[' ' .. dep] = true
    elseif named[' ' .. dep] then  -- named twice: counted once
    elseif not redis.call('ZSCORE', KEYS[K_SUCCEEDED], dep) then
      if redis.call('ZSCORE', KEYS[K_FAILED], dep) or redis.call('ZSCORE', KEYS[K_CANCELLED], dep) then
        h[4] = h[4] or dep
      else
        local found = false
        for _, s in ipairs({'queued', 'waiting', 'running', 'paused'}) do
          if redis.call('ZSCORE', KEYS[STATE_INDEX[s]], dep) then found = true; break end
        end
        if not found then return nil, {E_BAD_SPEC, 'it waits for job ' .. dep .. ', which does not exist'} end
        h[3][#h[3] + 1] = dep
        named[' ' .. dep] = true
      end
    end
  end
  return h
end
-- A new job's retries on its row ('' for most: nothing written; the text was checked before any write).
local function write_retries(jkey, text)
  if text == '' then return end
  local n, delay, codes = string.match(text, '^(%d+);(%d+);([%d,]*)$')
  redis.call('HSET', jkey, 'retries', n, 'retry_delay_ms', delay, 'retry_on',
    codes ~= '' and (',' .. codes .. ',') or '')
end
local seen, twins, mine, created, sched, holds = {}, {}, {}, 0, {}, {}
for i = 1, njobs do
  local id, ck = ARGV[PER * (i - 1) + FIRST], ARGV[PER * (i - 1) + FIRST + 2]
  if seen[id] or redis.call('EXISTS', KEYS[2 * i - 1]) == 1 then return {E_EXISTS, id} end
  local s, refused = schedule_of(ARGV[PER * (i - 1) + FIRST + 3])
  if not s then return refused end
  sched[i] = s
  local h
  h, refused = holds_of(ARGV[PER * (i - 1) + FIRST + 4], seen)
  if refused then return refused end
  holds[i] = h
  local retry = ARGV[PER * (i - 1) + FIRST + 5]
  if retry ~= '' and not string.match(retry, '^%d+;%d+;[%d,]*$') then return {E_BAD_ARG, 'retries'} end
  seen[id] = id
  local twin = ck ~= '' and (mine[ck] or coalesce_holder(ck))
  if twin then
    twins[i] = twin
    seen[id] = twin
  else
    if ck ~= '' then mine[ck] = id end
    created = created + 1
  end
end
if not stored then  -- a new pool: its queued jobs are in `ready` from the start (promote_candidates)
  redis.call('HSET', KEYS[K_CONFIG], 'max_concurrent_jobs', DEFAULT_SLOTS, 'ready_kept', 1, 'schema', SCHEMA_VERSION)
end
local now = now_ms()
local reply = {0, 0, 0, 'none', now}
local cands, first_id, turns = {}, nil, {}
-- The new jobs take the next `created` numbers of the counter, in order, and are counted once.
local seq = redis.call('INCRBY', KEYS[K_SEQ], created) - created
local start = seq  -- a priority nothing reached yet: its first turn is the first new job's seq (next_turn)
-- Which new jobs wait: counted apart from those queued.
local held, nheld = {}, 0
for i = 1, njobs do
  local h = holds[i]
  if not twins[i] and h and (h[1] > now or #h[3] > 0 or h[4]) then held[i] = true; nheld = nheld + 1 end
end
if created - nheld > 0 then count(transition_field('queued', 'enqueued'), created - nheld) end
if nheld > 0 then count(transition_field('waiting', 'enqueued'), nheld) end
for i = 1, njobs do
  local at = PER * (i - 1) + FIRST
  local id, spec, ck = ARGV[at], ARGV[at + 1], ARGV[at + 2]
  local jkey, rqkey = KEYS[2 * i - 1], KEYS[2 * i]
  if twins[i] then
    reply[#reply + 1], reply[#reply + 2], reply[#reply + 3], reply[#reply + 4] = 1, twins[i], '', ''
  elseif held[i] then
    seq = seq + 1
    local s, h = sched[i], holds[i]
    local score, why = '+inf', 'after ' .. table.concat(h[2], ' ')
    if h[4] then
      score = now
      redis.call('HSET', KEYS[K_DEPS], 'x:' .. id, h[4])
    elseif #h[3] > 0 then
      redis.call('HSET', KEYS[K_DEPS], id, #h[3])
      for _, dep in ipairs(h[3]) do redis.call('ZADD', KEYS[K_DEPENDENTS], 0, dep .. ' ' .. id) end
    end
    if h[1] > now then
      why = 'until ' .. iso_utc(h[1]) .. (#h[2] > 0 and ('; ' .. why) or '')
      if #h[3] == 0 and not h[4] then score = h[1] end
    end
    local line = stream_event(id, '', 'waiting', 'enqueued', why, actor, now, true)
    redis.call('HSET', jkey, 'id', id, 'spec', spec, 'state', 'waiting', 'seq', seq, 'created_at', now,
      'attempt', 0, 'coalesce_key', ck, 'recovery_attempts', 0, 'pause_requested', '0',
      'cancel_requested', '0', 'owner_boot', '', 'exit_code', '', 'error_reason', '', 'history', line,
      'after', table.concat(h[2], ' '), 'wait_reason', h[1] > now and 'not_before' or 'after')
    if h[1] > now then redis.call('HSET', jkey, 'wait_until', h[1], 'not_before', h[1]) end
    if fire then redis.call('HSET', jkey, 'schedule', fire.name, 'tick', fire.tick) end
    write_retries(jkey, ARGV[at + 5])
    if s[1] ~= 0 or s[2] ~= 1 or s[3] ~= '' or #s[4] > 0 then
      redis.call('HSET', jkey, 'priority', s[1], 'slots', s[2], 'group', s[3], 'uses', format_uses(s[4]))
    end
    redis.call('ZADD', KEYS[K_WAITING], score, id)
    reply[#reply + 1], reply[#reply + 2], reply[#reply + 3], reply[#reply + 4] = 0, id, seq, 'waiting'
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
    if holds[i] and #holds[i][2] > 0 then redis.call('HSET', jkey, 'after', table.concat(holds[i][2], ' ')) end
    if fire then redis.call('HSET', jkey, 'schedule', fire.name, 'tick', fire.tick) end
    write_retries(jkey, ARGV[at + 5])
    redis.call('ZADD', KEYS[K_QUEUED], order, id)
    redis.call('ZADD', KEYS[K_READY], order, id)
    -- No queued job holds this key (looked up above), so the entry becomes this job's alone.
    if ck ~= '' then set_coalesce_ids(ck, {id}) end
    cands[#cands + 1], cands[#cands + 2], cands[#cands + 3] = jkey, rqkey, KEYS[K_RQ_QUEUE]
    first_id = first_id or id
    reply[#reply + 1], reply[#reply + 2], reply[#reply + 3], reply[#reply + 4] = 0, id, seq, 'queued'
  end
end
if fire then
  local made = twins[1] and '' or ARGV[FIRST]
  redis.call('HSET', KEYS[K_SCHEDULE_TICKS], fire.name, fire.tick .. '|' .. made .. '|' .. now)
  redis.call('ZADD', KEYS[K_SCHEDULE_NEXT], fire.later, fire.name)
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
  reply[3], reply[4] = promoted, why
end
reply[2] = created
return reply
