--[[ limit
Pool keys: config paused queued running coalesce events rq_queue rq_queues paused_jobs succeeded failed cancelled metrics ready
           blocked passed wake fair limits limit_used holds seq waiting dependents deps running_by running_daemons running_on
Settings: default_slots events_maxlen reserve_after_ms
KEYS[1..]   promotion candidates
ARGV[1] name (a limit name, or a prefix and '*': a pattern)   ARGV[2] size (0..MAX_LIMIT), '' to remove it
ARGV[3] actor
Returns {0, old size ('' for none), promoted, why_stopped}; -6 for a name or size that does not read, -1 for
removing a limit there is none of. A removal wakes the names it covered too: another limit may cover them.
Set, change or remove a named limit (docs/architecture.md "Order and limits"). Lowering it stops nothing: new
starts wait until its use is below it. Raising it, or setting one that covers names jobs wait on, wakes
those waiters and promotes. Removing it stops nothing either; a job waiting on a name no limit covers any more
waits until one does (never "unlimited").
]]
local name, size, actor = ARGV[1], ARGV[2], ARGV[3]
local prefix = string.match(name, '^(.+)%*$')
local plain = prefix or name
if #plain > LIMIT_NAME_MAX_CHARS or not string.match(plain, '^[' .. LIMIT_NAME_CHARS .. ']+$') then
  return {E_BAD_ARG, 'name'}
end
local n = tonumber(size)
if size ~= '' and (not n or n < 0 or n > MAX_LIMIT or n ~= math.floor(n)) then return {E_BAD_ARG, 'size'} end
local old = redis.call('HGET', KEYS[K_LIMITS], name)
local now = now_ms()
if size == '' then
  if not old then return {E_NOT_FOUND, name} end
  redis.call('HDEL', KEYS[K_LIMITS], name)
  event(nil, '', '', '', 'limit_removed', name .. ' was ' .. old, actor, now)
else
  redis.call('HSET', KEYS[K_LIMITS], name, n)
  event(nil, '', '', '', 'limit_set', name .. ' ' .. (old or 'none') .. '->' .. n, actor, now)
end
-- Its waiters may go: a raise, a new limit over names jobs wait on, or one removed while another covers them
-- (a broader pattern): a name's own (a name and a space), or every name under a pattern (its prefix).
if size == '' or not old or n > tonumber(old) then
  redis.call('HSET', KEYS[K_WAKE], prefix or (name .. ' '), '')
end
local promoted, why = promote_candidates(1, actor, now)
return {0, old or '', promoted, why}
