#!lua
-- Global capacity (slot {g}): choose the next eviction and record it as an intent, reserving its
-- count so that concurrent replicas never evict the same excess twice.
-- ARGV: prefix global_capacity token now
-- Returns {} when within capacity, else {prompt, count, bound}: evict up to count samples of prompt
-- scored below bound (the next prompt's oldest score, or '+inf').
local prefix, capacity, token, now = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local stats = prefix .. 'stats'
local total = tonumber(redis.call('HGET', stats, 'samples') or '0')
local reserved = tonumber(redis.call('HGET', stats, 'evict_reserved') or '0')
local over = total - reserved - capacity
if over <= 0 then return {} end
local two_oldest = redis.call('ZRANGE', prefix .. 'oldest_sample', 0, 1, 'WITHSCORES')
if #two_oldest == 0 then return {} end
local prompt, bound = two_oldest[1], '+inf'
if #two_oldest == 4 then bound = two_oldest[4] end
redis.call('HSET', prefix .. 'intents', token,
  cmsgpack.pack({kind = 'eviction', prompt = prompt, count = over, bound = bound, at = now}))
redis.call('HINCRBY', stats, 'evict_reserved', over)
return {prompt, over, bound}
