--[[ take_commands
Pool keys: none
KEYS[1]     commands:<daemon id>   KEYS[2] inventory_lead:<daemon id>
ARGV[1] boot id   ARGV[2] how many at most
Returns {0, command...} (oldest first); -3 this boot does not hold the daemon's inventory lead.
Take the commands routed to a Docker daemon (push_command.lua), only by the worker that holds its inventory
lead (inventory_lead.lua), so each is taken once; taking removes them.
]]
local ckey, lead = KEYS[1], KEYS[2]
if key_type(lead) ~= 'string' or redis.call('GET', lead) ~= ARGV[1] then return {E_NOT_OWNER, 'inventory lead'} end
local out = {0}
if key_type(ckey) ~= 'list' then return out end
for _ = 1, math.min(tonumber(ARGV[2]) or 1, COMMANDS_MAX) do
  local c = redis.call('LPOP', ckey)
  if not c then break end
  out[#out + 1] = c
end
return out
