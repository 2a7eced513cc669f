--[[ log_append
Pool keys: none
KEYS[1]     job:<id>      KEYS[2] joblog:<id>
ARGV[1] boot id   ARGV[2] attempt   ARGV[3] text (what the attempt printed since the last append; may be '')
ARGV[4] position: where its output was read up to (its executor's own token: workers/livelog.py)
ARGV[5] cap bytes   ARGV[6] linger ms: 0 while the attempt runs on; > 0 on its last append
Returns {0, offset, 'appended' | 'already'}; -1 unknown id; -3 not the owner; -6 bad argument.
Append to a running job's live log (jobpool/livelogs.py reads it). Fenced on (owner boot, attempt): a
watcher that lost the row writes nothing more. Each entry's id is '<offset>-0', the offset being how many
bytes of the job's log end with it, so a reader's position is a number of bytes and the stream is trimmed by
bytes (XTRIM MINID): about the newest `cap` bytes stay, one entry more at most. An append sent again after a
lost reply (the attempt's last entry has its position already) adds nothing. The stream lives on while the
job runs and expires `linger` ms after an attempt's last append (its row's log tail is then the record).
The offset never goes back: each append records it in the row (`log_bytes`), and a stream started again
after it expired (a next attempt after a long wait) goes on from there, so a follower's position stays
below every new entry.
]]
local jkey, lkey = KEYS[1], KEYS[2]
local text, position = ARGV[3], ARGV[4]
local cap, linger = tonumber(ARGV[5]), tonumber(ARGV[6])
if not cap or cap < 1 or not linger or linger < 0 or #text > cap then return {E_BAD_ARG, 'cap'} end
local f, detail = fence(jkey, ARGV[1], ARGV[2])
if f ~= 0 then return {f, detail} end
local kind = key_type(lkey)
if kind ~= 'stream' and kind ~= 'none' then redis.call('DEL', lkey) end
local offset, last = 0, redis.call('XREVRANGE', lkey, '+', '-', 'COUNT', 1)[1]
if not last then offset = whole(redis.call('HGET', jkey, 'log_bytes')) end
local how = 'appended'
if last then
  offset = tonumber(string.match(last[1], '^(%d+)')) or 0
  local fields = {}
  for i = 1, #last[2], 2 do fields[last[2][i]] = last[2][i + 1] end
  if fields.a == ARGV[2] and fields.p == position then how = 'already' end
end
if how == 'appended' and #text > 0 then
  offset = offset + #text
  redis.call('XADD', lkey, offset .. '-0', 'a', ARGV[2], 'p', position, 't', now_ms(), 'd', text)
  redis.call('XTRIM', lkey, 'MINID', math.max(0, offset - cap))
  redis.call('HSET', jkey, 'log_bytes', offset)
end
if linger > 0 then
  redis.call('PEXPIRE', lkey, linger)
else
  redis.call('PERSIST', lkey)
end
return {0, offset, how}
