--[[ set_container
KEYS[1..14]  common keys (see _lib.lua)
KEYS[15]     job:<id>      KEYS[16] lease:<id>
ARGV[1] boot id   ARGV[2] attempt   ARGV[3] container id   ARGV[4] daemon id   ARGV[5] identity JSON
ARGV[6] lease ms
Returns {0, pause_requested, cancel_requested}; -1; -3.
Record what was launched for this attempt (container id and daemon id, or the
subprocess identity), so the supervisor can find it by ground truth later. Fenced on (boot, attempt).
It also renews the lease and reads back the persisted requests, as a heartbeat does: a Docker launch
records its container between create and start, so this one call is the fence before the start.
]]
local jkey, lkey = KEYS[15], KEYS[16]
local f = fence(jkey, ARGV[1], ARGV[2])
if f ~= 0 then return {f} end
local now = now_ms()
redis.call('SET', lkey, ARGV[1] .. ':' .. ARGV[2], 'PX', ARGV[6])
redis.call('HSET', jkey, 'container_id', ARGV[3], 'daemon_id', ARGV[4], 'identity', ARGV[5],
  'launched_at', now, 'heartbeat_at', now)
local row = redis.call('HMGET', jkey, 'pause_requested', 'cancel_requested')
return {0, row[1], row[2]}
