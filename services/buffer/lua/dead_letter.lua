#!lua
-- Move a bad stream entry to the dead-letter stream with its reason, count it, ack it (slot {g}).
-- ARGV: prefix dead_letter_stream maxlen entry_id reason payload consumer samples now stream consumer_group
-- (stream '': no stream entry to check or ack).
-- Returns 1, or 0 when the entry was already handled by another consumer.
local prefix, dead_letters, maxlen = ARGV[1], ARGV[2], ARGV[3]
local entry, reason, payload, consumer, samples, now = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local stream, consumer_group = ARGV[10], ARGV[11]
local stats = prefix .. 'stats'
if stream ~= '' and #redis.call('XPENDING', stream, consumer_group, entry, entry, 1) == 0 then return 0 end
redis.call('XADD', dead_letters, 'MAXLEN', '~', maxlen, '*',
  'entry', entry, 'reason', reason, 'payload', payload, 'consumer', consumer, 'at', now)
redis.call('HINCRBY', stats, 'dead_letters', 1)
redis.call('HINCRBY', stats, 'groups_ingested', 1)
redis.call('HINCRBY', stats, 'samples_ingested', samples)
redis.call('HINCRBY', stats, 'samples_dead_lettered', samples)
if stream ~= '' then redis.call('XACK', stream, consumer_group, entry) end
return 1
