#!lua
-- The global step of a batch of writes (slot {g}): applies each item's delta to the counters and
-- indexes, registers its group id with the attempt's token, and acks its stream entry, all at once.
-- A delta is applied exactly once: a fresh delta always is; a recorded one only if its group id is
-- not yet registered.
--
-- ARGV: prefix now window stream consumer_group count, then count items, each ITEM_SIZE values at the
--       ITEM offsets (kind 'group' or 'eviction', group_id, token, entry_id, prompt_id, samples, searcher
--       label, delta, fresh): GLOBAL_ITEM_FIELDS in services/buffer/redis_scripts.py names them.
-- An item's token is its stream entry id, or the id of its intent (HTTP writes, evictions).
-- Returns {samples stored, then per item: 0 applied, 1 resent group id (counted duplicate),
--          2 nothing to do (entry handled by another consumer, attempt already applied)}.
local prefix, now, window = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local stream, consumer_group, count = ARGV[4], ARGV[5], tonumber(ARGV[6])
local APPLIED, RESENT, NOTHING_TO_DO = 0, 1, 2
local stats = prefix .. 'stats'

-- Counter changes are summed over the batch and written once at the end: additive, so
-- deltas of one prompt may arrive in any order, and a batch costs few commands per group.
local counter_changes, version_changes, sample_change, reward_change = {}, {}, 0, 0
local function add(name, change) counter_changes[name] = (counter_changes[name] or 0) + change end
local function apply_counts(delta)
  for version, change in pairs(delta.version_changes) do
    version_changes[version] = (version_changes[version] or 0) + change
    sample_change = sample_change + change
  end
  reward_change = reward_change + tonumber(delta.reward_change)
  add('samples_evicted', delta.evicted)
  add('samples_duplicate', delta.duplicates)
end
local function flush_counts()
  local version_counts = prefix .. 'version_counts'
  for version, change in pairs(version_changes) do
    if change ~= 0 and redis.call('HINCRBY', version_counts, version, change) <= 0 then
      redis.call('HDEL', version_counts, version)
    end
  end
  for name, change in pairs(counter_changes) do
    if change ~= 0 then redis.call('HINCRBY', stats, name, change) end
  end
  local samples = redis.call('HINCRBY', stats, 'samples', sample_change)
  -- Summed here and written with HSET, which cannot fail (HINCRBYFLOAT refuses a result it cannot
  -- store): a script that errs after its first write leaves the counters half-updated.
  local sum = 0
  if samples > 0 then sum = (tonumber(redis.call('HGET', stats, 'reward_sum')) or 0) + reward_change end
  redis.call('HSET', stats, 'reward_sum', string.format('%.17g', sum))
  return samples
end

-- Indexes show the prompt's newest known state: a delta older than the one shown changes none.
local function apply_index(prompt, delta)
  local shown = redis.call('HGET', prefix .. 'index_state', prompt)
  local had = {}
  if shown then
    shown = cmsgpack.unpack(shown)
    if shown.revision >= delta.revision then return end
    for _, v in ipairs(shown.versions) do had[v] = true end
  end
  local holds = {}
  for _, v in ipairs(delta.versions) do
    holds[v] = true
    if not had[v] then redis.call('ZADD', prefix .. 'version_prompts:' .. vstr(v), 0, prompt) end
  end
  for v in pairs(had) do
    if not holds[v] then redis.call('ZREM', prefix .. 'version_prompts:' .. vstr(v), prompt) end
  end
  if delta.oldest < 0 then
    redis.call('ZREM', prefix .. 'newest_version', prompt)
    redis.call('ZREM', prefix .. 'oldest_sample', prompt)
    redis.call('ZREM', prefix .. 'arrivals', prompt)
  else
    redis.call('ZADD', prefix .. 'newest_version', vstr(delta.newest), prompt)
    redis.call('ZADD', prefix .. 'oldest_sample', vstr(delta.oldest), prompt)
  end
  redis.call('HSET', prefix .. 'index_state', prompt,
             cmsgpack.pack({revision = delta.revision, versions = delta.versions}))
end

local groups, group_tokens, intents = prefix .. 'groups', prefix .. 'group_tokens', prefix .. 'intents'
local answers, labels, added_by = {}, {}, {}
for i = 0, count - 1 do
  local b = 7 + ITEM_SIZE * i
  local kind, group_id, token = ARGV[b + ITEM.kind], ARGV[b + ITEM.group_id], ARGV[b + ITEM.token]
  local entry, prompt, samples = ARGV[b + ITEM.entry_id], ARGV[b + ITEM.prompt_id], tonumber(ARGV[b + ITEM.samples])
  local label, packed, fresh = ARGV[b + ITEM.label], ARGV[b + ITEM.delta], ARGV[b + ITEM.fresh] == '1'
  local answer = APPLIED
  -- Acked here, atomically with what follows; 0 acked: another consumer took it over and finished it.
  if entry ~= '' and redis.call('XACK', stream, consumer_group, entry) == 0 then
    answer = NOTHING_TO_DO
  elseif kind == 'eviction' then
    local intent = redis.call('HGET', intents, token)
    if intent then
      redis.call('HDEL', intents, token)
      add('evict_reserved', -cmsgpack.unpack(intent).count)
      local delta = cmsgpack.unpack(packed)
      apply_counts(delta)
      apply_index(prompt, delta)
    else
      answer = NOTHING_TO_DO
    end
  else
    if token ~= entry then redis.call('HDEL', intents, token) end
    local known = redis.call('HGET', group_tokens, group_id)
    if known == token then
      answer = NOTHING_TO_DO  -- this very attempt was finished already (by the recovery sweep)
    else
      add('groups_ingested', 1)
      add('samples_ingested', samples)
      if known and not fresh then  -- resent: its samples were stored by the first copy
        add('groups_duplicate', 1)
        add('samples_duplicate', samples)
        answer = RESENT
      else
        local delta = cmsgpack.unpack(packed)
        apply_counts(delta)
        apply_index(prompt, delta)
        local searcher = string.match(label, '^(.*)|')  -- the label is '<searcher>|<version>'
        if searcher then added_by[searcher] = (added_by[searcher] or 0) + tonumber(delta.added) end
        -- The arrival order the recency branch serves new groups in (pick_prompts.lua): the prompt moves to
        -- the end of the queue, numbered by the groups that arrived before it.
        if redis.call('ZSCORE', prefix .. 'newest_version', prompt) then
          redis.call('ZADD', prefix .. 'arrivals', redis.call('HINCRBY', stats, 'groups_arrived', 1), prompt)
        end
        labels[label] = true
        redis.call('ZADD', groups, now, group_id)
        redis.call('HSET', group_tokens, group_id, token)
      end
    end
  end
  answers[#answers + 1] = answer
end
for label in pairs(labels) do redis.call('SADD', prefix .. 'searchers', label) end
for searcher, added in pairs(added_by) do
  if added ~= 0 then redis.call('HINCRBY', prefix .. 'searcher_samples', searcher, added) end
end
local expired = redis.call('ZRANGEBYSCORE', groups, '-inf', '(' .. string.format('%.17g', now - window))
if #expired > 0 then
  sliced('ZREM', groups, expired)
  sliced('HDEL', group_tokens, expired)
end
local out = {flush_counts()}
for _, answer in ipairs(answers) do out[#out + 1] = answer end
return out
