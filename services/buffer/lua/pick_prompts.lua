#!lua flags=no-writes
-- Pick a batch's prompts from the global indexes (slot {g}, one consistent snapshot of them), and
-- compute the version cut-offs of the sampling rule, the only place they are computed: a sample may
-- serve the reward branch when its version >= reward_low, the recency branch when >= recency_low.
-- ARGV: prefix trainer_version recent_versions max_staleness ('' none) only_version ('' none)
--       num_prompts recency_slots after_arrival ('' none) u_1 .. u_2P (uniforms in [0, 1) from the
--       caller's seeded RNG)
-- Returns {eligible, reward_low} when fewer than num_prompts prompts are eligible, else
-- {eligible, reward_low, recency_low, recency_taken, arrival_cursor ('' none), prompt ids (the recency
-- picks first) ...}.
-- Cut-offs are strings ('-inf' when unbounded); with only_version, both are that version.
--
-- The recency branch takes prompts holding a sample of the newest recent_versions versions (and within
-- the staleness bound), and draws among those samples; it picks them one of two ways. With after_arrival,
-- in arrival order: the prompts whose newest group arrived after that arrival number (global_step.lua
-- numbers them), oldest first, passing over those that fell out of the window; the returned
-- arrival_cursor is the number of the last one looked at, for the caller's next request, so that each
-- arrival is served once. Without it, uniformly.
local prefix = ARGV[1]
local trainer_version, recent_versions = tonumber(ARGV[2]), tonumber(ARGV[3])
local num_prompts, recency_slots = tonumber(ARGV[6]), tonumber(ARGV[7])
local after_arrival = ARGV[8]
local next_uniform = 9

local function bound(version)
  if version == -math.huge then return '-inf' end
  return vstr(version)
end

local reward_low = -math.huge
if ARGV[4] ~= '' then reward_low = trainer_version - tonumber(ARGV[4]) end

-- index: the sorted set to draw from, its prompts ranked by the newest version each holds (only_version:
-- every prompt holding that version, in any order); n_reward and n_recency: how many of its top-ranked
-- prompts each branch may take.
local index, size, n_reward, n_recency, recency_low
if ARGV[5] ~= '' then
  local only_version = tonumber(ARGV[5])
  index = prefix .. 'version_prompts:' .. ARGV[5]
  size = redis.call('ZCARD', index)
  if only_version < reward_low then size = 0 end
  n_reward, n_recency = size, size
  reward_low, recency_low = only_version, only_version
else
  index = prefix .. 'newest_version'
  size = redis.call('ZCARD', index)
  if size == 0 then return {0, bound(reward_low)} end
  local newest = tonumber(redis.call('ZRANGE', index, -1, -1, 'WITHSCORES')[2])
  recency_low = math.max(newest - recent_versions + 1, reward_low)
  n_reward = redis.call('ZCOUNT', index, bound(reward_low), '+inf')
  n_recency = redis.call('ZCOUNT', index, bound(recency_low), '+inf')
end
if n_reward < num_prompts then return {n_reward, bound(reward_low)} end

-- k distinct ranks in [offset, offset + n): a partial Fisher-Yates over a virtual array.
local function draw(k, n, offset)
  local swap, out = {}, {}
  for i = 0, k - 1 do
    local j = i + math.floor(tonumber(ARGV[next_uniform]) * (n - i))
    next_uniform = next_uniform + 1
    if j > n - 1 then j = n - 1 end
    local vi, vj = swap[i] or i, swap[j] or j
    swap[j] = vi
    out[#out + 1] = offset + vj
  end
  return out
end

local picks, cursor = {}, ''
if after_arrival ~= '' and ARGV[5] == '' then
  cursor = tonumber(after_arrival)
  -- A cursor beyond every arrival numbered: the buffer's Redis started afresh; serve from its start.
  if cursor > (tonumber(redis.call('HGET', prefix .. 'stats', 'groups_arrived')) or 0) then cursor = 0 end
  while #picks < recency_slots do
    local next_arrivals = redis.call('ZRANGEBYSCORE', prefix .. 'arrivals', '(' .. vstr(cursor), '+inf',
                                     'WITHSCORES', 'LIMIT', 0, recency_slots - #picks)
    if #next_arrivals == 0 then break end
    for i = 1, #next_arrivals, 2 do
      local prompt = next_arrivals[i]
      cursor = tonumber(next_arrivals[i + 1])
      local newest = redis.call('ZSCORE', index, prompt)
      if newest and tonumber(newest) >= recency_low then picks[#picks + 1] = prompt end
    end
  end
  cursor = vstr(cursor)
else
  for _, rank in ipairs(draw(math.min(recency_slots, n_recency), n_recency, size - n_recency)) do
    picks[#picks + 1] = redis.call('ZRANGE', index, rank, rank)[1]
  end
end

local out, chosen = {n_reward, bound(reward_low), bound(recency_low), #picks, cursor}, {}
for _, prompt in ipairs(picks) do
  chosen[prompt] = true
  out[#out + 1] = prompt
end
local recency_taken = #picks
local need = num_prompts - recency_taken
for _, rank in ipairs(draw(math.min(n_reward, num_prompts), n_reward, size - n_reward)) do
  if need == 0 then break end
  local prompt = redis.call('ZRANGE', index, rank, rank)[1]
  if not chosen[prompt] then
    chosen[prompt] = true
    out[#out + 1] = prompt
    need = need - 1
  end
end
return out
