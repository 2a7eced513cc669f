--[[ daemon_mark
Pool keys: none
KEYS[1]     daemon_mark:<process id>   KEYS[2] daemon_marks
KEYS[3]     daemon_marks_of:<daemon identity> (the record's `daemon_id`)   KEYS[4] daemon_marks_scan
KEYS[5]     daemon_mark_v:<process id> (the record's `v`, kept apart: _lib.lua `write_mark`)
ARGV[1] process id   ARGV[2] record ttl ms   ARGV[3] forget ms (index entries older than this are trimmed)
ARGV[4] scan ms (how long the turn to look for unindexed records lasts; 0: this caller takes no turn)
ARGV[5..NARGV] field, value, field, value, ... (jobpool/fleet/markrecords.py FIELDS), `collision` empty
Returns {0, at, 0, scan} (at: ms, the server's time; scan: 1 when this caller took the pool's turn to index the
records of processes that do not index their own, daemon_mark_index.lua); -6 bad arguments (a record that
reports a collision among them: daemon_collision.lua writes it).
Register (or refresh) one process that marked its Docker daemon (jobpool/fleet/daemonmark.py) and reports no
collision: its record (written whole, or refreshed in place when it holds every field as given: _lib.lua `write_mark`)
lives ARGV[2] ms unless refreshed, so a process that dies drops out on its own; `daemon_marks` says when each
was last refreshed, for the readers of the whole fleet (`status`, the supervisors' `read_collisions`), and the
index of its daemon identity (KEYS[3]) holds it by when its record expires: a process comparing marks reads
only its own identity's records there (_lib.lua `write_mark`).
]]
local at, why, _, took = write_mark(KEYS[1], KEYS[5], KEYS[2], KEYS[3], KEYS[4], false)
if not at then return {E_BAD_ARG, why} end
return {0, at, 0, took}
