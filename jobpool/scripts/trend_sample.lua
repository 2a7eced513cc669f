--[[ trend_sample
Pool keys: config queued waiting running metrics last_sweep trends
Settings: default_slots
KEYS        none of its own: its pool keys only
ARGV[1] point (a whole number: the span [point * width_ms, (point + 1) * width_ms) of Redis time)
ARGV[2] width_ms   ARGV[3] the caller's percentiles: 'wait p50 ms|wait p95|run p50|run p95|jobs read' (a
        percentile '' when no job was read for it)
Returns {0, 1 if recorded, 0 if this point was recorded already}; -6 bad argument (a point that has not ended).
One point of the pool's history (jobpool/trends.py), recorded once whichever supervisor gets there first: in
position point % TREND_POINTS of `trends`, as 'point|width|queued|waiting|running|slots used|slots max|held
on unknown|succeeded|failed|cancelled|' then the caller's percentiles. The gauges are read here, at the end of
the point's span (held on unknown: the last sweep's count); the finished counts are the `metrics` hash's
running totals, which the reader takes the difference of from one point to the next, so no finish is missed
however fast jobs end or retention prunes them.
]]
local point, width = tonumber(ARGV[1]), tonumber(ARGV[2])
if not point or point % 1 ~= 0 or point < 0 or not width or width % 1 ~= 0 or width < 1 then
  return {E_BAD_ARG, 'point and width_ms must be whole numbers'}
end
if not string.find(ARGV[3], '^%d*|%d*|%d*|%d*|%d+$') then return {E_BAD_ARG, 'percentiles'} end
local now = now_ms()
if (point + 1) * width > now then return {E_BAD_ARG, 'the point has not ended'} end
local label = string.format('%d', point)
local slot = string.format('%d', point % TREND_POINTS)
local old = redis.call('HGET', KEYS[K_TRENDS], slot)
if old and string.sub(old, 1, #label + 1) == label .. '|' then return {0, 0} end
local config = redis.call('HMGET', KEYS[K_CONFIG], 'max_concurrent_jobs', 'slots_used')
local running = redis.call('ZCARD', KEYS[K_RUNNING])
local unknown = 0
local sweep = redis.call('GET', KEYS[K_LAST_SWEEP])
if sweep then
  local ok, summary = pcall(cjson.decode, sweep)
  if ok and type(summary) == 'table' then unknown = whole(summary.unknown) end
end
local done = redis.call('HMGET', KEYS[K_METRICS], 'job_duration:succeeded:count', 'job_duration:failed:count',
  'job_duration:cancelled:count')
redis.call('HSET', KEYS[K_TRENDS], slot, table.concat({label, string.format('%d', width),
  redis.call('ZCARD', KEYS[K_QUEUED]), redis.call('ZCARD', KEYS[K_WAITING]), running,
  tonumber(config[2]) or running, tonumber(config[1]) or DEFAULT_SLOTS, unknown,
  whole(done[1]), whole(done[2]), whole(done[3]), ARGV[3]}, '|'))
return {0, 1}
