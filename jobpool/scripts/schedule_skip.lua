--[[ schedule_skip
Pool keys: schedules schedule_ticks schedule_next events metrics
Settings: events_maxlen
KEYS        none of its own: its pool keys only
ARGV[1] name   ARGV[2] its watermark as the caller read it (the tick of `schedule_ticks`, ms; '' for none)
ARGV[3] the tick to record as skipped, ms ('' for none: only its next tick moves)   ARGV[4] its next tick ms
ARGV[5] why (the event's evidence)   ARGV[6] actor
Returns {0}; -1 when there is no schedule of that name; -2 when it is paused; -5 when its watermark is no longer
the one read (another supervisor handled it first); -6 for a time that does not read, or a tick not after
the watermark.
A supervisor's step of a schedule that makes no job (jobpool/schedules.py): a tick skipped (misfire 'skip'
after ticks were missed, or a job the pool refused) is recorded as the watermark, with its last job kept and
a `schedule_skipped` event; or, with no tick, the schedule's next tick is only set (it was due too early: a
resume, a replace). Compare-and-set on the watermark, so a stale read changes nothing.
]]
local name, seen, tick, later, why, actor = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if not string.match(seen, '^%d*$') or not string.match(later, '^%d+$') or
    (tick ~= '' and not string.match(tick, '^%d+$')) then
  return {E_BAD_ARG, 'time'}
end
local def = redis.call('HGET', KEYS[K_SCHEDULES], name)
if not def then return {E_NOT_FOUND, name} end
if string.sub(def, 1, #'{"paused":true,') == '{"paused":true,' then return {E_INVALID_STATE, 'paused'} end
local last = redis.call('HGET', KEYS[K_SCHEDULE_TICKS], name) or ''
local t, job = string.match(last, '^(%d+)|([^|]*)|')
if (t or '') ~= seen then return {E_EXISTS, 'tick'} end
job = job or ''
if tick ~= '' then
  if seen ~= '' and tonumber(tick) <= tonumber(seen) then return {E_BAD_ARG, 'tick'} end
  local now = now_ms()
  redis.call('HSET', KEYS[K_SCHEDULE_TICKS], name, tick .. '|' .. job .. '|' .. now)
  event(nil, job, '', '', 'schedule_skipped', 'schedule ' .. name .. ' tick ' .. iso_utc(tonumber(tick)) .. ': '
    .. why, actor, now)
end
redis.call('ZADD', KEYS[K_SCHEDULE_NEXT], later, name)
return {0}
