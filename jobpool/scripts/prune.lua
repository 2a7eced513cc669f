--[[ prune
Pool keys: config coalesce events succeeded failed cancelled metrics dependents
Settings: events_maxlen
KEYS[1]     rq:finished:<queue>   KEYS[2] rq:failed:<queue>   (RQ's registries: RQ's own keys)
KEYS[3..]   per job, 7 keys: job:<id>, rq:job:<id>, rq:results:<id>, lease:<id>, adopt:<id>, joblog:<id>, and the RQ
             hash of the adoption request adopt:<id> names (rq:job:, ADOPT_RQ_PREFIX, <id>, '-', ...),
             '' for none
ARGV[1] state (succeeded | failed | cancelled)
ARGV[2] keep: the newest N of that state are kept (0 = no count cap)
ARGV[3] cutoff ms: those that finished before it are removed (0 = no age cap)
ARGV[4] actor   ARGV[5..] the jobs' ids, in the order of their keys
Returns {0, removed, id, id, ...}; -6 for a state that is not terminal or keys that do not match the ids.
Remove finished jobs past retention (jobpool/retention.py reads the oldest of each index). Each
job is judged again here, atomically: it must still be in that state's index, its row must say that
state, and it must be past a cap now. A job that is queued, running or paused is never touched, nor one a
waiting job waits for (`dependents`), and a job
that finished a moment ago is the newest in its index, so it is kept. Everything the job left goes with its
row: RQ's hash and result stream, RQ's registry entries, its lease and adoption pointer, its live log, the RQ hash of the
adoption request that pointer still names (one never run, or whose adopter was killed, has no TTL), and a
coalesce entry still naming it. One event records the batch (not one per job: pruning must not fill the stream it caps).
]]
local state, keep, cutoff, actor = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local index = ({succeeded = K_SUCCEEDED, failed = K_FAILED, cancelled = K_CANCELLED})[state]
if not TERMINAL_STATE[state] or not keep or not cutoff then return {E_BAD_ARG, state} end
local first, per = 3, 7
local n = NARGV - 4
if NKEYS ~= first - 1 + per * n then return {E_BAD_ARG, 'keys'} end
-- The keys must be this id's, or a caller's slip would delete another job's: compare names, call none.
local prefix = string.sub(KEYS[K_CONFIG], 1, -#'config' - 1)
for i = 0, n - 1 do
  local id, k = ARGV[5 + i], first + per * i
  if KEYS[k] ~= prefix .. 'job:' .. id or KEYS[k + 1] ~= 'rq:job:' .. id or KEYS[k + 2] ~= 'rq:results:' .. id
      or KEYS[k + 3] ~= prefix .. 'lease:' .. id or KEYS[k + 4] ~= prefix .. 'adopt:' .. id
      or KEYS[k + 5] ~= prefix .. 'joblog:' .. id
      or (KEYS[k + 6] ~= '' and string.sub(KEYS[k + 6], 1, #'rq:job:' + #ADOPT_RQ_PREFIX + #id + 1)
          ~= 'rq:job:' .. ADOPT_RQ_PREFIX .. id .. '-') then
    return {E_BAD_ARG, 'keys of ' .. id}
  end
end
local removed = {}
for i = 0, n - 1 do
  local id = ARGV[5 + i]
  local jkey = KEYS[first + per * i]
  local score = redis.call('ZSCORE', KEYS[index], id)
  local kind = key_type(jkey)
  local row = kind == 'hash' and redis.call('HMGET', jkey, 'state', 'coalesce_key') or {}
  -- An index entry whose row is gone names no job at all: it goes too, or it would stay at the head for ever.
  -- A job that a waiting job waits for stays: that job's release and show read it (_lib.lua, "Time and
  -- dependencies").
  local needed = #redis.call('ZRANGEBYLEX', KEYS[K_DEPENDENTS], '[' .. id .. ' ', '(' .. id .. ' \255', 'LIMIT', 0, 1) > 0
  if score and (row[1] == state or kind == 'none') and not needed then
    local rank = redis.call('ZREVRANK', KEYS[index], id)
    if (keep > 0 and rank >= keep) or (cutoff > 0 and tonumber(score) < cutoff) then
      local ck = row[2]
      if ck and ck ~= '' then drop_coalesce_id(ck, id) end
      redis.call('ZREM', KEYS[index], id)
      redis.call('ZREM', KEYS[1], id)
      redis.call('ZREM', KEYS[2], id)
      local k = first + per * i
      -- The adoption request's hash goes only while the pointer still names it (read by the caller before).
      if KEYS[k + 6] ~= '' and redis.call('GET', KEYS[k + 4]) == string.sub(KEYS[k + 6], #'rq:job:' + 1) then
        redis.call('DEL', KEYS[k + 6])
      end
      redis.call('DEL', jkey, KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5])
      removed[#removed + 1] = id
    end
  end
end
if #removed > 0 then
  event(nil, '', '', '', 'pruned', state .. ' ' .. #removed, actor, now_ms())
end
return {0, #removed, unpack(removed)}
