--[[ forget_daemon
Pool keys: config running events metrics
Settings: events_maxlen
KEYS[1]     gone_daemons   KEYS[2] inventory:<daemon id>   KEYS[3] commands:<daemon id>
KEYS[4]     inventory_lead:<daemon id>   KEYS[5] inventories
KEYS[6..]   rows (job:<id>) of running jobs the caller read as recorded on the daemon, or promoted to wait
             for it (a checkpoint affinity to it), at most the slots
ARGV[1] daemon id   ARGV[2] stale ms (JOBPOOL_INVENTORY_STALE_SECS)   ARGV[3] actor   ARGV[4] note
Returns {0, at}; -4 'lead' while a worker holds the daemon's inventory lead (whatever the caller's settings:
the lead lapses three of the publisher's periods after its holder stops), -4 'published <ms> ms ago' when its
inventory is younger than ARGV[2]; -6 'unknown' for a daemon neither in the `inventories` index (published
within a week) nor named by a running row among KEYS[6..] (a typo), -6 bad arguments.
An operator's word that a Docker daemon is gone for good (its host destroyed, its disks wiped): none of its
containers will run again, so a supervisor judges the attempts recorded on it absent (jobpool/fleet/gone.py,
jobpool/supervisor/remote.py). Refused while the daemon still publishes its inventory: a daemon whose workers
speak for it is not gone. A daemon that aged out of the index (silent for a week) stays forgettable for as
long as a running row holds a slot on it (recorded on it, or waiting promoted on its queue for a checkpoint
affinity to it): the rows are checked here, so a stale read by the caller can only
refuse. Its waiting commands go (no worker will take them). A `daemon_forgotten` event records it. Lifted
when the daemon publishes again (publish_inventory.lua) or by hand (unforget_daemon.lua).
]]
local gone, ikey, ckey, lead, index = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local daemon, stale = ARGV[1], tonumber(ARGV[2])
if daemon == '' or #daemon > 300 or not string.find(daemon, '@', 1, true) or not stale or stale < 0 then
  return {E_BAD_ARG, 'daemon'}
end
local known = key_type(index) == 'zset' and redis.call('ZSCORE', index, daemon)
if not known then
  local prefix = string.sub(KEYS[K_CONFIG], 1, -#'config' - 1) .. 'job:'
  for i = 6, NKEYS do
    local rowkey = KEYS[i]
    local id = string.sub(rowkey, #prefix + 1)
    if string.sub(rowkey, 1, #prefix) == prefix and key_type(rowkey) == 'hash'
        and redis.call('ZSCORE', KEYS[K_RUNNING], id)
        and (redis.call('HGET', rowkey, 'daemon_id') == daemon
             or redis.call('HGET', rowkey, 'affinity') == daemon) then
      known = true
      break
    end
  end
end
if not known then return {E_BAD_ARG, 'unknown'} end
if redis.call('EXISTS', lead) == 1 then return {E_CONFLICT, 'lead'} end
local now = now_ms()
if key_type(ikey) == 'hash' then
  local at = tonumber(redis.call('HGET', ikey, 'at'))
  if at and now - at <= stale then return {E_CONFLICT, 'published ' .. (now - at) .. ' ms ago'} end
end
if key_type(gone) ~= 'hash' and key_type(gone) ~= 'none' then redis.call('DEL', gone) end
redis.call('HSET', gone, daemon, cjson.encode({at = now, actor = ARGV[3], note = ARGV[4]}))
redis.call('DEL', ckey)
event(nil, '', '', '', 'daemon_forgotten', 'daemon=' .. daemon .. (ARGV[4] ~= '' and ('; ' .. ARGV[4]) or ''),
  ARGV[3], now)
return {0, now}
