--[[ publish_inventory
Pool keys: events metrics
Settings: events_maxlen
KEYS[1]     inventory:<daemon id>   KEYS[2] inventory_lead:<daemon id>   KEYS[3] inventories
KEYS[4]     gone_daemons   KEYS[5] returned_daemons
ARGV[1] daemon id   ARGV[2] boot id (the publisher)   ARGV[3] kernel boot id   ARGV[4] lead ms
ARGV[5] inventory ttl ms   ARGV[6] complete ('1' or '0')   ARGV[7] containers (JSON array, jobpool/fleet/inventory.py)
ARGV[8] forget ms (index entries, and records of lifted declarations, older than this are trimmed)
ARGV[9] listed at: the server's time (ms) the publisher read just before it listed the containers
ARGV[10] strays (JSON array, jobpool/fleet/strays.py: running containers no row accounts for; '' or absent = none)
Returns {0, at} (ms, the server's time); -3 this boot does not hold the daemon's lead; -6 bad arguments or
containers over INVENTORY_MAX_BYTES.
Write one daemon's inventory whole, only by the holder of its lead (inventory_lead.lua), and renew the lead.
`at` is when the listing began (ARGV[9], the server's time read before it, never the publisher's clock: a
container created while the listing was taken and published may be missing from it, so the inventory must
not look younger than that); `first_at` is kept from the first publication of this
daemon identity (the boot rule of jobpool/supervisor/remote.py compares it with an earlier boot's last `at`).
The `inventories` index records each daemon's last publication, for as long as ARGV[8] says.
A daemon an operator declared gone for good (forget_daemon.lua) that publishes is evidently not gone: its
declaration is lifted in the same step (lift_gone in _lib.lua: a `daemon_back` event, and a record `status`
shows), so a later stale inventory of it is unknown again, never absent on that old word.
]]
local inv, lead, index, gone, returned = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local daemon, boot, kboot = ARGV[1], ARGV[2], ARGV[3]
local lead_ms, ttl_ms, complete, containers, forget = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], ARGV[7],
  tonumber(ARGV[8])
if daemon == '' or boot == '' or not lead_ms or lead_ms <= 0 or not ttl_ms or ttl_ms <= 0 or not forget
    or (complete ~= '1' and complete ~= '0') then
  return {E_BAD_ARG, 'inventory'}
end
if #containers > INVENTORY_MAX_BYTES or string.sub(containers, 1, 1) ~= '[' then
  return {E_BAD_ARG, 'containers'}
end
local strays = NARGV >= 10 and ARGV[10] or ''
if strays == '' then strays = '[]' end
if #strays > INVENTORY_MAX_BYTES or string.sub(strays, 1, 1) ~= '[' then return {E_BAD_ARG, 'strays'} end
if key_type(lead) ~= 'string' or redis.call('GET', lead) ~= boot then
  return {E_NOT_OWNER, 'inventory lead'}
end
local listed = tonumber(ARGV[9])
local now = now_ms()
if not listed or listed > now or listed < now - lead_ms then return {E_BAD_ARG, 'listed at'} end
now = listed
local first = now
if key_type(inv) == 'hash' then
  first = tonumber(redis.call('HGET', inv, 'first_at')) or now
elseif key_type(inv) ~= 'none' then
  redis.call('DEL', inv)
end
redis.call('HSET', inv, 'daemon_id', daemon, 'kernel_boot_id', kboot, 'at', now, 'first_at', first,
  'publisher', boot, 'complete', complete, 'containers', containers, 'strays', strays)
redis.call('PEXPIRE', inv, ttl_ms)
redis.call('PEXPIRE', lead, lead_ms)
if key_type(index) ~= 'zset' and key_type(index) ~= 'none' then redis.call('DEL', index) end
redis.call('ZADD', index, now, daemon)
redis.call('ZREMRANGEBYSCORE', index, '-inf', now - forget)
lift_gone(gone, returned, daemon, 'published', boot, 'publishing again (worker boot ' .. boot .. ')', forget,
  'daemon_back', now)
return {0, now}
