--[[ daemon_unmark
Pool keys: none
KEYS[1]     daemon_mark:<process id>   KEYS[2] daemon_marks
ARGV[1] process id
Returns {0, removed} (1 when the record was there).
A process that marked its Docker daemon stops (jobpool/fleet/daemonmark.py): its record goes before its mark does,
so no other process reads it live with its mark gone.
]]
local rec, index = KEYS[1], KEYS[2]
local removed = redis.call('DEL', rec)
redis.call('ZREM', index, ARGV[1])
return {0, removed}
