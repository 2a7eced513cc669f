--[[ claim
Pool keys: events metrics running_by running_daemons running_on
Settings: events_maxlen
KEYS[1]     job:<id>      KEYS[2] lease:<id>
ARGV[1] id   ARGV[2] boot id   ARGV[3] attempt   ARGV[4] lease ms   ARGV[5] executor   ARGV[6] daemon id
ARGV[7] claim token (one per claim call, the same on each retry of it; '' = none)
Returns {0, spec JSON, pause_requested, cancel_requested}; -1 unknown id; -2 not running;
        -4 the attempt is not the current one; -3 another boot owns it.
A worker takes a promoted job. First claim of an attempt wins; a duplicate or stale delivery
(another attempt, already owned, no longer running) is refused.
A claim sent again with the same boot, attempt and token is the same claim, retried because its reply was
lost (a connection reset after the script ran): it succeeds again, renewing the lease, with no second
'claimed' event. Any other claim of an owned attempt, even by the same boot (a duplicate delivery after
its first run died), is refused: it might launch the job beside a copy that still runs.
]]
local jkey, lkey = KEYS[1], KEYS[2]
local id, boot, attempt, lease_ms, executor, daemon = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local token = NARGV >= 7 and ARGV[7] or ''
if redis.call('EXISTS', jkey) == 0 then return {E_NOT_FOUND, id} end
local row = redis.call('HMGET', jkey, 'state', 'attempt', 'owner_boot', 'spec', 'pause_requested',
  'cancel_requested', 'claim_token')
if row[1] ~= 'running' then return {E_INVALID_STATE, row[1]} end
if row[2] ~= attempt then return {E_CONFLICT, row[2]} end
local now = now_ms()
if row[3] ~= '' and token ~= '' and row[3] == boot and row[7] == token then
  redis.call('SET', lkey, boot .. ':' .. attempt, 'PX', lease_ms)
  redis.call('HSET', jkey, 'heartbeat_at', now)
  return {0, row[4], row[5], row[6]}
end
if row[3] ~= '' then return {E_NOT_OWNER, row[3]} end
-- Recorded before launch, so the supervisor knows where to look even if the worker dies mid-launch.
redis.call('HSET', jkey, 'owner_boot', boot, 'claimed_at', now, 'heartbeat_at', now, 'executor', executor or '',
  'daemon_id', daemon or '', 'claim_token', token)
place_running(jkey, id)
redis.call('SET', lkey, boot .. ':' .. attempt, 'PX', lease_ms)
event(jkey, id, 'running', 'running', 'claimed', 'boot=' .. boot .. ' attempt=' .. attempt, boot, now)
return {0, row[4], row[5], row[6]}
