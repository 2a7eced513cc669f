--[[ push_command
Pool keys: events metrics
Settings: events_maxlen
KEYS[1]     job:<id>      KEYS[2] commands:<daemon id>
ARGV[1] id   ARGV[2] expected attempt   ARGV[3] daemon id   ARGV[4] command (JSON, jobpool/daemoncommands.py)
ARGV[5] ttl ms   ARGV[6] evidence   ARGV[7] actor
Returns {0, commands waiting}; -1 unknown id; -4 the row is not running that attempt; -6 bad arguments.
Route a command about a running job to the workers on the Docker daemon its container runs on (a supervisor
or operator elsewhere cannot stop it): queued on that daemon's list, which the holder of the daemon's
inventory lead takes (take_commands.lua). Recorded in the job's events. The list is bounded (the oldest go).
]]
local jkey, ckey = KEYS[1], KEYS[2]
local id, attempt, daemon, command, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
if daemon == '' or not ttl or ttl <= 0 or string.sub(command, 1, 1) ~= '{' or #command > 4096 then
  return {E_BAD_ARG, 'command'}
end
if redis.call('EXISTS', jkey) == 0 then return {E_NOT_FOUND, id} end
local row = redis.call('HMGET', jkey, 'state', 'attempt')
if row[1] ~= 'running' or row[2] ~= attempt then return {E_CONFLICT, row[1]} end
if key_type(ckey) ~= 'list' and key_type(ckey) ~= 'none' then redis.call('DEL', ckey) end
redis.call('RPUSH', ckey, command)
redis.call('LTRIM', ckey, -COMMANDS_MAX, -1)
redis.call('PEXPIRE', ckey, ttl)
event(jkey, id, 'running', 'running', 'stop_routed', ARGV[6], ARGV[7], now_ms())
return {0, redis.call('LLEN', ckey)}
