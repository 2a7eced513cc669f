--[[ forget_collision
Pool keys: events metrics
Settings: events_maxlen
KEYS[1]     shared_daemons   KEYS[2..] daemon_mark:<process id> records (those the caller read in the
daemon_marks index: any of them on this identity has its `collision` emptied), then daemon_mark_v:<process
id> of each, in the same order
ARGV[1] daemon identity   ARGV[2] actor   ARGV[3] note
Returns {0, at, cleared} (cleared: the records whose report was emptied); -6 'no collision' for an identity
with no standing report, -6 bad arguments.
An operator clears a collision (two Docker daemons that shared one identity: jobpool/fleet/daemonmark.py) once
one of the daemons has an identity of its own: the standing report goes, with a pool-wide
`daemon_collision_cleared` event, and so do the reports in the records of that identity (a process that
still finds the two daemons' marks apart reports it again within a period, which records it again).
]]
local shared = KEYS[1]
local daemon, actor, note = ARGV[1], ARGV[2], ARGV[3]
if daemon == '' or #daemon > 300 or not actor or not note then return {E_BAD_ARG, 'daemon'} end
local records = (NKEYS - 1) / 2
if records ~= math.floor(records) then return {E_BAD_ARG, 'records'} end
if key_type(shared) ~= 'hash' or redis.call('HEXISTS', shared, daemon) == 0 then
  return {E_BAD_ARG, 'no collision'}
end
local now = now_ms()
local ok, was = pcall(cjson.decode, redis.call('HGET', shared, daemon))
if not ok or type(was) ~= 'table' then was = {} end
redis.call('HDEL', shared, daemon)
local cleared = 0
for i = 2, 1 + records do
  if key_type(KEYS[i]) == 'hash' and redis.call('HGET', KEYS[i], 'daemon_id') == daemon
      and (redis.call('HGET', KEYS[i], 'collision') or '') ~= '' then
    redis.call('HSET', KEYS[i], 'collision', '')
    -- Its writer's digest no longer says it (daemon_mark_round.lua): removed from the record and its key.
    redis.call('HDEL', KEYS[i], 'v')
    redis.call('DEL', KEYS[i + records])
    cleared = cleared + 1
  end
end
event(nil, '', '', '', 'daemon_collision_cleared', 'daemon=' .. daemon .. ' reported by process '
  .. tostring(was.by or '?') .. (note ~= '' and ('; ' .. note) or ''), actor, now)
return {0, now, cleared}
