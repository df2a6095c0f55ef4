#!lua flags=no-writes
-- One prompt's record and samples, read atomically (slot {p:<id>}).
-- KEYS[1]: its meta key.  ARGV: prefix
-- Returns {prompt_ids, text, task, then per sample: id, version, reward, copies}
-- ({} when the prompt is gone).
local prefix = ARGV[1]
local meta = redis.call('HMGET', prefix .. 'meta', 'ids', 'text', 'task')
if not meta[1] then return {} end
local order = redis.call('ZRANGE', prefix .. 'order', 0, -1, 'WITHSCORES')
local function as_table(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end
local rewards = as_table(redis.call('HGETALL', prefix .. 'rewards'))
local copies = as_table(redis.call('HGETALL', prefix .. 'copies'))
local out = {meta[1], meta[2] or '', meta[3] or ''}
for i = 1, #order, 2 do
  local sid = order[i]
  out[#out + 1] = sid
  out[#out + 1] = version_of(order[i + 1])
  out[#out + 1] = rewards[sid]
  out[#out + 1] = copies[sid] or 1
end
return out
