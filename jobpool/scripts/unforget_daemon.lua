--[[ unforget_daemon
Pool keys: events metrics
Settings: events_maxlen
KEYS[1]     gone_daemons   KEYS[2] returned_daemons
ARGV[1] daemon id   ARGV[2] actor   ARGV[3] note   ARGV[4] keep ms (records of lifted declarations older than
this are trimmed)
Returns {0, at}; -6 'not declared' for a daemon not declared gone (forget_daemon.lua), -6 bad arguments.
An operator withdraws a declaration that a daemon is gone for good (jobpool/fleet/gone.py): its attempts are
judged from its own inventory again (unknown while that is stale). What was judged absent on the declaration
meanwhile stays as it was; the withdrawal is kept as a record `status` shows and a `daemon_unforgotten`
event (lift_gone in _lib.lua, as a daemon that publishes again lifts it in publish_inventory.lua).
]]
local gone, returned = KEYS[1], KEYS[2]
local daemon, keep = ARGV[1], tonumber(ARGV[4])
if daemon == '' or #daemon > 300 or not keep or keep <= 0 then return {E_BAD_ARG, 'daemon'} end
local now = now_ms()
if not lift_gone(gone, returned, daemon, 'withdrawn', ARGV[2], ARGV[3], keep, 'daemon_unforgotten', now) then
  return {E_BAD_ARG, 'not declared'}
end
return {0, now}
