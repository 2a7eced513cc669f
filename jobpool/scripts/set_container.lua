--[[ set_container
Pool keys: rq_queue running_by running_daemons running_on
KEYS[1]     job:<id>      KEYS[2] lease:<id>
ARGV[1] boot id   ARGV[2] attempt   ARGV[3] container id   ARGV[4] daemon id   ARGV[5] identity JSON
ARGV[6] lease ms   ARGV[7] the RQ list key of the daemon's own queue (store/keys.py: PoolKeys.daemon_queue;
        optional)
Returns {0, pause_requested, cancel_requested}; -1; -3.
Record what was launched for this attempt (container id and daemon id, or the
subprocess identity), so the supervisor can find it by ground truth later. Fenced on (boot, attempt).
It also renews the lease and reads back the persisted requests, as a heartbeat does: a Docker launch
records its container between create and start, so this one call is the fence before the start.
The daemon's queue key is kept as `daemon_queue` (only a key of this pool's daemon queues: the RQ queue's
key followed by '.d-'), for a handback to name where the job's checkpoint is (note_affinity, _lib.lua).
]]
local jkey, lkey = KEYS[1], KEYS[2]
local f, detail = fence(jkey, ARGV[1], ARGV[2])
if f ~= 0 then return {f, detail} end
local now = now_ms()
redis.call('SET', lkey, ARGV[1] .. ':' .. ARGV[2], 'PX', ARGV[6])
redis.call('HSET', jkey, 'container_id', ARGV[3], 'daemon_id', ARGV[4], 'identity', ARGV[5],
  'launched_at', now, 'heartbeat_at', now)
place_running(jkey, string.match(jkey, 'job:([^:]*)$') or '')
local dq = NARGV >= 7 and ARGV[7] or ''
local daemon_prefix = KEYS[K_RQ_QUEUE] .. '.d-'
if ARGV[4] == '' or string.sub(dq, 1, #daemon_prefix) ~= daemon_prefix then dq = '' end
redis.call('HSET', jkey, 'daemon_queue', dq)
local row = redis.call('HMGET', jkey, 'pause_requested', 'cancel_requested')
return {0, row[1], row[2]}
