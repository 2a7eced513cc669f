--[[ schedule_remove
Pool keys: schedules schedule_ticks schedule_next events metrics
Settings: events_maxlen
KEYS        none of its own: its pool keys only
ARGV[1] name   ARGV[2] actor
Returns {0}; -1 when there is no schedule of that name.
Remove a schedule: it fires no more (a fire already read refuses: its definition is gone). The jobs it made
stay, each naming it and its tick.
]]
local name, actor = ARGV[1], ARGV[2]
if redis.call('HDEL', KEYS[K_SCHEDULES], name) == 0 then return {E_NOT_FOUND, name} end
redis.call('HDEL', KEYS[K_SCHEDULE_TICKS], name)
redis.call('ZREM', KEYS[K_SCHEDULE_NEXT], name)
event(nil, '', '', '', 'schedule_removed', 'schedule ' .. name, actor, now_ms())
return {0}
