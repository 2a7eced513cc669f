--[[ daemon_unmark
Pool keys: none
KEYS[1]     daemon_mark:<process id>   KEYS[2] daemon_marks   KEYS[3] daemon_mark_v:<process id>
KEYS[4]     daemon_marks_of:<daemon identity> (the identity it registered with; optional)
ARGV[1] process id
Returns {0, removed} (1 when the record was there); -6 'keys' for fewer than three.
A process that marked its Docker daemon stops (jobpool/fleet/daemonmark.py): its record goes before its mark does,
so no other process reads it live with its mark gone; its entries in the indexes go with it.
]]
if NKEYS < 3 then return {E_BAD_ARG, 'keys'} end
local rec, index = KEYS[1], KEYS[2]
local removed = redis.call('DEL', rec)
redis.call('DEL', KEYS[3])
redis.call('ZREM', index, ARGV[1])
if NKEYS >= 4 and key_type(KEYS[4]) == 'zset' then redis.call('ZREM', KEYS[4], ARGV[1]) end
return {0, removed}
