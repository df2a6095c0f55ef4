#!lua
-- The prompt step: changes one prompt's keys (slot {p:<id>}) and records what it changed, the delta,
-- under the attempt's id. Run again for the same id within the window, it changes nothing and returns
-- the recorded delta.
--
-- KEYS[1]: the prompt's meta key (routes the call to the prompt's slot).
-- ARGV: prefix mode id now window, then by mode:
--   'write'   (id: the group id)      capacity prompt_ids text task version first_arrival n,
--                                     then n times: sample_id reward record
--   'evict'   (id: the intent token)  count bound: evict up to count samples scored below bound
--   'recover' (id: the group id)      return the recorded delta, or mark the attempt abandoned
-- Returns {delta, fresh}: the msgpack delta ('' when there is none) and 1 if this call made it.
-- The delta: {version_changes = {version = count change}, reward_change, added, duplicates, evicted,
--             revision = the prompt's change count, oldest = oldest score or -1,
--             newest = newest version or -1, versions = versions held}.
local prefix, mode, id = ARGV[1], ARGV[2], ARGV[3]
local now, window = tonumber(ARGV[4]), tonumber(ARGV[5])

local function key(name) return prefix .. name end
local delta_id = id
if mode == 'evict' then delta_id = 'eviction:' .. id end

local seen = redis.call('ZSCORE', key('groups'), delta_id)
if seen and tonumber(seen) >= now - window then
  local recorded = redis.call('HGET', key('deltas'), delta_id)
  if recorded and recorded ~= '' then return {recorded, 0} end
end
if mode == 'recover' then  -- never written: abandon the attempt (a late write still succeeds, afresh)
  redis.call('ZADD', key('groups'), now, delta_id)
  redis.call('HSET', key('deltas'), delta_id, '')
  return {'', 0}
end

-- Lua scripts are atomic but not rolled back: refuse before the first write if a key
-- of this prompt has been overwritten with another type, so nothing partial is stored.
for _, name in ipairs({'meta', 'order', 'rewards', 'records', 'copies', 'version_counts', 'groups', 'deltas'}) do
  local want = 'hash'
  if name == 'order' or name == 'groups' then want = 'zset' end
  local t = redis.call('TYPE', key(name))['ok']
  if t ~= 'none' and t ~= want then
    return redis.error_reply('WRONGTYPE ' .. key(name) .. ' holds a ' .. t .. ', not a ' .. want)
  end
end

local order, rewards, records, copies = key('order'), key('rewards'), key('records'), key('copies')
local version_changes, reward_change, evicted = {}, 0, 0
local function note(version, reward, sign)
  version_changes[version] = (version_changes[version] or 0) + sign
  reward_change = reward_change + sign * tonumber(reward)
end

