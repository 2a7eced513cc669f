--[[ daemon_mark_round
Pool keys: none
KEYS[1]     daemon_mark:<process id>   KEYS[2] daemon_marks
KEYS[3]     daemon_marks_of:<daemon identity> (the record's `daemon_id`)   KEYS[4] daemon_marks_scan
KEYS[5]     daemon_mark_v:<process id> (as daemon_mark.lua's)   KEYS[6] shared_daemons
KEYS[7..]   daemon_mark:<process id> of each process the caller found in its identity's index at its last
            round, then daemon_mark_v:<process id> of each, in the same order
ARGV[1..N]  as daemon_mark.lua's (`collision` empty), N = NARGV - (NKEYS - 6) / 2
ARGV[N+1..] for each record of KEYS[7..] in order, its `v` as the caller last read it ('' for none)
Returns {0, at, 0, scan, standing, ids, size, record, record, ...}: at and scan as daemon_mark.lua's;
standing the report of a standing collision on the identity (shared_daemons' field, JSON; nil for none); ids
the processes in the identity's index once this record is written, the first MAX_PEERS of them, and size the
index's size (the caller reads the index apart when it holds more); then for each record of KEYS[7..] in
order, 1 when its `v` is the one given (unchanged since the caller read it), else the record as HGETALL's
flat list ({} for none, or for a key that is no hash). -6 bad arguments; Redis's WRONGTYPE error for a shared_daemons that is
no hash (after the refresh: a round that cannot read the standing collision fails, as a read of it would).
A period of a process comparing its daemon's marks (jobpool/fleet/daemonmark.py `Marker._round`) in one
call: its record refreshed as daemon_mark.lua refreshes it, then what the comparison reads, read after it in
the same step (so a peer registering later reads this record, and this caller any peer registered before).
A record's `v` is its writer's digest of every other field but `at` (`Marker._fields`), kept in its
daemon_mark_v key too by every script that writes the record, and removed there by a script that edits the
record otherwise (forget_collision.lua): so the peers' digests are one MGET, and an unchanged record, as a
steady fleet's are, costs nothing more here. The records read are those the caller names: a process new
to the index since its last round is read apart, once (the caller compares `ids` with the keys it gave).
]]
local peers = (NKEYS - 6) / 2
if peers < 0 or peers ~= math.floor(peers) then return {E_BAD_ARG, 'daemon mark round'} end
local base = NARGV - peers
local MAX_PEERS = 1000  -- far more processes than a daemon runs: each reads the others every period
local at, daemon, _, took, ids, size = write_mark(KEYS[1], KEYS[5], KEYS[2], KEYS[3], KEYS[4], false, base,
  MAX_PEERS)
if not at then return {E_BAD_ARG, daemon} end
-- A standing collision that cannot be read fails the call (as a read of it apart would), never "none".
local standing = redis.call('HGET', KEYS[6], daemon)
local out = {0, at, 0, took, standing, ids, size}
local digests = {}
if peers > 0 then
  -- A key of another type (edited by hand) reads as none in MGET: its record is read whole.
  digests = redis.call('MGET', unpack(KEYS, 7 + peers, 6 + 2 * peers))
end
for i = 1, peers do
  local mark_rec, known = KEYS[6 + i], ARGV[base + i]
  local rec = nil
  if known ~= '' and digests[i] == known then rec = 1 end
  if not rec then
    rec = redis.pcall('HGETALL', mark_rec)  -- bounded: write_mark's fields (_lib.lua), or a hand edit's
    if rec.err then rec = {} end
  end
  out[#out + 1] = rec
end
return out
