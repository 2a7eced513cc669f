--[[ schedule_pause
Pool keys: schedules schedule_ticks schedule_next events metrics
Settings: events_maxlen
KEYS        none of its own: its pool keys only
ARGV[1] name   ARGV[2] '1' to pause, '0' to resume   ARGV[3] actor
Returns {0, 1 if it changed else 0 (paused or running already)}; -1 when there is no schedule of that name;
-6 for a definition that does not read.
Pause a schedule (it leaves `schedule_next`: nothing fires it) or resume one. A resumed schedule fires no tick
of its pause: its watermark becomes now (or stays, if later), and it is due at once, so a supervisor's next
look (jobpool/schedules.py) finds its next tick and moves it there.
]]
local name, pause, actor = ARGV[1], ARGV[2] == '1', ARGV[3]
local def = redis.call('HGET', KEYS[K_SCHEDULES], name)
if not def then return {E_NOT_FOUND, name} end
local ON, OFF = '{"paused":true,', '{"paused":false,'
local was
if string.sub(def, 1, #ON) == ON then was = true elseif string.sub(def, 1, #OFF) == OFF then was = false
else return {E_BAD_ARG, 'definition'} end
if was == pause then return {0, 0} end
local now = now_ms()
if pause then
  redis.call('HSET', KEYS[K_SCHEDULES], name, ON .. string.sub(def, #OFF + 1))
  redis.call('ZREM', KEYS[K_SCHEDULE_NEXT], name)
  event(nil, '', '', '', 'schedule_paused', 'schedule ' .. name, actor, now)
  return {0, 1}
end
redis.call('HSET', KEYS[K_SCHEDULES], name, OFF .. string.sub(def, #ON + 1))
local last = redis.call('HGET', KEYS[K_SCHEDULE_TICKS], name) or ''
local t, rest = string.match(last, '^(%d+)(|.*)$')
if not t or tonumber(t) < now then t = now end
redis.call('HSET', KEYS[K_SCHEDULE_TICKS], name, t .. (rest or '||'))
redis.call('ZADD', KEYS[K_SCHEDULE_NEXT], now, name)
event(nil, '', '', '', 'schedule_resumed', 'schedule ' .. name, actor, now)
return {0, 1}
