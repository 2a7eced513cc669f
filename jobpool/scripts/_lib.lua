--[[ _lib.lua: shared helpers; each script is loaded with those it reaches (jobpool/store/luatext.py).
KEYS: a script's own keys first (KEYS[1..NKEYS], as its header numbers them), then the pool keys it names on
its header's `Pool keys:` line, in that order, appended by jobpool/store/calls.py (`Store.run`). Their names
are store/keys.py's (POOL_KEY_NAMES):
  config      hash   max_concurrent_jobs           paused     hash   present = promotion paused
  queued      zset   id -> seq (FIFO)              running    zset   id -> promoted_at ms (the slots in use)
  coalesce    hash   coalesce key -> queued id     events     stream every transition
  rq_queue    list   the pool's RQ queue (outside the hash tag: RQ's own key)
  rq_queues   set    RQ's registry of queues (RQ's own key)
  seq         string global enqueue counter        metrics    hash   counters and histogram buckets (`count`)
  paused_jobs, succeeded, failed, cancelled        zsets  the paused and terminal job indexes
  and those of order and limits ("Order and limits" below): ready (the queued that may be promoted, by
  order), blocked (the parked), passed, wake, fair, limits, limit_used, holds; and those of time and
  dependencies ("Time and dependencies" below): waiting (the waiting jobs' state index, by when due),
  dependents, deps, and the schedules' schedules, schedule_ticks, schedule_next (jobpool/schedules.py); and
  where the running jobs are ("Where the running jobs are" below): running_by, running_daemons, running_on;
  and the pool's history (scripts/trend_sample.lua): last_sweep (string, the last sweep's summary as JSON,
  written by the supervisor) and trends (hash, one point per position of a ring: jobpool/trends.py)
At load time (jobpool/store/luatext.py) each script is given, before anything else: NKEYS and NARGV (the
counts of its own KEYS and ARGV), K_<NAME> for each pool key it names (its position in KEYS), and
STATE_INDEX (state -> position of its index) when it reaches it, which needs all six indexes named. The
loader refuses a script whose `Pool keys:` line names a key its text does not reach, or misses one it does,
so the header is always the truth and no key is passed unused.

Scripts that may free a slot take "promotion candidates" last: triples of (job:<id>, rq:job:<id>, the RQ
list to push it on) for the ids at the head of `queued`, read by the caller just before the call. The list
is the pool's RQ queue, or for a row with an `affinity` (the daemon holding its checkpoint: note_affinity)
that daemon's own queue, the row's `affinity_queue` (Store.candidates reads it). A candidate is promoted only
while it is still the head and its list is still the one its row names, so a stale read can delay a
promotion (the caller retries) but never reorder or misroute one.
Why candidates and not ids: every key a script touches must arrive in KEYS.
Every script that may free a slot or promote replies {0, result, promoted, why_stopped, ...}.
why_stopped is promote_candidates' (paused | full | empty | stale | batch), or 'none' when no slot was
freed; on 'stale' or 'batch' the caller promotes again (Store.finish_promotion).

ARGV: the script's own, then the settings it names on its header's `Settings:` line, appended by
jobpool/store/runner.py and named before the script runs: default_slots (DEFAULT_SLOTS: the slot limit of a
pool with none stored yet, Settings.max_concurrent_jobs, so Python reports the limit the scripts use and no
default is written twice) and events_maxlen (STREAM_MAXLEN: the event stream's cap, Settings.events_maxlen).
The loader checks that line as it checks `Pool keys:`.

Replies have one shape. Success is {0, ...}; an error is {code, detail}, exactly two elements.

Every transition of a job is written twice: to the pool's capped stream (the feed that `jobpool events`
tails and follows) and to the job's own row, field `history` (one JSON array per line: stream id, from, to,
reason, evidence, actor, at). A job's history is read from its row, so it costs what that job has, whatever
else the stream holds, and goes when the row is pruned. It is kept whole up to HISTORY_MAX_BYTES; past that,
its first events and its newest stay with one event between them that says what was dropped (`trim_history`).
An event's free text is cut to EVENT_TEXT_MAX_BYTES with a visible mark (`bounded_text`), so one long text
cannot push a job's other events out.

A row a script cannot read must not abort it (Redis keeps what a script wrote before an error): numbers read
from a row go through `whole`, and a head of the queue whose row is gone or unreadable is taken out of the
queue with a `dropped_corrupt_row` event instead of wedging promotion for every job behind it.

Error codes (negative first element of the reply; mapped to exceptions in jobpool/store/runner.py):
  -1 not found   -2 invalid state   -3 not owner (fenced write refused)
  -4 conflict (compare-and-set evidence changed)   -5 already exists   -6 bad argument
  -7 a spec the pool cannot take as it is (more slots than it has, a name no limit covers)
]]
local E_NOT_FOUND, E_INVALID_STATE, E_NOT_OWNER, E_CONFLICT, E_EXISTS, E_BAD_ARG, E_BAD_SPEC = -1, -2, -3, -4, -5, -6, -7
local PROMOTE_BATCH_LIMIT = 64

-- A non-negative whole number read from a row, or 0 for anything else (missing, garbage, fractional).
local function whole(v)
  local n = tonumber(v)
  if not n or n ~= n or n < 0 or n == math.huge or n ~= math.floor(n) then return 0 end
  return n
end

-- Whether `key` (a key from KEYS) is the row key of job `id`: compares names only, builds no key to call.
local function is_row_key(key, id)
  local prefix = string.sub(KEYS[K_CONFIG], 1, -#'config' - 1)
  return key == prefix .. 'job:' .. id
end

local function key_type(key)
  return redis.call('TYPE', key)['ok']
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- RQ stores timestamps as ISO-8601 UTC strings; Redis' Lua has no os.date, so convert by hand (days since
-- 1970 to a date of 400-year eras of the proleptic Gregorian calendar, years starting in March). Every
-- floor(a / b) is written (a - a % b) / b: exact for whole numbers (Lua's % takes the sign of b), and done by
-- the VM rather than by 14 calls of math.floor, which were 2% of an enqueue's script (tests/unit/
-- test_scripts.py checks the result against Python's).
local function iso_utc(ms)
  local milli = ms % 1000
  local secs = (ms - milli) / 1000
  local rem = secs % 86400
  local z = (secs - rem) / 86400 + 719468
  local doe = z % 146097
  local era = (z - doe) / 146097
  local yoe = doe - (doe - doe % 1460) / 1460 + (doe - doe % 36524) / 36524 - (doe - doe % 146096) / 146096
  yoe = (yoe - yoe % 365) / 365
  local doy = doe - (365 * yoe + (yoe - yoe % 4) / 4 - (yoe - yoe % 100) / 100)
  local mp = 5 * doy + 2
  mp = (mp - mp % 153) / 153
  local d = 153 * mp + 2
  d = doy - (d - d % 5) / 5 + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400 + (m <= 2 and 1 or 0)
  local in_hour = rem % 3600
  local sec = in_hour % 60
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%06dZ', y, m, d, (rem - in_hour) / 3600,
    (in_hour - sec) / 60, sec, milli * 1000)
end

