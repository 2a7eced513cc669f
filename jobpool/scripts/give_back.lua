--[[ give_back
Pool keys: none
KEYS[1]     the RQ list a worker took the job from (RQ's own key)   KEYS[2] that list's intermediate list
KEYS[3]     RQ's first-seen key of the job in that intermediate list (RQ's own key)
ARGV[1] RQ job id
Returns {0, 1} when the job was given back; {0, 0} when it was not in the intermediate list (nothing done).
A worker that took a job off its queue just as it found it may not claim (its daemon's identity is shared:
jobpool/fleet/daemonmark.py), or took two in one round (jobpool/workers/routedqueue.py `RoutedQueue.lmove`),
puts it back at the head, as untaken, before RQ's worker has written anything of it. RQ's maintenance notes
when it first saw an entry in the intermediate list and fails one still there a minute later: a note left by a
moment there while taken would fail the job's next delivery early, so it goes too (a maintenance pass that
read the list just before may still write it again: a window of milliseconds, which this script cannot close).
]]
local queue, taken = KEYS[1], KEYS[2]
if redis.call('LREM', taken, 1, ARGV[1]) == 0 then return {0, 0} end
redis.call('LPUSH', queue, ARGV[1])
redis.call('DEL', KEYS[3])
return {0, 1}
