--[[ forget_rq_failure
Pool keys: config
KEYS[1]     job:<id> (the job's row)   KEYS[2] rq:job:<id>   KEYS[3] rq:results:<id> (RQ's own keys)
KEYS[4]     rq:failed:<queue>, RQ's failed registry of the job's origin queue (RQ's own key)
ARGV[1] id
Returns {0, removed}: removed the number of RQ's keys of the job deleted, when it has no row (its registry
entry goes too); {0, 0} when it has a row (nothing done); -6 keys that are not this pool's and this id's.
RQ's worker records a delivery whose horse died, or whose job function raised, as failed, and a jobpool job's
RQ record never expires (jobpool/rqjob.py): it goes with the job's row (prune.lua). A delivery of a job that
has no row (one made and taken after the last writes a Redis then lost: a restart from an older file, a
failover to a replica behind) would so leave RQ's record for ever, which no row names. The worker runs this
right after RQ's failure record (jobpool/workers/rqworker.py `JobpoolWorker.handle_job_failure`), and after
RQ's maintenance took an abandoned delivery out of its started registry (`clean_registries`); a job that
still has its row keeps RQ's record until its row is pruned. The registry's entry is removed first: a
registry of another type (edited by hand) fails the call before anything is deleted.
]]
local id = ARGV[1]
local prefix = string.sub(KEYS[K_CONFIG], 1, -#'config' - 1)
if id == '' or KEYS[1] ~= prefix .. 'job:' .. id or KEYS[2] ~= 'rq:job:' .. id
    or KEYS[3] ~= 'rq:results:' .. id or string.sub(KEYS[4], 1, #'rq:failed:') ~= 'rq:failed:' then
  return {E_BAD_ARG, 'keys of ' .. id}
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, 0} end
redis.call('ZREM', KEYS[4], id)
return {0, redis.call('DEL', KEYS[2], KEYS[3])}
