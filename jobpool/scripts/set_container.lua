--[[ set_container
KEYS[1..14]  common keys (see _lib.lua)
KEYS[15]     job:<id>
ARGV[1] boot id   ARGV[2] attempt   ARGV[3] container id   ARGV[4] daemon id   ARGV[5] identity JSON
Returns {0}; -1; -3.
Record what was launched for this attempt (container id and daemon id, or the
subprocess identity), so the supervisor can find it by ground truth later. Fenced on (boot, attempt).
]]
local jkey = KEYS[15]
local f = fence(jkey, ARGV[1], ARGV[2])
if f ~= 0 then return {f} end
redis.call('HSET', jkey, 'container_id', ARGV[3], 'daemon_id', ARGV[4], 'identity', ARGV[5],
  'launched_at', now_ms())
return {0}
