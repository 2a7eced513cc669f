--[[ daemon_mark_round
Pool keys: none
KEYS[1]     daemon_mark:<process id>   KEYS[2] daemon_marks
KEYS[3]     daemon_marks_of:<daemon identity> (the record's `daemon_id`)   KEYS[4] daemon_marks_scan
KEYS[5]     shared_daemons
KEYS[6..]   daemon_mark:<process id> of each process the caller found in its identity's index at its last round
ARGV as daemon_mark.lua's (`collision` empty)
Returns {0, at, 0, scan, standing, ids, record, record, ...}: at and scan as daemon_mark.lua's; standing the
report of a standing collision on the identity (shared_daemons' field, JSON; nil for none); ids the processes
in the identity's index once this record is written; then each record of KEYS[6..] in order, as HGETALL's
flat list ({} for none, or for a key that is no hash). -6 bad arguments.
A period of a process comparing its daemon's marks (jobpool/fleet/daemonmark.py `Marker._round`) in one
call: its record refreshed as daemon_mark.lua refreshes it, then what the comparison reads, read after it in
the same step (so a peer registering later reads this record, and this caller any peer registered before).
The records read are those the caller names: a process new to the index since its last round is read apart,
once (the caller compares `ids` with the keys it gave).
]]
local at, daemon, _, took = write_mark(KEYS[1], KEYS[2], KEYS[3], KEYS[4], false)
if not at then return {E_BAD_ARG, daemon} end
local standing = false
if key_type(KEYS[5]) == 'hash' then standing = redis.call('HGET', KEYS[5], daemon) end
local out = {0, at, 0, took, standing, redis.call('ZRANGE', KEYS[3], 0, -1)}
for i = 6, #KEYS do
  local rec = redis.pcall('HGETALL', KEYS[i])  -- a key of another type (edited by hand) reads as none
  if rec.err then rec = {} end
  out[#out + 1] = rec
end
return out
