--[[ command_done
Pool keys: events metrics
Settings: events_maxlen
KEYS[1]     job:<id>
ARGV[1] id   ARGV[2] reason   ARGV[3] evidence (what was done)   ARGV[4] actor
Returns {0, the job's state}; -1 unknown id.
Record in a job's events what a worker did on its daemon: with a command routed there (push_command.lua), or
to a stray container of the job it found there (jobpool/fleet/strays.py, `stray_stopped`). The row's state is not
changed (the job's end is judged as any other: by its worker, or by a supervisor's sweep).
]]
local jkey = KEYS[1]
if redis.call('EXISTS', jkey) == 0 then return {E_NOT_FOUND, ARGV[1]} end
local state = redis.call('HGET', jkey, 'state') or ''
event(jkey, ARGV[1], state, state, ARGV[2], ARGV[3], ARGV[4], now_ms())
return {0, state}