-- The pool's counters (KEYS[K_METRICS], one hash; read by jobpool/metrics.py): counted here, in the step that
-- makes the change, so they are right whichever process is asked and survive restarts. Its fields are a
-- fixed, bounded set (field names are in jobpool/metrics.py): `transitions:<to>:<reason>`, `recoveries`,
-- and per terminal state `job_duration:<state>:<bucket>` (a bucket's own count, not cumulative), `:sum_ms`
-- and `:count`.
local function count(field, by)
  redis.call('HINCRBY', KEYS[K_METRICS], field, by or 1)
end

-- A reason as a label value from a bounded set (contract.METRIC_REASONS): exit codes share one, a detail
-- after a colon is dropped, anything else is 'other'. The row and the stream keep the reason as written.
local function metric_reason(reason)
  if not reason or reason == '' then return 'none' end
  if string.find(reason, '^exit_code_%-?%d+$') then return 'exit_code_nonzero' end
  local word = string.match(reason, '^([^:]*):') or reason
  for _, known in ipairs(METRIC_REASONS) do
    if word == known then return word end
  end
  return 'other'
end

-- A job that reached terminal state `to` at `now`: counted in the duration histogram of that state, from its
-- enqueue (created_at) to now. A row with no readable created_at counts as 0 s.
local function observe_duration(jkey, to, now)
  local created = tonumber(redis.call('HGET', jkey, 'created_at'))
  local ms = created and now - created or 0
  if ms < 0 then ms = 0 end
  local bucket = 'inf'
  for _, le in ipairs(JOB_DURATION_BUCKETS) do
    if ms <= le * 1000 then bucket = tostring(le); break end
  end
  local prefix = 'job_duration:' .. to .. ':'
  count(prefix .. bucket)
  count(prefix .. 'sum_ms', ms)
  count(prefix .. 'count')
end

-- The counter of the transitions to `to` for `reason` (a field of the `metrics` hash).
local function transition_field(to, reason)
  return 'transitions:' .. (to ~= '' and to or 'none') .. ':' .. metric_reason(reason)
end

-- `text` (a reason, evidence or actor) as an event keeps it: whole when it fits EVENT_TEXT_MAX_BYTES, else its
-- start, cut on a UTF-8 character boundary, and a mark saying how many bytes went, all within the budget (the
-- digits of the whole length bound those of the count cut).
local function bounded_text(text)
  text = tostring(text or '')
  if #text <= EVENT_TEXT_MAX_BYTES then return text end
  local keep = EVENT_TEXT_MAX_BYTES - #string.format('\226\128\166(%d bytes cut)', #text)
  while keep > 0 do
    local b = string.byte(text, keep + 1)
    if b < 128 or b >= 192 then break end  -- not a continuation byte: a character starts here
    keep = keep - 1
  end
  return string.sub(text, 1, keep) .. string.format('\226\128\166(%d bytes cut)', #text - keep)
end

-- Record a transition in the pool's stream and counters (unless `uncounted`: a caller that counts many at
-- once); returns its line for the job's `history`. Only a script that writes a new row's first line with the
-- row itself (enqueue) calls this alone: use `event`.
local function stream_event(id, from, to, reason, evidence, actor, now, uncounted)
  if not uncounted then count(transition_field(to, reason)) end
  reason, evidence, actor = bounded_text(reason), bounded_text(evidence), bounded_text(actor)
  local at = string.format('%d', now)
  local sid = redis.call('XADD', KEYS[K_EVENTS], 'MAXLEN', '~', STREAM_MAXLEN, '*',
    'job', id, 'from', from, 'to', to, 'reason', reason, 'evidence', evidence, 'actor', actor, 'at', at)
  return cjson.encode({sid, from, to, reason, evidence, actor, at})
end

-- The evidence of the trim marker, and the pattern that reads it back: how many events it stands for, the
-- stream ids of the first and last of them and when they happened.
local TRIMMED_EVIDENCE = '%d events dropped to bound the history (ids %s to %s, at %s to %s ms)'
local TRIMMED_PATTERN = '^(%d+) events dropped to bound the history %(ids (%S+) to (%S+), at (%d+) to (%d+) ms%)$'

-- A job's history `text` (its lines, oldest first) within HISTORY_MAX_BYTES: unchanged when it fits; else its
-- first HISTORY_HEAD_EVENTS lines stay, then one marker line (reason REASON_HISTORY_TRIMMED, actor jobpool)
-- standing for every event dropped so far, then the newest lines that fit (the newest always stays). The
-- dropped events are always the oldest after the head, so they are one run and one marker counts them all:
-- its id and time are those of the last dropped (so it sorts where they were), its `from` that of the first
-- and its `to` that of the last (so the states still chain), its evidence their number, ids and times.
local function trim_history(text)
  if #text <= HISTORY_MAX_BYTES then return text end
  local lines = {}
  for line in string.gmatch(text, '[^\n]+') do lines[#lines + 1] = line end
  local size, first, mark = #text, HISTORY_HEAD_EVENTS + 1, {n = 0}
  local ok, was = pcall(cjson.decode, lines[first] or '')
  if ok and type(was) == 'table' and was[4] == REASON_HISTORY_TRIMMED then
    local n, id1, _, at1 = string.match(tostring(was[5]), TRIMMED_PATTERN)
    if n then  -- the marker of earlier trims: the run it counts goes on with the lines dropped now
      mark = {n = tonumber(n), id1 = id1, at1 = at1, from = tostring(was[2])}
      size = size - #lines[first] - 1
      first = first + 1
    end
  end
  local marker
  while first < #lines do
    local line = lines[first]
    size = size - #line - 1
    first = first + 1
    local fine, dropped = pcall(cjson.decode, line)
    if not fine or type(dropped) ~= 'table' then dropped = {} end  -- unreadable: counted, its id and time unknown
    local id, at = tostring(dropped[1] or mark.id2 or '0-0'), tostring(dropped[7] or mark.at2 or '0')
    if mark.n == 0 then mark.id1, mark.at1, mark.from = id, at, tostring(dropped[2] or '') end
    mark.n, mark.id2, mark.at2 = mark.n + 1, id, at
    marker = cjson.encode({id, mark.from, tostring(dropped[3] or ''), REASON_HISTORY_TRIMMED,
      string.format(TRIMMED_EVIDENCE, mark.n, mark.id1, id, mark.at1, at), 'jobpool', at})
    if size + #marker + 1 <= HISTORY_MAX_BYTES then break end
  end
  if not marker then return text end  -- nothing after the head but the newest: it stays as it is
  local kept = {}
  for i = 1, HISTORY_HEAD_EVENTS do kept[i] = lines[i] end
  kept[#kept + 1] = marker
  for i = first, #lines do kept[#kept + 1] = lines[i] end
  return table.concat(kept, '\n')
end

-- Record a transition: in the pool's stream, in the row's history when `jkey` (the job's row, a hash of this
-- job) is given, and in the pool's counters. Queue-wide events (pause, slots) pass nil.
local function event(jkey, id, from, to, reason, evidence, actor, now)
  local line = stream_event(id, from, to, reason, evidence, actor, now)
  if not jkey then return end
  local old = redis.call('HGET', jkey, 'history')
  if old and old ~= '' then line = trim_history(old .. '\n' .. line) end
  redis.call('HSET', jkey, 'history', line)
end

-- A row that reached a terminal state keeps what its readers show (Job.from_row, jobpool/models.py), its
-- history and the answer to a finish sent again (finished_by/finished_as); the fields that only steer a live
-- attempt go, and so do empty ones: retained finished rows are most of what a long-lived pool stores.
local LIVE_ONLY = {'claim_token', 'pause_requested', 'cancel_requested', 'pause_withdrawn', 'owner_boot',
  'heartbeat_at', 'launched_at', 'affinity', 'affinity_queue', 'daemon_queue', 'timed_out', 'wait_until',
  'wait_reason'}
local DROP_IF_EMPTY = {'coalesce_key', 'identity', 'container_id', 'daemon_id', 'exit_code', 'error_reason',
  'log_tail', 'claimed_at', 'promoted_at'}
local TERMINAL_STATE = {succeeded = true, failed = true, cancelled = true}

local function compact_finished(jkey)
  redis.call('HDEL', jkey, unpack(LIVE_ONLY))
  local values = redis.call('HMGET', jkey, unpack(DROP_IF_EMPTY))
  for i, name in ipairs(DROP_IF_EMPTY) do
    if values[i] == '' then redis.call('HDEL', jkey, name) end
  end
end

-- ---- Where the running jobs are (docs/architecture.md "Status at scale") ---------------------------------
-- `status` names each live worker's running jobs and each daemon holding slots on stale evidence. Read from
-- the rows, that cost a read per running job at every status and every /metrics scrape; so the scripts that
-- change what it is made of keep it, in the step that changes it, and a reader costs what the workers and
-- daemons are. A running row is placed under its owner (`owner_boot`, once claimed) and under its daemon (the
-- `daemon_id` its claim or launch recorded; unclaimed, the `affinity` it was promoted to wait for):
--   running_by       hash  'b:<boot>' -> the ids it owns, space-separated (a worker runs one at a time);
--                          'j:<id>' -> '<owner> <daemon>' as placed: what to take back, even once its row is
--                          gone (drop_ghost.lua)
--   running_daemons  hash  daemon -> how many running rows are placed under it
--   running_on       zset  '<daemon> <id>', every score 0: one daemon's rows are one range
-- Every script that changes a running row's state, owner_boot, daemon_id or affinity places it again after
-- the change (below), so each always equals a recount of the rows (tests/unit/test_running_index.py). Ids
-- hold no whitespace (submit.JOB_ID); an owner or daemon that does (a row edited by hand: no boot id or
-- daemon identity has any) is not placed, so that members split back exactly.
local function running_placement(jkey)
  local row = redis.call('HMGET', jkey, 'state', 'owner_boot', 'daemon_id', 'affinity')
  if row[1] ~= 'running' then return '', '' end
  local owner, daemon = row[2] or '', row[4] or ''
  if owner ~= '' then daemon = row[3] or '' end
  if string.find(owner, '%s') then owner = '' end
  if string.find(daemon, '%s') then daemon = '' end
  return owner, daemon
end

-- Boot `boot`'s list of owned ids with `id` added (`add`) or taken out.
local function running_owned(boot, id, add)
  local field = 'b:' .. boot
  local ids = redis.call('HGET', KEYS[K_RUNNING_BY], field) or ''
  local padded = ' ' .. ids .. ' '
  local at = string.find(padded, ' ' .. id .. ' ', 1, true)
  if add then
    if at then return end
    ids = ids == '' and id or (ids .. ' ' .. id)
  else
    if not at then return end
    ids = string.sub(padded, 2, at - 1) .. string.sub(padded, at + #id + 1, -2)
    ids = string.gsub(ids, '^ +', '')
    ids = string.gsub(ids, ' +$', '')
  end
  if ids == '' then redis.call('HDEL', KEYS[K_RUNNING_BY], field)
  else redis.call('HSET', KEYS[K_RUNNING_BY], field, ids) end
end

-- Job `id` placed as its row `jkey` (a hash) now says; with no `jkey`, placed under nothing (a caller that
-- knows it does not run, or has no row: drop_ghost.lua). What it was placed under and is not any more is
-- taken back first.
local function place_running(jkey, id)
  local owner, daemon = '', ''
  if jkey then owner, daemon = running_placement(jkey) end
  local now = (owner == '' and daemon == '') and '' or (owner .. ' ' .. daemon)
  local was = redis.call('HGET', KEYS[K_RUNNING_BY], 'j:' .. id) or ''
  if was == now then return end
  local old_owner, old_daemon = string.match(was, '^(%S*) (%S*)$')
  old_owner, old_daemon = old_owner or '', old_daemon or ''
  if old_owner ~= owner then
    if old_owner ~= '' then running_owned(old_owner, id, false) end
    if owner ~= '' then running_owned(owner, id, true) end
  end
  if old_daemon ~= daemon then
    if old_daemon ~= '' and redis.call('ZREM', KEYS[K_RUNNING_ON], old_daemon .. ' ' .. id) == 1
        and redis.call('HINCRBY', KEYS[K_RUNNING_DAEMONS], old_daemon, -1) <= 0 then
      redis.call('HDEL', KEYS[K_RUNNING_DAEMONS], old_daemon)
    end
    if daemon ~= '' and redis.call('ZADD', KEYS[K_RUNNING_ON], 0, daemon .. ' ' .. id) == 1 then
      redis.call('HINCRBY', KEYS[K_RUNNING_DAEMONS], daemon, 1)
    end
  end
  if now == '' then redis.call('HDEL', KEYS[K_RUNNING_BY], 'j:' .. id)
  else redis.call('HSET', KEYS[K_RUNNING_BY], 'j:' .. id, now) end
end

-- ---- Order and limits (docs/architecture.md "Order and limits") -----------------------------------------
-- A queued job's place is its `order`: its priority's band, then its turn in that band; lower goes first.
-- Every number here stays a whole double below 2^53, so scores and the text of `blocked`'s members are exact.
-- A row from before priorities has no `order`: its seq stands for it (band 0 is priority 0).
local ORDER_BAND = 4398046511104  -- 2^42 turns per priority
local ORDER_OFFSET = (MAX_PRIORITY + 1) * ORDER_BAND  -- makes any order non-negative, for `parked_member`

-- A queued job's place: its order (its seq for a row from before priorities), priority and group, and
-- whether its row has an order (fair share counts only such rows: `group_left`).
local function queue_order(jkey)
  local row = redis.call('HMGET', jkey, 'order', 'seq', 'priority', 'group')
  return tonumber(row[1]) or tonumber(row[2]), tonumber(row[3]) or 0, row[4] or '', row[1] ~= false
end

-- Fair share counts each group's waiting jobs (queued or paused) per priority ('c:<priority>:<group>' in
-- `fair`, beside its newest turn 'g:...': `next_turn`). A group with none waiting any more is forgotten, so
-- its next job starts at the turn promotion reached, not behind jobs of its that were cancelled. A job that
-- comes back to wait (handed back, requeued) is counted again and keeps the group's newest turn at least its
-- own.
local function group_left(priority, group)
  local cf = 'c:' .. priority .. ':' .. group
  if redis.call('HINCRBY', KEYS[K_FAIR], cf, -1) <= 0 then
    redis.call('HDEL', KEYS[K_FAIR], cf, 'g:' .. priority .. ':' .. group)
  end
end

local function group_joined(priority, group, turn)
  local gf = 'g:' .. priority .. ':' .. group
  redis.call('HINCRBY', KEYS[K_FAIR], 'c:' .. priority .. ':' .. group, 1)
  local last = tonumber(redis.call('HGET', KEYS[K_FAIR], gf))
  if not last or last < turn then redis.call('HSET', KEYS[K_FAIR], gf, turn) end
end

-- A job that cannot start now waits in `blocked` (one sorted set, every score 0, compared as text), under
-- the name of what it waits for: a limit's name, '#slots' (its weight is more than the free slots) or
-- '#reserved' (what it needs is held for a reservation), with how much of it it needs (its amount of the
-- name, its weight). Members sort by that name, then by order, so the waiters of one name are one range, in
-- queue order, and a pattern's names are one range too.
local function parked_member(name, order, id, need)
  return name .. ' ' .. string.format('%016.0f', order + ORDER_OFFSET) .. ' ' .. id .. ' ' .. need
end

-- What a job uses of the named limits, as its row keeps it: 'name=amount=limit;...' (the limit is the
-- definition that covered the name: the name itself or a pattern). Names hold none of '=; |'.
local function parse_uses(text)
  local out = {}
  if not text or text == '' then return out end
  for name, amount, limit in string.gmatch(text, '([^=;]+)=(%d+)=([^=;]*)') do
    out[#out + 1] = {name, tonumber(amount), limit}
  end
  return out
end

local function format_uses(uses)
  local parts = {}
  for i, u in ipairs(uses) do parts[i] = u[1] .. '=' .. u[2] .. '=' .. u[3] end
  return table.concat(parts, ';')
end

-- `id` leaves the queue (promoted, paused, cancelled, failed): out of `ready`, and out of `blocked` and
-- `passed` if it waited there; a reservation it held ends, and what was held back for it is woken.
-- Set when this script marks a range of `blocked` to wake (promote_candidates reads it last).
local WOKEN = {any = false}

local function wake(prefix, after)
  redis.call('HSET', KEYS[K_WAKE], prefix, after or '')
  WOKEN.any = true
end

-- The parking of a job that leaves the queue (its row's `parked` and `passed` members), undone.
local function unpark(jkey, parked, passed)
  -- Not in `blocked` any more: it was woken, counted against its name's room, and leaves before using it, so
  -- that name's reading goes on after it (else the waiters behind it wait for a release that never comes).
  if parked and parked ~= '' and redis.call('ZREM', KEYS[K_BLOCKED], parked) == 0 then
    local was = string.match(parked, '^(%S+) ')
    if was and was ~= '#reserved' and redis.call('HEXISTS', KEYS[K_WAKE], was .. ' ') == 0 then
      wake(was .. ' ', parked)
    end
  end
  if passed and passed ~= '' then
    redis.call('ZREM', KEYS[K_PASSED], passed)
    if redis.call('HGET', KEYS[K_CONFIG], 'reserved') == passed then
      redis.call('HDEL', KEYS[K_CONFIG], 'reserved')
      wake('#reserved ')
    end
  end
  if (parked and parked ~= '') or (passed and passed ~= '') then
    redis.call('HSET', jkey, 'parked', '', 'passed', '')
  end
end

local function leave_queue(jkey, id)
  redis.call('ZREM', KEYS[K_READY], id)
  local row = redis.call('HMGET', jkey, 'parked', 'passed')
  unpark(jkey, row[1], row[2])
end

-- ---- Time and dependencies (docs/architecture.md "Time and dependencies") --------------------------------
-- A job held by time (a delayed start, a retry's delay) or by the jobs it waits for is `waiting`: in the
-- `waiting` index, scored by when the release step (release_waiting.lua, run by the supervisors' timers)
-- should look at it again: its `wait_until` (row, ms), or +inf while jobs it waits for have not all
-- succeeded. It has no order (no place in the queue) until it is released: then it takes its turn as a job
-- enqueued at that moment would (`take_turn`), at its priority. Who waits for whom is `dependents` (members
-- '<dependency> <dependent>', compared as text: one job's dependents are one range); per dependent, `deps`
-- counts its dependencies not yet succeeded ('<id>') and names the first that failed or was cancelled
-- ('x:<id>'). Those are pool keys, so a dependency's end updates them in its own step, whichever script
-- ends it (`tell_dependents`, from set_state), and makes the dependent due at once; the release step then
-- queues it, or cancels it (REASON_DEPENDENCY_FAILED), in a step of its own: a chain is cancelled one link
-- per step, and a process dying between two steps leaves the next one due.

-- The ids of the jobs waiting for `id`.
local function dependents_of(id)
  local out = {}
  for _, m in ipairs(redis.call('ZRANGEBYLEX', KEYS[K_DEPENDENTS], '[' .. id .. ' ', '(' .. id .. ' \255')) do
    out[#out + 1] = string.sub(m, #id + 2)
  end
  return out
end

-- Job `id` reached terminal state `to` at `now`: each job waiting for it has one dependency fewer left
-- (succeeded) or learns the first that failed, and is due now. A dependent paused meanwhile is not in
-- `waiting` (ZADD XX leaves it out): its resume judges it by the same counts.
local function tell_dependents(id, to, now)
  for _, d in ipairs(dependents_of(id)) do
    if to == 'succeeded' then
      redis.call('HINCRBY', KEYS[K_DEPS], d, -1)
    else
      redis.call('HSETNX', KEYS[K_DEPS], 'x:' .. d, id)
    end
    redis.call('ZADD', KEYS[K_WAITING], 'XX', now, d)
  end
end

-- A job that will wait for nothing any more (it is queued, or it ended): its entries in `dependents` and
-- `deps` go, so the jobs it waited for may be pruned again.
local function forget_deps(jkey, id)
  local after = redis.call('HGET', jkey, 'after')
  if not after or after == '' then return end
  for dep in string.gmatch(after, '%S+') do redis.call('ZREM', KEYS[K_DEPENDENTS], dep .. ' ' .. id) end
  redis.call('HDEL', KEYS[K_DEPS], id, 'x:' .. id)
end

-- What still holds job `id` (row `jkey`) at `now`: nil when nothing does; 'cancel' and the dependency that
-- failed; or 'wait' and when to look again (+inf while dependencies are left: their end makes it due).
local function hold_of(jkey, id, now)
  local failed = redis.call('HGET', KEYS[K_DEPS], 'x:' .. id)
  if failed then return 'cancel', failed end
  if (tonumber(redis.call('HGET', KEYS[K_DEPS], id)) or 0) > 0 then return 'wait', '+inf' end
  local due = tonumber(redis.call('HGET', jkey, 'wait_until'))
  if due and due > now then return 'wait', due end
  return nil
end

-- A paused job keeps its group's count and its place (it is resumed at its turn): fair share counts the
-- jobs waiting in `queued` or `paused`.
local WAITING = {queued = true, paused = true}

-- Move a job between state indexes; score is the job's order for queued/paused (its place: a job handed back
-- or resumed returns to it), a time for the rest (the terminal indexes are ordered by finish time, which is
-- what retention prunes by). A row whose order is unreadable goes to the back of the queue (scored by the
-- time) rather than failing the script. A queued job is also in `ready` until it is parked; one that leaves
-- the queue leaves those too (`leave_queue`). A terminal row is counted in the duration histogram (every
-- terminal transition comes through here) and compacted.
local function set_state(jkey, id, from, to, score)
  local place, priority, group, counted
  if WAITING[to] or WAITING[from] then
    place, priority, group, counted = queue_order(jkey)
    if WAITING[to] then score = place or score end
  end
  if score ~= '+inf' then score = tonumber(score) or now_ms() end
  if from ~= '' and STATE_INDEX[from] then redis.call('ZREM', KEYS[STATE_INDEX[from]], id) end
  if from == 'queued' then leave_queue(jkey, id) end
  redis.call('ZADD', KEYS[STATE_INDEX[to]], score, id)
  if to == 'queued' then redis.call('ZADD', KEYS[K_READY], score, id) end
  if counted and WAITING[from] and not WAITING[to] then group_left(priority, group) end
  if counted and WAITING[to] and not WAITING[from] then
    group_joined(priority, group, score + priority * ORDER_BAND)
  end
  redis.call('HSET', jkey, 'state', to)
  -- Leaving waiting (or paused, where a waiting job may have gone) for the queue or an end: it waits for
  -- nothing any more.
  if (from == 'waiting' or from == 'paused') and to ~= 'waiting' and to ~= 'paused' then forget_deps(jkey, id) end
  if TERMINAL_STATE[to] then
    observe_duration(jkey, to, score)
    compact_finished(jkey)
    tell_dependents(id, to, score)
  end
end

-- A coalesce entry names the queued jobs holding its key, space-separated, in the order they took it. Usually
-- one: a second appears when a job paused or handed back returns to the queue while an equal job waits, and
-- it must still be found once the first leaves (an enqueue returns a queued job it equals, if any).
local function coalesce_ids(ck)
  local ids, v = {}, redis.call('HGET', KEYS[K_COALESCE], ck)
  if v then
    for x in string.gmatch(v, '%S+') do ids[#ids + 1] = x end
  end
  return ids
end

local function set_coalesce_ids(ck, ids)
  if #ids == 0 then
    redis.call('HDEL', KEYS[K_COALESCE], ck)
  else
    redis.call('HSET', KEYS[K_COALESCE], ck, table.concat(ids, ' '))
  end
end

-- The queued job holding `ck` (the first of its entry still queued), or nil.
local function coalesce_holder(ck)
  for _, x in ipairs(coalesce_ids(ck)) do
    if redis.call('ZSCORE', KEYS[K_QUEUED], x) then return x end
  end
  return nil
end

-- `id` no longer holds `ck` (it left `queued`, or its row goes).
local function drop_coalesce_id(ck, id)
  local ids, keep = coalesce_ids(ck), {}
  for _, x in ipairs(ids) do
    if x ~= id then keep[#keep + 1] = x end
  end
  if #keep ~= #ids then set_coalesce_ids(ck, keep) end
end

local function drop_coalesce(jkey, id)
  local ck = redis.call('HGET', jkey, 'coalesce_key')
  if ck and ck ~= '' then drop_coalesce_id(ck, id) end
end

-- `id` (queued now) holds its key after those that hold it already; ids no longer queued (a row dropped
-- by hand) are left out.
local function add_coalesce(jkey, id)
  local ck = redis.call('HGET', jkey, 'coalesce_key')
  if ck and ck ~= '' then
    local keep = {}
    for _, x in ipairs(coalesce_ids(ck)) do
      if x ~= id and redis.call('ZSCORE', KEYS[K_QUEUED], x) then keep[#keep + 1] = x end
    end
    keep[#keep + 1] = id
    set_coalesce_ids(ck, keep)
  end
end

local function max_slots()
  return tonumber(redis.call('HGET', KEYS[K_CONFIG], 'max_concurrent_jobs')) or DEFAULT_SLOTS
end

-- Slots in use, counting each running job's weight (`slots_used` in config). A pool from before weights
-- has none stored: every running job then holds one slot, so it starts from their count.
local function slots_used(stored)
  local n = tonumber(stored or redis.call('HGET', KEYS[K_CONFIG], 'slots_used'))
  if n then return n end
  n = redis.call('ZCARD', KEYS[K_RUNNING])
  redis.call('HSET', KEYS[K_CONFIG], 'slots_used', n)
  return n
end

-- The limit that covers `name`: the name's own, else the longest pattern over it (a prefix and '*'; the
-- prefix may be the whole name); nil when none does.
local function limit_for(name)
  if redis.call('HEXISTS', KEYS[K_LIMITS], name) == 1 then return name end
  for i = #name, 1, -1 do
    local pattern = string.sub(name, 1, i) .. '*'
    if redis.call('HEXISTS', KEYS[K_LIMITS], pattern) == 1 then return pattern end
  end
  return nil
end

-- The size of the limit over `u` ({name, amount, limit}) now, and its definition (set in `u`): whatever
-- covers the name now (`limit_for`), the same for a job's start, its waking and its reservation; nil for none.
local function limit_size(u)
  local n = tonumber(redis.call('HGET', KEYS[K_LIMITS], u[1]))
  if n then u[3] = u[1]; return n end
  local limit = limit_for(u[1])
  if not limit then return nil end
  u[3] = limit
  return tonumber(redis.call('HGET', KEYS[K_LIMITS], limit))
end

local function limit_in_use(name)
  return tonumber(redis.call('HGET', KEYS[K_LIMIT_USED], name)) or 0
end

-- What keeps a job of weight `w` using `uses` from starting now, or nil: '#slots' when its weight is more
-- than the free slots, or the first name it needs more of than is free (a name no limit covers has none).
local function blocker(w, uses, used, max)
  if used + w > max then return '#slots' end
  for _, u in ipairs(uses) do
    local n = limit_size(u)
    if not n or limit_in_use(u[1]) + u[2] > n then return u[1] end
  end
  return nil
end

-- A member of `passed` read back: {member, id, priority, weight, need = {name = amount}}.
local function read_passed(member)
  local id, p, w, uses = string.match(member, '^([^|]+)|([^|]+)|([^|]+)|(.*)$')
  local r = {member = member, id = id, priority = tonumber(p) or 0, weight = tonumber(w) or 1, need = {}}
  for _, u in ipairs(parse_uses(uses)) do r.need[u[1]] = u[2] end
  return r
end

-- Whether what job `r` needs can ever be had as the limits stand: it is still queued, its weight fits the
-- slot limit and every name it uses is covered by a limit at least its amount. A reservation for a job that
-- cannot start however much drains (a limit of 0, one removed) would hold capacity for nothing.
local function attainable(r, max)
  if not r.id or not redis.call('ZSCORE', KEYS[K_QUEUED], r.id) or r.weight > max then return false end
  for name, amount in pairs(r.need) do
    local n = limit_size({name, amount, ''})
    if not n or n < amount then return false end
  end
  return true
end

-- The reservation, read once per promotion: the job passed over longest gets it once that is RESERVE_AFTER_MS
-- ago and what it needs is attainable (a few of the oldest are looked at; one no longer queued leaves
-- `passed`). A reservation whose job is gone or can no longer be satisfied ends, and what was held back for
-- it is woken. Returns the reservation (read_passed) or nil.
local function reservation(now, max, held)
  if held then
    local r = read_passed(held)
    if attainable(r, max) then return r end
    redis.call('HDEL', KEYS[K_CONFIG], 'reserved')
    wake('#reserved ')
    if not r.id or not redis.call('ZSCORE', KEYS[K_QUEUED], r.id) then
      redis.call('ZREM', KEYS[K_PASSED], held)
    end
    return nil
  end
  local oldest = redis.call('ZRANGE', KEYS[K_PASSED], 0, 3, 'WITHSCORES')
  for i = 1, #oldest, 2 do
    if now - tonumber(oldest[i + 1]) < RESERVE_AFTER_MS then return nil end
    local r = read_passed(oldest[i])
    if attainable(r, max) then
      redis.call('HSET', KEYS[K_CONFIG], 'reserved', oldest[i])
      return r
    end
    if not r.id or not redis.call('ZSCORE', KEYS[K_QUEUED], r.id) then
      redis.call('ZREM', KEYS[K_PASSED], oldest[i])
    else  -- queued but not attainable now: to the back, so it cannot keep the reservation from the others
      redis.call('ZADD', KEYS[K_PASSED], now, oldest[i])
    end
  end
  return nil
end

-- Whether a job (`id`, priority `p`, weight `w`, `uses` with their limits resolved by `blocker`) would take
-- what the reservation `r` needs: nothing of its priority or lower starts unless the slots and the units of
-- the names it shares with the reserved job stay enough for that job.
local function held_back(r, id, p, w, uses, used, max)
  if not r or r.id == id or p > r.priority then return false end
  if max - used - w < r.weight then return true end
  for _, u in ipairs(uses) do
    local need = r.need[u[1]]
    if need and (limit_size(u) or 0) - limit_in_use(u[1]) - u[2] < need then return true end
  end
  return false
end

-- Park the head `id` (not startable now: waiting on `name`) in `blocked`, out of `ready`. The first time,
-- it is also entered in `passed` (when, and what it needs), where a reservation is taken from.
-- A head whose row still names a member (`parked`) was woken from that name's waiters and counted against
-- its room (`wake_waiters`), which may have ended that reading before the waiters behind it. Parked again
-- (held back for the reservation, another limit, or the same name: it needs more of it than there is, or than
-- its limit will ever give) it took none of that room, so the reading goes on after it (a `wake` entry from
-- its old member, read past it). Without this, the waiters behind it, the reserved job among them, could wait
-- for a release that never comes, with the room free.
local function park(jkey, id, name, order, p, w, uses, now)
  local need = name == '#slots' and w or 0
  for _, u in ipairs(uses) do
    if u[1] == name then need = u[2] end
  end
  local member = parked_member(name, order, id, need)
  redis.call('ZREM', KEYS[K_READY], id)
  redis.call('ZADD', KEYS[K_BLOCKED], 0, member)
  local row = redis.call('HMGET', jkey, 'passed', 'parked')
  local passed, before = row[1], row[2]
  local was = before and string.match(before, '^(%S+) ')
  if was and was ~= '#reserved' and redis.call('HEXISTS', KEYS[K_WAKE], was .. ' ') == 0 then
    wake(was .. ' ', before)
  end
  if not passed or passed == '' then
    passed = id .. '|' .. p .. '|' .. w .. '|' .. format_uses(uses)
    redis.call('ZADD', KEYS[K_PASSED], now, passed)
    redis.call('HSET', jkey, 'parked', member, 'passed', passed, 'passed_at', now)
  else
    redis.call('HSET', jkey, 'parked', member)
  end
end

-- Move units of `name` (under definition `limit`) in or out of use: per name, and per definition ('=' and
-- the definition: what /metrics shows of a pattern is its names summed). A count that reaches 0 goes.
local function use_units(name, limit, by)
  for _, field in ipairs({name, '=' .. limit}) do
    if redis.call('HINCRBY', KEYS[K_LIMIT_USED], field, by) <= 0 then
      redis.call('HDEL', KEYS[K_LIMIT_USED], field)
    end
  end
end

-- A promoted job takes its slots and its units; what it holds is kept apart from its row (`holds`, only when
-- more than one plain slot), so whatever ends it, even with its row gone, gives back exactly that.
local function take_hold(id, w, uses, used)
  redis.call('HSET', KEYS[K_CONFIG], 'slots_used', used + w)
  for _, u in ipairs(uses) do use_units(u[1], u[3], u[2]) end
  if w ~= 1 or #uses > 0 then redis.call('HSET', KEYS[K_HOLDS], id, w .. '|' .. format_uses(uses)) end
end

-- A job leaves `running`: its slots and units are free again, and the jobs waiting on them are woken.
local function release_hold(id)
  local hold, w = redis.call('HGET', KEYS[K_HOLDS], id), 1
  if hold then
    redis.call('HDEL', KEYS[K_HOLDS], id)
    local ws, uses = string.match(hold, '^(%d+)|(.*)$')
    w = tonumber(ws) or 1
    for _, u in ipairs(parse_uses(uses)) do
      use_units(u[1], u[3], -u[2])
      wake(u[1] .. ' ')
    end
  end
  local used = slots_used() - w
  redis.call('HSET', KEYS[K_CONFIG], 'slots_used', used < 0 and 0 or used)
  if redis.call('EXISTS', KEYS[K_BLOCKED]) == 1 then wake('#slots ') end
end

-- Whether a waiter on `name` needing `need` of it may go back to the queue, `woken` of it having gone back
-- already: 'wake' while there is room for it ('#reserved' always: judged again at its turn); 'stop' when
-- there is not (nobody behind it goes first: queue order); 'skip' when it could never fit as the limit stands
-- (a limit lowered under it, or gone), so it holds up nobody behind it.
local function may_wake(name, need, woken, used, max)
  if name == '#reserved' then return 'wake' end
  local size, in_use = max, used
  if name ~= '#slots' then
    size, in_use = limit_size({name, need, ''}), limit_in_use(name)
  end
  if not size or need > size then return 'skip' end  -- never, as the limit stands: no reason to stop at it
  if in_use + woken + need > size then return 'stop' end
  return 'wake'
end

-- Wake waiters: each entry of `wake` names a range of `blocked` (a name and a space: that name's waiters; a
-- pattern's prefix: every name under it) and where its reading stopped. Waiters go back to `ready` at their
-- own place, in queue order; a name's reading ends when it has no room left (nobody behind can go either),
-- a prefix's at its end. At most `budget` waiters are read; returns whether entries are left.
local function wake_waiters(budget, used, max)
  local entries = redis.call('HRANDFIELD', KEYS[K_WAKE], 8, 'WITHVALUES')
  local woken = {}
  for i = 1, #entries, 2 do
    if budget <= 0 then break end
    local prefix, after = entries[i], entries[i + 1]
    local one_name = string.sub(prefix, -1) == ' '
    local lo = after ~= '' and ('(' .. after) or ('[' .. prefix)
    local members = redis.call('ZRANGEBYLEX', KEYS[K_BLOCKED], lo, '(' .. prefix .. '\255', 'LIMIT', 0, budget)
    local done = #members < budget
    for _, m in ipairs(members) do
      budget = budget - 1
      local name, at, id, need = string.match(m, '^(%S+) (%d+) (%S+) (%d+)$')
      need = tonumber(need) or 1
      local verdict = may_wake(name, need, woken[name] or 0, used, max)
      if verdict == 'wake' then
        woken[name] = (woken[name] or 0) + need
        redis.call('ZREM', KEYS[K_BLOCKED], m)
        redis.call('ZADD', KEYS[K_READY], tonumber(at) - ORDER_OFFSET, id)
      elseif verdict == 'stop' and one_name then
        done = true
        break
      end
      after = m
    end
    if done then
      redis.call('HDEL', KEYS[K_WAKE], prefix)
    else
      redis.call('HSET', KEYS[K_WAKE], prefix, after)
    end
  end
  return redis.call('EXISTS', KEYS[K_WAKE]) == 1
end

-- Fair share: the turn of a job within its priority, by start-time fair queueing over the groups queued at
-- that priority (the ungrouped jobs are one group). `fair` keeps, per priority, the turn promotion has
-- reached ('v:<priority>') and, per group with jobs queued, its newest job's turn ('g:<priority>:<group>').
-- A group's next job comes one turn after its previous, and never at or before the turn reached: so a burst
-- of one group takes one turn in each round, not the queue, and a job handed back (its turn at or before the
-- turn reached) stays ahead of every job queued after it. One group's turns follow enqueue order; equal
-- turns of different groups are ordered by id. A priority nothing reached yet starts after `start` (the
-- enqueue counter, kept from then on: one group's turns are then its jobs' seqs, and jobs queued before
-- priorities existed, scored by seq, keep their place). `turns` caches the batch's reads and writes
-- (`save_turns`).
local function next_turn(turns, priority, group, start)
  local vf, gf = 'v:' .. priority, 'g:' .. priority .. ':' .. group
  local last = turns[gf]
  if last == nil then
    local row = redis.call('HMGET', KEYS[K_FAIR], vf, gf)
    if turns[vf] == nil then
      turns[vf] = tonumber(row[1])
      if not turns[vf] then turns[vf], turns['new ' .. vf] = start, true end  -- kept: `save_turns`
    end
    last = tonumber(row[2]) or false
  end
  local turn = turns[vf] + 1
  if last and last + 1 > turn then turn = last + 1 end
  turns[gf] = turn
  turns['n:' .. gf] = (turns['n:' .. gf] or 0) + 1
  return turn
end

local function save_turns(turns)
  local flat = {}
  for field, turn in pairs(turns) do
    local kind = string.sub(field, 1, 2)
    if kind == 'g:' or (kind == 'v:' and turns['new ' .. field]) then
      flat[#flat + 1] = field; flat[#flat + 1] = turn
    elseif kind == 'n:' then  -- how many of the group's jobs this batch queued (`group_left`)
      redis.call('HINCRBY', KEYS[K_FAIR], 'c:' .. string.sub(field, 5), turn)
    end
  end
  if #flat > 0 then redis.call('HSET', KEYS[K_FAIR], unpack(flat)) end
end

-- A job of `priority` at `order` starts: the turn reached moves up to its turn.
local function advance_turn(priority, order)
  local turn = order + priority * ORDER_BAND
  local vf = 'v:' .. priority
  local reached = tonumber(redis.call('HGET', KEYS[K_FAIR], vf))
  if not reached or reached < turn then redis.call('HSET', KEYS[K_FAIR], vf, turn) end
end


-- A job with no place in the queue (one that waited) takes its turn as a job enqueued now would: its
-- order, written to its row. Its group's count and newest turn are set_state's to move (`group_joined`).
local function take_turn(jkey)
  local row = redis.call('HMGET', jkey, 'priority', 'group')
  local p, turns = tonumber(row[1]) or 0, {}
  local start = tonumber(redis.call('GET', KEYS[K_SEQ])) or 0
  local turn = next_turn(turns, p, row[2] or '', start)
  if turns['new v:' .. p] then redis.call('HSET', KEYS[K_FAIR], 'v:' .. p, start) end
  local order = -p * ORDER_BAND + turn
  redis.call('HSET', jkey, 'order', order)
  return order
end

-- Job `id` (row `jkey`, in state `from`: waiting or paused) goes on: to the queue at a new turn when nothing
-- holds it; cancelled when a job it waited for failed; else back to `waiting` until it is due. Returns the
-- state it is in after.
local function judge_hold(jkey, id, from, actor, now, reason)
  local hold, detail = hold_of(jkey, id, now)
  if hold == 'cancel' then
    -- As that job is now: it may have been retried since it failed, which changes nothing for this one.
    local was = 'failed or was cancelled, and was retried since'
    if redis.call('ZSCORE', KEYS[K_FAILED], detail) then was = 'failed'
    elseif redis.call('ZSCORE', KEYS[K_CANCELLED], detail) then was = 'cancelled' end
    set_state(jkey, id, from, 'cancelled', now)
    redis.call('HSET', jkey, 'finished_at', now, 'error_reason', REASON_DEPENDENCY_FAILED)
    event(jkey, id, from, 'cancelled', REASON_DEPENDENCY_FAILED, 'job ' .. detail .. ' ' .. was, actor, now)
    return 'cancelled'
  elseif hold == 'wait' then
    if from == 'waiting' then
      redis.call('ZADD', KEYS[K_WAITING], detail, id)
    else
      set_state(jkey, id, from, 'waiting', detail)
      event(jkey, id, from, 'waiting', reason, '', actor, now)
    end
    return 'waiting'
  end
  local at = from
  if from == 'paused' and not redis.call('HGET', jkey, 'order') then
    -- Paused while it waited: it has no place in the queue, so fair share never counted it. It joins the
    -- queue as a waiting job does (set_state counts it then); its event still says it was paused.
    set_state(jkey, id, 'paused', 'waiting', now)
    at = 'waiting'
  end
  if at == 'waiting' or not redis.call('HGET', jkey, 'order') then take_turn(jkey) end
  redis.call('HDEL', jkey, 'wait_until', 'wait_reason')
  set_state(jkey, id, at, 'queued', now)
  add_coalesce(jkey, id)
  event(jkey, id, from, 'queued', reason, '', actor, now)
  return 'queued'
end

-- RQ's record of a delivery of job `id` (its job hash, `rqkey`): queued on RQ list `qkey` as attempt
-- `attempt`, as RQ's own enqueue would leave it. A record without RQ's payload (`data`) is written whole
-- first: RQ's constant fields (RQ_JOB_FIELDS, generated from jobpool/rqjob.py) and the per-job ones, the
-- creation time the row's and the description naming the job and its image. That is every job's first
-- delivery (a queued job has no record: a deep queue costs only its rows), a job delivered again after it
-- ended (its record was deleted then: jobpool/rqjob.py), and a record a Redis rollback left partial (RQ
-- skips such an entry in silence: its delivery would never be claimed).
local function rq_record(jkey, rqkey, id, attempt, qkey, now)
  if redis.call('HEXISTS', rqkey, 'data') == 0 then
    local row = redis.call('HMGET', jkey, 'spec', 'created_at')
    local ok, spec = pcall(cjson.decode, row[1] or '')
    local image = ok and type(spec) == 'table' and type(spec.image) == 'string' and spec.image or '?'
    redis.call('HSET', rqkey, 'created_at', iso_utc(tonumber(row[2]) or now),
      'description', 'jobpool ' .. id .. ' (' .. image .. ')', unpack(RQ_JOB_FIELDS))
  end
  redis.call('HSET', rqkey, 'status', 'queued', 'enqueued_at', iso_utc(now),
    'meta', cjson.encode({[RQ_META_ATTEMPT] = attempt}), 'origin', string.sub(qkey, #RQ_QUEUE_KEY_PREFIX + 1))
end

-- Why the head's row cannot be promoted, or nil when it can: its row key is missing or not a hash, the
-- row names another job, or RQ's job key holds something other than a hash.
-- What promotion reads of a row, in one HMGET (`unpromotable`).
local PROMOTE_FIELDS = {'id', 'affinity_queue', 'slots', 'uses', 'priority', 'group', 'order', 'seq', 'attempt',
  'coalesce_key', 'parked', 'passed', 'affinity'}

local function unpromotable(jkey, rqkey, head)
  local kind = key_type(jkey)
  if kind ~= 'hash' then return 'row key is ' .. (kind == 'none' and 'missing' or 'a ' .. kind) end
  local row = redis.call('HMGET', jkey, unpack(PROMOTE_FIELDS))
  if row[1] ~= head then return 'row names job ' .. tostring(row[1] or '(none)') end
  kind = key_type(rqkey)
  if kind ~= 'hash' and kind ~= 'none' then return 'rq job key is a ' .. kind end
  return nil, row
end

-- Take a head that cannot be promoted out of `queued`: a row that is still a hash of this job is failed
-- (so it shows up as failed, not as queued for ever); anything else only leaves the queue.
local function drop_head(jkey, head, why, actor, now)
  if key_type(jkey) == 'hash' and redis.call('HGET', jkey, 'id') == head then
    drop_coalesce(jkey, head)
    set_state(jkey, head, 'queued', 'failed', now)
    redis.call('HSET', jkey, 'finished_at', now, 'error_reason', 'dropped_corrupt_row')
    event(jkey, head, 'queued', 'failed', 'dropped_corrupt_row', why, actor, now)
  else
    redis.call('ZREM', KEYS[K_QUEUED], head)
    redis.call('ZREM', KEYS[K_READY], head)
    event(nil, head, 'queued', '', 'dropped_corrupt_row', why, actor, now)
    -- A job dropped with no row of its own will never run: those waiting for it are cancelled (as
    -- release_waiting.lua and drop_ghost.lua do), not left waiting for ever.
    tell_dependents(head, 'cancelled', now)
  end
end

-- Promote candidates from KEYS[first] on while the queue is unpaused, slots are free and the candidate is
-- still the head of `ready`. Returns (count, why_stopped): paused | full | empty | stale | batch. `cands`,
-- when given, is the candidates' keys instead (a flat list of job:<id>, rq:job:<id>, RQ list taken from
-- KEYS: enqueue's new jobs, less those that coalesced); `out`, when given, collects the ids promoted. A
-- promoted job is pushed on the list its row names (the pool's queue, or its affinity's daemon queue) and
-- RQ's job hash gets that queue as its `origin`; its slot is held whichever list it waits on.
-- Waiters woken first (`wake_waiters`) join `ready` at their place, so a caller's candidates read before may
-- be stale then: it reads again. A head that cannot start now (its weight, a limit, a reservation) is parked
-- (`park`) and the next one is looked at: promotion never waits behind a job that cannot start, and a job
-- parked is not looked at again until what it waits for is given back.
local function promote_candidates(first, actor, now, cands, out)
  local n = math.floor(((cands and #cands) or (NKEYS - first + 1)) / 3)
  if n > PROMOTE_BATCH_LIMIT then n = PROMOTE_BATCH_LIMIT end
  local promoted = 0
  local config = redis.call('HMGET', KEYS[K_CONFIG], 'max_concurrent_jobs', 'slots_used', 'reserved', 'ready_kept',
    'placed_kept')
  if not config[4] then
    -- A pool from before `ready` (its queued jobs in `queued` alone; a new pool's first enqueue marks it):
    -- they are all promotable, and nothing is parked before this first promotion, so `ready` becomes
    -- `queued` whole, once.
    redis.call('ZUNIONSTORE', KEYS[K_READY], 2, KEYS[K_READY], KEYS[K_QUEUED], 'AGGREGATE', 'MIN')
    redis.call('HSET', KEYS[K_CONFIG], 'ready_kept', 1)
  end
  if not config[5] and redis.call('ZCARD', KEYS[K_RUNNING]) == 0 then
    -- No job runs: every job that runs from now on is placed as it starts (place_running), so `status` may
    -- read where they are from the placement; until then (a pool from before it, with jobs running) it reads
    -- their rows (jobpool/status/read.py).
    redis.call('HSET', KEYS[K_CONFIG], 'placed_kept', 1)
  end
  if redis.call('EXISTS', KEYS[K_PAUSED]) == 1 then return promoted, 'paused' end
  local max, used = tonumber(config[1]) or DEFAULT_SLOTS, slots_used(config[2])
  local more_to_wake = redis.call('EXISTS', KEYS[K_WAKE]) == 1 and wake_waiters(PROMOTE_BATCH_LIMIT, used, max)
  local r = reservation(now, max, config[3])
  for i = 0, n - 1 do
    if used >= max then return promoted, 'full' end
    local head = redis.call('ZRANGE', KEYS[K_READY], 0, 0)[1]
    if not head then break end
    local jkey, rqkey, qkey = KEYS[first + 3 * i], KEYS[first + 3 * i + 1], KEYS[first + 3 * i + 2]
    if cands then jkey, rqkey, qkey = cands[3 * i + 1], cands[3 * i + 2], cands[3 * i + 3] end
    if not is_row_key(jkey, head) then return promoted, 'stale' end
    local why, row = unpromotable(jkey, rqkey, head)
    if why then
      drop_head(jkey, head, why, actor, now)
    else
      local routed = row[2]
      if not routed or routed == '' then routed = KEYS[K_RQ_QUEUE] end
      if qkey ~= routed then return promoted, 'stale' end
      local w, uses, p = tonumber(row[3]) or 1, parse_uses(row[4]), tonumber(row[5]) or 0
      local order = tonumber(row[7]) or tonumber(row[8]) or 0
      local wait = blocker(w, uses, used, max)
      if not wait and held_back(r, head, p, w, uses, used, max) then wait = '#reserved' end
      if wait then
        park(jkey, head, wait, order, p, w, uses, now)
      else
        local attempt = whole(row[9]) + 1
        -- set_state from queued to running, with what was read above: out of the coalesce entry, the queue,
        -- `ready`, and any parking.
        if row[10] and row[10] ~= '' then drop_coalesce_id(row[10], head) end
        redis.call('ZREM', KEYS[K_QUEUED], head)
        redis.call('ZREM', KEYS[K_READY], head)
        unpark(jkey, row[11], row[12])
        if row[7] then group_left(p, row[6] or '') end
        redis.call('ZADD', KEYS[K_RUNNING], now, head)
        take_hold(head, w, uses, used)
        used = used + w
        advance_turn(p, order)
        redis.call('HSET', jkey, 'state', 'running', 'attempt', attempt, 'promoted_at', now, 'owner_boot', '',
          'container_id', '', 'daemon_id', '', 'daemon_queue', '', 'identity', '', 'claimed_at', '')
        -- RQ's record of the delivery, and the delivery visible to workers in this same step, as RQ's own
        -- enqueue would make them.
        rq_record(jkey, rqkey, head, attempt, qkey, now)
        redis.call('RPUSH', qkey, head)
        redis.call('SADD', KEYS[K_RQ_QUEUES], qkey)
        -- Promoted to wait for the daemon holding its checkpoint: placed under it until claimed.
        if row[13] and row[13] ~= '' then place_running(jkey, head) end
        event(jkey, head, 'queued', 'running', 'promoted', 'attempt=' .. attempt, actor, now)
        promoted = promoted + 1
        if out then out[#out + 1] = head end
        if r and r.id == head then r = nil end
      end
    end
  end
  local waking = more_to_wake or WOKEN.any
  if not waking and redis.call('ZCARD', KEYS[K_READY]) == 0 then return promoted, 'empty' end
  if used >= max then return promoted, 'full' end
  return promoted, 'batch'
end

-- A job that ran on a daemon and goes back resumable (to `queued` or `paused`) by an exit of its own
-- process: its checkpoint volume is on that daemon (workers/executors/docker.py), so its next attempt
-- belongs there. Recorded as `affinity` (the daemon's identity, shown) and `affinity_queue` (that daemon's
-- RQ list, written by set_container.lua as `daemon_queue`); a row with no daemon queue recorded (a subprocess
-- job, a launch that never recorded one) keeps what it had.
local function note_affinity(jkey, to)
  if to ~= 'queued' and to ~= 'paused' and to ~= 'waiting' then return end
  local row = redis.call('HMGET', jkey, 'daemon_id', 'daemon_queue')
  if row[1] and row[1] ~= '' and row[2] and row[2] ~= '' then
    redis.call('HSET', jkey, 'affinity', row[1], 'affinity_queue', row[2])
  end
end

-- A failed attempt of the job's own (a non-zero exit, or REASON_TIMEOUT) that its spec retries: the retry
-- it becomes, or nil. Its row keeps the policy (enqueue.lua): `retries` (how many), `retry_delay_ms` (the
-- first delay, doubled per retry after it, at most RETRY_DELAY_MAX_MS), `retry_on` (the exit codes retried,
-- ',code,...,'; none: any) and `retries_used`. The delay gets up to a fifth off, from the server clock's
-- microseconds, so jobs failing together do not come back together. Returns the evidence of the retry and
-- when it is due; the row records both.
local function retry_of(jkey, reason, now)
  local code = string.match(reason or '', '^exit_code_(%-?%d+)$')
  if reason ~= REASON_TIMEOUT and not code then return nil end
  local row = redis.call('HMGET', jkey, 'retries', 'retries_used', 'retry_delay_ms', 'retry_on')
  local most, used = whole(row[1]), whole(row[2])
  if used >= most then return nil end
  if code and row[4] and row[4] ~= '' and not string.find(row[4], ',' .. code .. ',', 1, true) then return nil end
  used = used + 1
  local delay = whole(row[3]) * 2 ^ (used - 1)
  if delay > RETRY_DELAY_MAX_MS then delay = RETRY_DELAY_MAX_MS end
  local micros = tonumber(redis.call('TIME')[2]) or 0
  delay = math.floor(delay - delay * micros / 5e6)
  redis.call('HSET', jkey, 'retries_used', used, 'wait_until', now + delay, 'wait_reason', 'retry')
  return string.format('retry %d of %d in %d s after %s', used, most, math.floor(delay / 1000 + 0.5), reason),
    now + delay
end

-- Release a running job's slots and units into state `to`, or `waiting` when `to` is a failure its spec
-- retries (`retry_of`) and the caller did not say `final` (an eviction, a crash: never retried, whatever
-- words their reason holds); returns the state it is in after. A job handed back to `queued` keeps its
-- order, so it returns to its original place; a paused job keeps it too, for when it is resumed.
local function end_running(jkey, lease_key, id, to, reason, evidence, actor, now, final)
  -- What it holds is given back only if it holds a slot (a row that says running but is not in `running`
  -- gives nothing back twice), and first: a pool from before weights counts its slots from `running`.
  if redis.call('ZSCORE', KEYS[K_RUNNING], id) then release_hold(id) end
  redis.call('ZREM', KEYS[K_RUNNING], id)
  redis.call('DEL', lease_key)
  redis.call('HSET', jkey, 'owner_boot', '', 'pause_requested', '0', 'cancel_requested', '0')
  local score = now
  local retry, due
  if to == 'failed' and not final then retry, due = retry_of(jkey, reason, now) end
  redis.call('HSET', jkey, 'error_reason', to == 'succeeded' and '' or reason)
  if retry then
    -- Waits for its delay, then takes a new turn in the queue (judge_hold) as a new attempt; its checkpoint
    -- is where it ran, as for a handback.
    note_affinity(jkey, 'waiting')
    redis.call('HDEL', jkey, 'order')
    to, reason, score = 'waiting', 'retry', due
    evidence = evidence ~= '' and (retry .. '; ' .. evidence) or retry
  elseif to ~= 'queued' and to ~= 'paused' then
    redis.call('HSET', jkey, 'finished_at', now)
  end
  set_state(jkey, id, '', to, score)
  place_running(nil, id)  -- it runs no more
  if to == 'queued' then add_coalesce(jkey, id) end
  if to == 'paused' then redis.call('HSET', jkey, 'paused_at', now) end
  event(jkey, id, 'running', to, reason, evidence, actor, now)
  -- A promoted job that no worker took yet must not be run by a late delivery: forget it in RQ's list.
  redis.call('LREM', KEYS[K_RQ_QUEUE], 0, id)
  return to
end

-- How a container's exit ends a job; returns (state, reason, spend) where `spend` says one unit of recovery
-- budget is spent (the caller counts it in recovery_attempts). `cause` says what ended it: nil or '' its own
-- process; 'oom' the kernel's OOM killer (Docker's OOMKilled); 'crashed' its daemon or host, with `reason`
-- naming the evidence (jobpool/exits.py decides which). Exit 0 is success whatever was asked or seen;
-- otherwise a persisted cancel or pause wins; an OOM kill fails (REASON_OOM_KILLED: the user's to act on,
-- even if a stop was asked meanwhile); an exit after its watcher asked it to stop (`interrupted`: a drain,
-- or a pause or cancel request since withdrawn) hands the job back to its place, no recovery budget spent; a
-- crash is recovered as a vanished container is (reconcile_apply.lua 'absent'): queued again at its place
-- while recovery budget `budget` is left, else failed with `reason` (never retried: retries are for the job's
-- own failures); an attempt its watcher stopped for its time limit (time_out.lua marked it) fails with
-- REASON_TIMEOUT; anything else is a failure. A failure may still become a retry (end_running). The
-- handback's reason names a pause of this attempt that a resume withdrew (resume_job.lua records
-- `pause_withdrawn` = attempt): 'pause_withdrawn_handback'; otherwise 'shutdown_handback'.
local function verdict_for_exit(jkey, code, interrupted, cause, reason, budget)
  if code == 0 then return 'succeeded', 'exit_0', false end
  if redis.call('HGET', jkey, 'cancel_requested') == '1' then return 'cancelled', 'cancel_requested', false end
  if redis.call('HGET', jkey, 'pause_requested') == '1' then return 'paused', 'pause_requested', false end
  if cause == 'oom' then return 'failed', REASON_OOM_KILLED, false end
  -- Stopped by its watcher for running past its time limit (time_out.lua marks the attempt first).
  local marks = redis.call('HMGET', jkey, 'timed_out', 'attempt')
  if marks[1] and marks[1] ~= '' and marks[1] == marks[2] then return 'failed', REASON_TIMEOUT, false end
  if interrupted then
    local row = redis.call('HMGET', jkey, 'pause_withdrawn', 'attempt')
    if row[1] and row[1] ~= '' and row[1] == row[2] then return 'queued', 'pause_withdrawn_handback', false end
    return 'queued', 'shutdown_handback', false
  end
  if cause == 'crashed' then
    if whole(redis.call('HGET', jkey, 'recovery_attempts')) < (tonumber(budget) or 0) then
      return 'queued', reason, true
    end
    return 'failed', reason, false
  end
  return 'failed', 'exit_code_' .. code, false
end

-- Whether boot `boot` still owns attempt `attempt` of the row `jkey`: 0, or an error code and its detail (the
-- job's id when there is no row, else the row's state), for the caller's error reply {code, detail}.
local function fence(jkey, boot, attempt)
  if redis.call('EXISTS', jkey) == 0 then return E_NOT_FOUND, string.match(jkey, 'job:([^:]*)$') or '' end
  local row = redis.call('HMGET', jkey, 'state', 'owner_boot', 'attempt')
  if boot == '' or row[1] ~= 'running' or row[2] ~= boot or row[3] ~= attempt then
    return E_NOT_OWNER, tostring(row[1])
  end
  return 0, ''
end

local function lift_gone(gone, returned, daemon, how, by, note, keep, reason, now)
  -- Lift the declaration that `daemon` is gone for good (forget_daemon.lua), if there is one: its entry in
  -- `gone` (the gone_daemons hash) goes, and what it was is kept in `returned` (the returned_daemons zset,
  -- scored by when it was lifted, entries older than `keep` ms trimmed) so that `status` tells the operator
  -- (jobpool/status/health.py): jobs judged absent on that word while the daemon was alive may have run twice.
  -- `how` is 'published' (publish_inventory.lua: it publishes again, so it is evidently not gone) or
  -- 'withdrawn' (unforget_daemon.lua: by hand). Records a pool-wide `reason` event. Returns true if lifted.
  if key_type(gone) ~= 'hash' or redis.call('HEXISTS', gone, daemon) == 0 then return false end
  local ok, was = pcall(cjson.decode, redis.call('HGET', gone, daemon))
  if not ok or type(was) ~= 'table' then was = {} end
  redis.call('HDEL', gone, daemon)
  if key_type(returned) ~= 'zset' and key_type(returned) ~= 'none' then redis.call('DEL', returned) end
  redis.call('ZREMRANGEBYSCORE', returned, '-inf', now - keep)
  redis.call('ZADD', returned, now, cjson.encode({daemon = daemon, how = how, by = by, note = note, at = now,
    forgotten_at = tonumber(was.at), forgotten_by = tostring(was.actor or ''),
    forgotten_note = tostring(was.note or '')}))
  event(nil, '', '', '', reason, 'daemon=' .. daemon .. ' declared gone by ' .. tostring(was.actor or '?')
    .. (note ~= '' and ('; ' .. note) or ''), by, now)
  return true
end

-- ---- Daemon marks (jobpool/fleet/daemonmark.py; docs/architecture.md "The daemon's identity") ------------
-- Enter process `id` in `of_daemon`, the index of its daemon identity, scored by `expires`, when its record
-- expires; entries past their score (at `at`, now) go, and the index expires with its last entry. With
-- `limit`, returns the first `limit` ids once so (what a process comparing marks reads of its peers:
-- daemon_mark_round.lua) and the index's size, the entries read in the same call that finds whether any is
-- past its score (most periods none is: then neither a trim nor a read of the last entry apart).
local function index_mark(of_daemon, id, at, expires, limit)
  local added = redis.pcall('ZADD', of_daemon, expires, id)
  if type(added) == 'table' and added.err then  -- of another type (edited by hand): made anew
    redis.call('DEL', of_daemon)
    redis.call('ZADD', of_daemon, expires, id)
  end
  if not limit then
    redis.call('ZREMRANGEBYSCORE', of_daemon, '-inf', at)
    redis.call('PEXPIREAT', of_daemon, tonumber(redis.call('ZRANGE', of_daemon, -1, -1, 'WITHSCORES')[2]))
    return nil, nil
  end
  local read = redis.call('ZRANGE', of_daemon, 0, limit - 1, 'WITHSCORES')
  if tonumber(read[2]) <= at then  -- the first, lowest, is past its score: trimmed, read again
    redis.call('ZREMRANGEBYSCORE', of_daemon, '-inf', at)
    read = redis.call('ZRANGE', of_daemon, 0, limit - 1, 'WITHSCORES')
  end
  local ids = {}
  for i = 1, #read, 2 do ids[#ids + 1] = read[i] end
  local size, last = #ids, tonumber(read[#read])
  if size >= limit then
    size = redis.call('ZCARD', of_daemon)
    last = tonumber(redis.call('ZRANGE', of_daemon, -1, -1, 'WITHSCORES')[2])
  end
  redis.call('PEXPIREAT', of_daemon, last)
  return ids, size
end

-- A process's mark record, written by daemon_mark.lua (no collision reported: the common period, kept short
-- since Redis runs a script's whole text each call), daemon_mark_round.lua (the same, and its peers read) or
-- daemon_collision.lua (one reported, recorded in shared_daemons). ARGV: process id, record ttl ms, forget ms
-- (entries of `index` older than this are trimmed), scan ms (how long the turn to index unindexed records
-- lasts; 0: no turn taken), then field, value, ... The record enters `index` (by refresh; its entries older
-- than forget ms are trimmed by the holder of the scan turn, a caller that takes none, or a process's first
-- write: not at every call) and `of_daemon`, the index of its `daemon_id` (index_mark). It says `indexed`:
-- records without it (an earlier release's) are indexed by whoever holds the turn (`scan_turn`,
-- daemon_mark_index.lua). Its `v` (its writer's digest of the other fields) is also kept in `vkey`, a string
-- that lives as long as the record (none when the record has no `v`): a process comparing marks reads its
-- peers' digests in one MGET (daemon_mark_round.lua), so every writer of a record writes or removes it too. A
-- record that already holds every field being written (a steady process's, each period) gets only its `at`
-- then; any other is written whole, so a field edited by hand (its `v` kept) is put back within a period and
-- a peer new to the record never reads it (forget_collision.lua, the one script that edits a record
-- otherwise, removes its `v`). The field pairs end at ARGV[last] (NARGV
-- when not given); `limit`, see index_mark. Returns at, daemon, collision, took (1 when the turn was taken),
-- and index_mark's ids and size; or nil and why for bad arguments (nothing written).
local function write_mark(rec, vkey, index, of_daemon, scan_turn, collision_allowed, last, limit)
  last = last or NARGV
  local id, ttl, forget, scan = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  if id == '' or not ttl or ttl <= 0 or ttl ~= math.floor(ttl) or not forget or not scan or scan < 0
      or scan ~= math.floor(scan) or last < 4 or (last - 4) % 2 ~= 0 then
    return nil, 'daemon mark'
  end
  local fields, names = {'indexed', '1'}, {'indexed'}
  local daemon, collision, digest = '', '', nil
  for i = 5, last, 2 do
    fields[#fields + 1] = ARGV[i]
    fields[#fields + 1] = ARGV[i + 1]
    names[#names + 1] = ARGV[i]
    if ARGV[i] == 'daemon_id' then daemon = ARGV[i + 1] end
    if ARGV[i] == 'collision' then collision = ARGV[i + 1] end
    if ARGV[i] == 'v' and ARGV[i + 1] ~= '' then digest = ARGV[i + 1] end
  end
  local prefix = string.sub(index, 1, -#'daemon_marks' - 1)
  if daemon == '' or of_daemon ~= prefix .. 'daemon_marks_of:' .. daemon then
    return nil, 'daemon mark index'
  end
  if (collision ~= '') ~= collision_allowed then return nil, 'collision' end
  local at = now_ms()
  local held = digest and redis.pcall('HMGET', rec, unpack(names))  -- an error reply: another type
  local same = held and not held.err
  if same then
    for i = 1, #names do
      if held[i] ~= fields[2 * i] then same = false break end
    end
  end
  if same then
    redis.call('HSET', rec, 'at', at)
  else
    redis.call('DEL', rec)
    fields[#fields + 1] = 'at'
    fields[#fields + 1] = at
    redis.call('HSET', rec, unpack(fields))
  end
  redis.call('PEXPIRE', rec, ttl)
  if digest then redis.call('SET', vkey, digest, 'PX', ttl) else redis.call('DEL', vkey) end
  local took = 0
  if scan > 0 and redis.call('SET', scan_turn, id, 'NX', 'PX', scan) then took = 1 end
  local new_id = redis.call('ZADD', index, at, id)
  -- The pool-wide index is trimmed by the turn's holder (one process a turn), by a caller that takes none,
  -- and at each process's first write (so the entries left over never outnumber the processes that ended
  -- since the last new one, whatever becomes of the turn's key).
  if took == 1 or scan == 0 or new_id == 1 then redis.call('ZREMRANGEBYSCORE', index, '-inf', at - forget) end
  local ids, size = index_mark(of_daemon, id, at, at + ttl, limit)
  return at, daemon, collision, took, ids, size
end
