#!lua
-- The run's objective, pinned by the first group or trainer that states one.
-- KEYS[1]: the objective key.  ARGV: temperature reference
-- Returns the pinned {temperature, reference}.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'temperature', ARGV[1], 'reference', ARGV[2])
end
return redis.call('HMGET', KEYS[1], 'temperature', 'reference')
