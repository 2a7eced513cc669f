--[[ daemon_collision
Pool keys: events metrics
Settings: events_maxlen
KEYS[1]     daemon_mark:<process id>   KEYS[2] daemon_marks
KEYS[3]     daemon_marks_of:<daemon identity> (the record's `daemon_id`)   KEYS[4] daemon_marks_scan
KEYS[5]     daemon_mark_v:<process id> (as daemon_mark.lua's)   KEYS[6] shared_daemons
ARGV[1] process id   ARGV[2] record ttl ms   ARGV[3] forget ms   ARGV[4] scan ms   ARGV[5..NARGV] field, value,
... (as daemon_mark.lua's), `collision` not empty
Returns {0, at, recorded, scan} (recorded: 1 when this call recorded a new collision; the rest as
daemon_mark.lua's); -6 bad arguments.
Register (or refresh) one process that marked its Docker daemon and concluded that two daemons share its
`daemon_id` (its record's `collision`), as daemon_mark.lua does, and remember the collision in
shared_daemons (daemon identity -> JSON {line, at, by}), the first report kept, with a pool-wide
`daemon_collision` event: it stands, whatever becomes of the processes, until an operator clears it
(forget_collision.lua).
]]
local shared = KEYS[6]
local at, daemon, collision, took = write_mark(KEYS[1], KEYS[5], KEYS[2], KEYS[3], KEYS[4], true)
if not at then return {E_BAD_ARG, daemon} end
if key_type(shared) ~= 'hash' and key_type(shared) ~= 'none' then redis.call('DEL', shared) end
local recorded = redis.call('HSETNX', shared, daemon, cjson.encode({line = collision, at = at, by = ARGV[1]}))
if recorded == 1 then
  event(nil, '', '', '', 'daemon_collision', 'daemon=' .. daemon .. '; ' .. collision, 'process ' .. ARGV[1], at)
end
return {0, at, recorded, took}
