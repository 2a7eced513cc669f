--[[ inventory_lead
Pool keys: none
KEYS[1]     inventory_lead:<daemon id>
ARGV[1] daemon id   ARGV[2] boot id (the candidate)   ARGV[3] lead ms
Returns {0, 1, boot id} when this boot holds the lead (taken now or renewed); {0, 0, holder} when another does;
-6 an empty boot id or a lead time that is not a positive whole number of ms.
Elect one publisher of a Docker daemon's inventory among the workers on it (jobpool/workers/inventory.py), so
the daemon is listed once per period, not once per worker: the first to ask takes the lead for ARGV[3] ms; its
holder renews it (here, and with each publication); when it dies the lead lapses and another takes it.
]]
local lead = KEYS[1]
local boot, ms = ARGV[2], tonumber(ARGV[3])
if boot == '' or not ms or ms <= 0 or ms ~= math.floor(ms) then return {E_BAD_ARG, 'lead'} end
if redis.call('SET', lead, boot, 'NX', 'PX', ms) then return {0, 1, boot} end
local holder = redis.call('GET', lead)
if holder == boot then
  redis.call('PEXPIRE', lead, ms)
  return {0, 1, boot}
end
return {0, 0, holder or ''}
