--[[ time_out
Pool keys: events metrics
Settings: events_maxlen
KEYS[1]     job:<id>
ARGV[1] boot id   ARGV[2] attempt   ARGV[3] evidence (how long it ran, its limit)
Returns {0, 'marked' | 'already'}; -1 unknown id; -3 not the owner.
Mark an attempt as stopped for its time limit (its spec's), before its watcher stops it: whatever
then records its exit (the watcher's finish, or the supervisor's reconcile after the watcher died) fails it
with REASON_TIMEOUT, or retries it while its retries last (_lib.lua judges exits). Fenced on
(owner boot, attempt): only the attempt's watcher, or its adopter, times it out. Marked once: a watcher that
asks again after a lost reply is told so.
]]
local jkey = KEYS[1]
local boot, attempt, evidence = ARGV[1], ARGV[2], ARGV[3]
local f, detail = fence(jkey, boot, attempt)
if f ~= 0 then return {f, detail} end
if redis.call('HGET', jkey, 'timed_out') == attempt then return {0, 'already'} end
redis.call('HSET', jkey, 'timed_out', attempt)
local id = string.match(jkey, 'job:([^:]*)$') or ''
event(jkey, id, 'running', 'running', REASON_TIMEOUT, evidence, 'worker:' .. boot, now_ms())
return {0, 'marked'}
