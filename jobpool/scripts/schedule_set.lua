--[[ schedule_set
Pool keys: schedules schedule_ticks schedule_next events metrics
Settings: events_maxlen
KEYS        none of its own: its pool keys only
ARGV[1] name   ARGV[2] its definition (JSON, jobpool/schedules.py `Definition`: it starts '{"paused":false,')
ARGV[3] now ms (the Redis time the caller read, and computed the next tick from)   ARGV[4] its next tick ms
ARGV[5] '1' to replace a schedule of that name, '0' to refuse it   ARGV[6] actor
Returns {0, 1 if it replaced one else 0}; -5 when a schedule of that name exists and ARGV[5] is '0'; -6 for a
name, definition or time that does not read.
Add a schedule, or replace one's definition (jobpool/schedules.py). Its watermark (`schedule_ticks`: 'tick|
job|at', the tick its fires must be after) becomes now, or stays where it is if later: the first tick fired
is the first after this call, and no tick fired before a replace fires again. A replaced schedule keeps its
last job (overlap 'skip' still sees it) and its pause: a paused one stays paused, out of `schedule_next`.
]]
local name, def, now, later, replace, actor = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if #name > LIMIT_NAME_MAX_CHARS or not string.match(name, '^[' .. LIMIT_NAME_CHARS .. ']+$') then
  return {E_BAD_ARG, 'name'}
end
local UNPAUSED = '{"paused":false,'
if string.sub(def, 1, #UNPAUSED) ~= UNPAUSED then return {E_BAD_ARG, 'definition'} end
if not string.match(now, '^%d+$') or not string.match(later, '^%d+$') then return {E_BAD_ARG, 'time'} end
local old = redis.call('HGET', KEYS[K_SCHEDULES], name)
if old and replace ~= '1' then return {E_EXISTS, name} end
local tick, job, at = now, '', ''
local last = redis.call('HGET', KEYS[K_SCHEDULE_TICKS], name)
if old and last then
  local t, j, a = string.match(last, '^(%d+)|([^|]*)|(.*)$')
  if t then
    job, at = j, a
    if tonumber(t) > tonumber(now) then tick = t end
  end
end
local paused = old and string.sub(old, 1, #'{"paused":true,') == '{"paused":true,'
if paused then def = '{"paused":true,' .. string.sub(def, #UNPAUSED + 1) end
redis.call('HSET', KEYS[K_SCHEDULES], name, def)
redis.call('HSET', KEYS[K_SCHEDULE_TICKS], name, tick .. '|' .. job .. '|' .. at)
if paused then
  redis.call('ZREM', KEYS[K_SCHEDULE_NEXT], name)
else
  redis.call('ZADD', KEYS[K_SCHEDULE_NEXT], later, name)
end
event(nil, '', '', '', 'schedule_set', 'schedule ' .. name .. (old and ' replaced' or ' added') ..
  (paused and ' (paused)' or ''), actor, now_ms())
return {0, old and 1 or 0}
