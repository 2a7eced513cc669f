--[[ daemon_mark
Pool keys: events metrics
Settings: events_maxlen
KEYS[1]     daemon_mark:<process id>   KEYS[2] daemon_marks   KEYS[3] shared_daemons
KEYS[4]     daemon_marks_of:<daemon identity> (the record's `daemon_id`)   KEYS[5] daemon_marks_scan
ARGV[1] process id   ARGV[2] record ttl ms   ARGV[3] forget ms (index entries older than this are trimmed)
ARGV[4] scan ms (how long the turn to look for unindexed records lasts; 0: this caller takes no turn)
ARGV[5..NARGV] field, value, field, value, ... (jobpool/fleet/daemonmark.py FIELDS)
Returns {0, at, recorded, scan} (at: ms, the server's time; recorded: 1 when this call recorded a new collision;
scan: 1 when this caller took the pool's turn to index the records of processes that do not index their own,
daemon_mark_index.lua); -6 bad arguments.
Register (or refresh) one process that marked its Docker daemon (jobpool/fleet/daemonmark.py): its record, written
whole, lives ARGV[2] ms unless refreshed, so a process that dies drops out on its own; the index says when
each was last refreshed, for the readers of the whole fleet (`status`, the supervisors' `read_collisions`).
The index of its daemon identity (KEYS[4]) holds it too, scored by when its record expires: a process comparing
marks reads only the records of its own identity there. Entries past their score (their record expired, its
process dead) are trimmed here and the index itself expires with its last record, so it holds the live
processes of one identity and those that changed identity within a ttl (a reader checks `daemon_id`).
The record says `indexed`: a record without it (written by an earlier release) is indexed by whoever holds the
turn (KEYS[5]).
A record whose `collision` is not empty (this process concluded that two daemons share its `daemon_id`) is
also remembered in shared_daemons (daemon identity -> JSON {line, at, by}), the first report kept, with a
pool-wide `daemon_collision` event: it stands, whatever becomes of the processes, until an operator clears
it (forget_collision.lua).
]]
local rec, index, shared, of_daemon, scan_turn = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id, ttl, forget, scan = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if id == '' or not ttl or ttl <= 0 or ttl ~= math.floor(ttl) or not forget or not scan or scan < 0
    or scan ~= math.floor(scan) or (NARGV - 4) % 2 ~= 0 then
  return {E_BAD_ARG, 'daemon mark'}
end
local fields = {'indexed', '1'}
local daemon, collision = '', ''
for i = 5, NARGV, 2 do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
  if ARGV[i] == 'daemon_id' then daemon = ARGV[i + 1] end
  if ARGV[i] == 'collision' then collision = ARGV[i + 1] end
end
local prefix = string.sub(index, 1, -#'daemon_marks' - 1)
if daemon == '' or of_daemon ~= prefix .. 'daemon_marks_of:' .. daemon then
  return {E_BAD_ARG, 'daemon mark index'}
end
local at = now_ms()
redis.call('DEL', rec)
fields[#fields + 1] = 'at'
fields[#fields + 1] = at
redis.call('HSET', rec, unpack(fields))
redis.call('PEXPIRE', rec, ttl)
redis.call('ZADD', index, at, id)
redis.call('ZREMRANGEBYSCORE', index, '-inf', at - forget)
if key_type(of_daemon) ~= 'zset' and key_type(of_daemon) ~= 'none' then redis.call('DEL', of_daemon) end
redis.call('ZADD', of_daemon, at + ttl, id)
redis.call('ZREMRANGEBYSCORE', of_daemon, '-inf', at)
redis.call('PEXPIREAT', of_daemon, tonumber(redis.call('ZRANGE', of_daemon, -1, -1, 'WITHSCORES')[2]))
local recorded = 0
if collision ~= '' then
  if key_type(shared) ~= 'hash' and key_type(shared) ~= 'none' then redis.call('DEL', shared) end
  recorded = redis.call('HSETNX', shared, daemon, cjson.encode({line = collision, at = at, by = id}))
  if recorded == 1 then
    event(nil, '', '', '', 'daemon_collision', 'daemon=' .. daemon .. '; ' .. collision, 'process ' .. id, at)
  end
end
local took = 0
if scan > 0 and redis.call('SET', scan_turn, id, 'NX', 'PX', scan) then took = 1 end
return {0, at, recorded, took}
