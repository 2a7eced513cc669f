--[[ boot_records
Pool keys: none
KEYS[1..]   boot:<boot id> records (the newest of the `boots` index: at most jobpool/status.py MAX_BOOTS)
ARGV[]      none
Returns {0, record, record, ...}: each key's fields and values in order, as HGETALL gives them ({} for a key
that is missing, its TTL run out, or not a hash).
Reads only: the status report's one read of the live workers' records (jobpool/status.py). One call, where a
pipeline of HGETALLs has the client pack and parse one command per worker, which at a thousand workers was
most of the time of a status read and of a /metrics scrape; Redis does the same reads either way.
]]
local records = {}
for i = 1, NKEYS do
  local record = KEYS[i]
  records[i] = key_type(record) == 'hash' and redis.call('HGETALL', record) or {}
end
return {0, unpack(records)}
