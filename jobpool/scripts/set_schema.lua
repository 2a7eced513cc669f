--[[ set_schema
Pool keys: config
KEYS        none of its own: its pool keys only
ARGV[1] layout version to record (a whole number, at least 1)
Returns {0, before} (before: the version recorded until now, '' for none); -4 (with the recorded version) when
the pool records a newer version than ARGV[1], changing nothing; -6 bad argument.
Record which layout of keys and rows the pool holds: `jobpool migrate` (jobpool/migrate.py), once its steps are
done. A version is only ever raised: a pool recorded newer than its caller knows is left as it is (that caller
is the older release, jobpool/store/schema.py).
]]
local v = tonumber(ARGV[1])
if not v or v < 1 or v ~= math.floor(v) then return {E_BAD_ARG, ARGV[1]} end
local before = redis.call('HGET', KEYS[K_CONFIG], 'schema')
local b = tonumber(before)
if b and b > v then return {E_CONFLICT, before} end
redis.call('HSET', KEYS[K_CONFIG], 'schema', v)
return {0, before or ''}
