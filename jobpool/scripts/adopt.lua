--[[ adopt
Pool keys: events metrics running_by running_daemons running_on
Settings: events_maxlen
KEYS[1]     job:<id>      KEYS[2] lease:<id>
ARGV[1] id   ARGV[2] old owner boot   ARGV[3] attempt   ARGV[4] new boot id   ARGV[5] lease ms
ARGV[6] evidence   ARGV[7] the adopter's daemon identity
Returns {0, spec JSON, container_id, pause_requested, cancel_requested}; -1; -2; -4 evidence changed.
A live worker takes over a running job whose owner's lease is gone but whose container is
still running (evidence from the supervisor's probe). Compare-and-set on the old owner and attempt, and
refused while the old owner's lease ('<old owner>:<attempt>', judged by value as the sweep does) is present,
or when the row's daemon identity is not the adopter's: only a worker on that daemon can watch the container.
An adoption sent again by the boot that now owns the attempt (its reply was lost) succeeds again.
]]
local jkey, lkey = KEYS[1], KEYS[2]
local id, old, attempt, boot, lease_ms, evidence = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local daemon = ARGV[7]
if redis.call('EXISTS', jkey) == 0 then return {E_NOT_FOUND, id} end
local row = redis.call('HMGET', jkey, 'state', 'attempt', 'owner_boot', 'spec', 'container_id',
  'pause_requested', 'cancel_requested', 'daemon_id')
if row[1] ~= 'running' then return {E_INVALID_STATE, row[1]} end
-- The same adoption sent again because its reply was lost: this boot owns the attempt already, on the same
-- daemon. Answer as the first time (lease renewed, no second event).
if row[2] == attempt and row[3] == boot and boot ~= '' and daemon ~= '' and row[8] == daemon then
  redis.call('SET', lkey, boot .. ':' .. attempt, 'PX', lease_ms)
  return {0, row[4], row[5], row[6], row[7]}
end
local held = key_type(lkey) == 'string' and redis.call('GET', lkey) == old .. ':' .. attempt
-- An empty identity proves nothing (a row claimed without one, or an adopter that has none): refused, as
-- daemonid.same_daemon refuses it.
if row[2] ~= attempt or row[3] ~= old or held or daemon == '' or (row[8] or '') ~= daemon then
  return {E_CONFLICT, row[3]}
end
local now = now_ms()
redis.call('HSET', jkey, 'owner_boot', boot, 'heartbeat_at', now, 'adopted_from', old)
place_running(jkey, id)
redis.call('SET', lkey, boot .. ':' .. attempt, 'PX', lease_ms)
event(jkey, id, 'running', 'running', 'adopted', evidence, boot, now)
return {0, row[4], row[5], row[6], row[7]}
