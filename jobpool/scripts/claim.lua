--[[ claim
KEYS[1..13]  common keys (see _lib.lua)
KEYS[14]     job:<id>      KEYS[15] lease:<id>
ARGV[1] id   ARGV[2] boot id   ARGV[3] attempt   ARGV[4] lease ms   ARGV[5] executor   ARGV[6] daemon id
Returns {0, spec JSON, pause_requested, cancel_requested}; -1 unknown id; -2 not running;
        -4 the attempt is not the current one; -3 another boot owns it.
A worker takes a promoted job. First claim of an attempt wins; a duplicate or stale delivery
(another attempt, already owned, no longer running) is refused.
]]
local jkey, lkey = KEYS[14], KEYS[15]
local id, boot, attempt, lease_ms, executor, daemon = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if redis.call('EXISTS', jkey) == 0 then return {E_NOT_FOUND, id} end
local row = redis.call('HMGET', jkey, 'state', 'attempt', 'owner_boot', 'spec', 'pause_requested',
  'cancel_requested')
if row[1] ~= 'running' then return {E_INVALID_STATE, row[1]} end
if row[2] ~= attempt then return {E_CONFLICT, row[2]} end
if row[3] ~= '' then return {E_NOT_OWNER, row[3]} end
local now = now_ms()
-- Recorded before launch, so the supervisor knows where to look even if the worker dies mid-launch.
redis.call('HSET', jkey, 'owner_boot', boot, 'claimed_at', now, 'heartbeat_at', now, 'executor', executor or '',
  'daemon_id', daemon or '')
redis.call('SET', lkey, boot .. ':' .. attempt, 'PX', lease_ms)
event(id, 'running', 'running', 'claimed', 'boot=' .. boot .. ' attempt=' .. attempt, boot, now)
return {0, row[4], row[5], row[6]}
