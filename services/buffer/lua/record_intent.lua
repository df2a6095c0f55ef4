#!lua
-- Before an HTTP write (slot {g}): record the intent, so that a crash before the global step is
-- recovered, and reserve the group's arrival numbers.
-- ARGV: prefix token intent samples
-- Returns the group's first arrival number (its samples take first + 1 .. first + samples).
local prefix, token, intent, samples = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
redis.call('HSET', prefix .. 'intents', token, intent)
return redis.call('INCRBY', prefix .. 'arrival_counter', ARGV[4]) - samples