-- Evict the n oldest samples (oldest version, then oldest arrival).
local function evict_oldest(n)
  local oldest = redis.call('ZRANGE', order, 0, n - 1, 'WITHSCORES')
  local ids = {}
  for i = 1, #oldest, 2 do ids[#ids + 1] = oldest[i] end
  if #ids == 0 then return end
  local their_rewards = sliced('HMGET', rewards, ids)
  for j = 1, #ids do note(version_of(oldest[2 * j]), their_rewards[j], -1) end
  redis.call('ZREMRANGEBYRANK', order, 0, #ids - 1)
  sliced('HDEL', rewards, ids)
  sliced('HDEL', records, ids)
  sliced('HDEL', copies, ids)
  evicted = evicted + #ids
end

local added, duplicates = 0, 0
if mode == 'write' then
  local capacity, version, first_arrival = tonumber(ARGV[6]), tonumber(ARGV[10]), tonumber(ARGV[11])
  local n = tonumber(ARGV[12])
  if redis.call('EXISTS', key('meta')) == 0 then
    redis.call('HSET', key('meta'), 'ids', ARGV[7], 'text', ARGV[8], 'task', ARGV[9])
  end
  local ids = {}
  for i = 0, n - 1 do ids[i + 1] = ARGV[13 + 3 * i] end
  local old_scores = sliced('ZMSCORE', order, ids)
  local stored = {}  -- sample id -> {version, reward, copies} of the copy already stored, when it will be replaced
  local replace = {}
  for i = 1, n do
    if old_scores[i] and not stored[ids[i]] then
      local old_version = version_of(old_scores[i])
      stored[ids[i]] = {old_version}
      if version >= old_version then replace[#replace + 1] = ids[i] end
    end
  end
  local old_rewards = sliced('HMGET', rewards, replace)
  local old_copies = sliced('HMGET', copies, replace)
  for j, sid in ipairs(replace) do
    stored[sid][2] = old_rewards[j]
    stored[sid][3] = tonumber(old_copies[j]) or 1
  end

  -- sample id -> {score, reward, record, copies}: what this group writes
  local pending, write_order = {}, {}
  for i = 1, n do
    local sid, reward, record = ids[i], ARGV[14 + 3 * (i - 1)], ARGV[15 + 3 * (i - 1)]
    local item = {vstr(version * VERSION_SHIFT + first_arrival + i), reward, record, 1}
    if pending[sid] then  -- repeated within this group: the later copy wins, one more copy of this version
      duplicates = duplicates + 1
      note(version, pending[sid][2], -1)
      note(version, reward, 1)
      item[4] = pending[sid][4] + 1
      pending[sid] = item
    elseif stored[sid] then  -- exact duplicate of a stored sample: keep the newest version
      duplicates = duplicates + 1
      if stored[sid][2] then
        note(stored[sid][1], stored[sid][2], -1)
        note(version, reward, 1)
        if stored[sid][1] == version then item[4] = stored[sid][3] + 1 end
        pending[sid] = item
        write_order[#write_order + 1] = sid
      end
    else
      added = added + 1
      note(version, reward, 1)
      pending[sid] = item
      write_order[#write_order + 1] = sid
    end
  end
  local order_args, reward_args, record_args, copies_args, singles = {}, {}, {}, {}, {}
  for _, sid in ipairs(write_order) do
    local item = pending[sid]
    order_args[#order_args + 1] = item[1]; order_args[#order_args + 1] = sid
    reward_args[#reward_args + 1] = sid; reward_args[#reward_args + 1] = item[2]
    record_args[#record_args + 1] = sid; record_args[#record_args + 1] = item[3]
    if item[4] > 1 then
      copies_args[#copies_args + 1] = sid; copies_args[#copies_args + 1] = item[4]
    else
      singles[#singles + 1] = sid
    end
  end
  if #write_order > 0 then
    sliced('ZADD', order, order_args)
    sliced('HSET', rewards, reward_args)
    sliced('HSET', records, record_args)
  end
  if #copies_args > 0 then sliced('HSET', copies, copies_args) end
  if #singles > 0 then sliced('HDEL', copies, singles) end
  local excess = redis.call('ZCARD', order) - capacity
  if excess > 0 then evict_oldest(excess) end
else  -- 'evict': global capacity, samples older than the next prompt's oldest first
  local n = tonumber(ARGV[6])
  if ARGV[7] ~= '+inf' then n = math.min(n, redis.call('ZCOUNT', order, '-inf', '(' .. ARGV[7])) end
  if n < 1 then n = 1 end
  evict_oldest(n)
end

-- Per-version counts of this prompt, and the state the global indexes should show.
local changes = {}
for version, change in pairs(version_changes) do
  if change ~= 0 then
    local v = vstr(version)
    changes[v] = change
    if redis.call('HINCRBY', key('version_counts'), v, change) <= 0 then redis.call('HDEL', key('version_counts'), v) end
  end
end
local versions = {}
for _, v in ipairs(redis.call('HKEYS', key('version_counts'))) do versions[#versions + 1] = tonumber(v) end
local oldest, newest = -1, -1
local first = redis.call('ZRANGE', order, 0, 0, 'WITHSCORES')
if #first > 0 then
  oldest = tonumber(first[2])
  newest = version_of(redis.call('ZRANGE', order, -1, -1, 'WITHSCORES')[2])
else  -- empty: drop the prompt's data (its group record and change count stay)
  redis.call('DEL', key('meta'), key('rewards'), key('records'), key('copies'), key('version_counts'))
end
local delta = cmsgpack.pack({version_changes = changes, reward_change = string.format('%.17g', reward_change),
                             added = added, duplicates = duplicates, evicted = evicted,
                             revision = redis.call('INCR', key('revision')), oldest = oldest, newest = newest,
                             versions = versions})
redis.call('ZADD', key('groups'), now, delta_id)
redis.call('HSET', key('deltas'), delta_id, delta)
local expired = redis.call('ZRANGEBYSCORE', key('groups'), '-inf', '(' .. string.format('%.17g', now - window))
if #expired > 0 then
  sliced('ZREM', key('groups'), expired)
  sliced('HDEL', key('deltas'), expired)
end
return {delta, 1}
