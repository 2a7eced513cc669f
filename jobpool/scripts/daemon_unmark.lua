--[[ daemon_unmark
KEYS[1..14]  common keys (see _lib.lua)
KEYS[15]     daemon_mark:<process id>   KEYS[16] daemon_marks
ARGV[1] process id
Returns {0, removed} (1 when the record was there).
A process that marked its Docker daemon stops (jobpool/fleet/daemonmark.py): its record goes before its mark does,
so no other process reads it live with its mark gone.
]]
local rec, index = KEYS[15], KEYS[16]
local removed = redis.call('DEL', rec)
redis.call('ZREM', index, ARGV[1])
return {0, removed}
