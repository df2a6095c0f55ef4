"""The buffer's Lua scripts: every write that must be atomic happens inside one of them.

Each script touches the keys of **one hash slot** only, so the same scripts run on a
single Redis and on Redis Cluster:

- the *prompt* script (:data:`PROMPT`) changes one prompt's keys, slot ``{p:<id>}``;
- the *global* scripts (:data:`APPLY`, :data:`INTENT`, :data:`PLAN_EVICTION`,
  :data:`DEAD_LETTER`, :data:`PICK`) change the shared indexes and counters, slot ``{g}``,
  where the trajectory and dead-letter streams also live (so an entry's ack is part of
  the global step).

A write is therefore two steps, each atomic and each idempotent:

1. the prompt step stores the group's samples in its prompt (dedup, per-prompt capacity)
   and records what it changed, the *delta*, under the group id; run again for the same
   group id it changes nothing and returns the recorded delta (``fresh = 0``);
2. the global step applies the delta to the counters and indexes, registers the group id
   with the *token* of this attempt (the stream entry id, or an intent id), and acks the
   stream entry, all at once. A delta is applied exactly once: a fresh delta always is; a
   recorded one only if its group id is not yet registered.

A crash between the two steps leaves the delta recorded but not applied: a stream entry
stays pending and is redelivered or reclaimed, and its replay applies it; a write that
came over HTTP, and every global eviction, first records an *intent* in the global slot
(``G intents``) that a recovery sweep finishes (:meth:`BufferStore.recover`). The prompt
step's record of group ids is kept for ``dedup_window`` seconds and the global one a
margin longer, so a replay the prompt recognises is always one the global step can judge.

Layout (names from :class:`tba.keys.Keys`; ``G`` is the global prefix ``<ns>:{g}:``,
``P`` a prompt's prefix ``<ns>:{p:<id>}:``):

- ``P meta``  hash: the prompt record, once (``ids`` msgpack token ids, ``text``, ``task``).
- ``P ord``   sorted set: sample id -> ``version * 2**32 + seq`` (eviction order; ``seq`` is a
  global arrival counter ``G seq``, so "oldest version first, then oldest arrival" is the
  lowest score, across prompts too).
- ``P rew``   hash: sample id -> reward.   ``P rec``: sample id -> msgpack record.
- ``P cnt``   hash: sample id -> copies of it generated at its stored version, when more than one
  (absent: one). Sync mode draws from these multiplicities, so its batches are on-policy samples.
- ``P pv``    hash: version -> samples of that version in this prompt.
- ``P groups`` sorted set: group id -> time; ``P deltas`` hash: group id -> msgpack delta
  (``''`` marks an attempt the recovery sweep abandoned); ``P rev`` the prompt's change count.
- ``G pmax``  sorted set: prompt -> newest version it holds (recency and staleness picks by
  rank: O(log N) per prompt drawn, never a scan).  ``G gold``: prompt -> its oldest score.
- ``G vp:<v>`` sorted set: prompts holding samples of version v (``only_version``).
- ``G pidx``  hash: prompt -> msgpack ``{rev, vs}``, the prompt state the indexes show (deltas
  applied out of order never roll an index back).
- ``G vcount`` hash: version -> samples.  ``G stats``: counters (``groups_stored`` is derived:
  ``groups_ingested - groups_duplicate - dead_letters``).  ``G groups``: group id -> time,
  ``G gtok``: group id -> token.  ``G searchers``: ``"<id>|<version>"``.  ``G intents``:
  token -> msgpack intent.  ``G seq``: the arrival counter.  ``G objective``: the run's temperature
  and reference model identity, pinned by the first group or trainer that states them.

A sample id is a digest of its completion token ids, so an exact-duplicate completion of a
prompt lands on the same id and replaces the older copy.

All counters are in samples unless named ``groups_*``/``dead_letters``; they obey
``samples_ingested == samples + samples_evicted + samples_duplicate + samples_dead_lettered``.
"""

from __future__ import annotations

# 2**32: the version sits above a 32-bit arrival counter; versions stay below 2**21
# (tba.schemas.MAX_VERSION, enforced on every message) so that every score is an integer
# a double holds exactly (< 2**53).
VERSION_SHIFT = 4294967296

_COMMON = """
local SHIFT = 4294967296
local function vstr(v) return string.format('%d', v) end

-- redis.call(cmd, key, items...) in slices, so no group or prompt is too large for unpack().
local function sliced(cmd, key, items)
  local out = {}
  for s = 1, #items, 1000 do
    local part = {}
    for j = s, math.min(s + 999, #items) do part[#part + 1] = items[j] end
    local res = redis.call(cmd, key, unpack(part))
    if type(res) == 'table' then
      for j = 1, #part do out[#out + 1] = res[j] end
    end
  end
  return out
end
"""

# KEYS[1]: the prompt's meta key (routes the call to the prompt's slot).
# ARGV: P mode id now window ...
#   mode 'w' (write group id):  pcap prompt_ids text task version seq0 n [h reward record]*n
#   mode 'e' (evict, id = intent token): k bound (evict up to k samples scored below bound)
#   mode 'r' (recover group id): return the recorded delta, or mark the attempt abandoned
# Returns {delta, fresh}: the msgpack delta (or '' when there is none) and 1 if this call made it.
# The delta: {d = {version = count change}, rd = reward change, a = added, u = duplicates,
#             e = evicted, rev = the prompt's change count, o = oldest score or -1,
#             m = newest version or -1, vs = versions held}.
PROMPT = """#!lua
local P, mode, id = ARGV[1], ARGV[2], ARGV[3]
local now, window = tonumber(ARGV[4]), tonumber(ARGV[5])
""" + _COMMON + """
local function k(name) return P .. name end
local dkey = id
if mode == 'e' then dkey = 'ev:' .. id end

local seen = redis.call('ZSCORE', k('groups'), dkey)
if seen and tonumber(seen) >= now - window then
  local blob = redis.call('HGET', k('deltas'), dkey)
  if blob and blob ~= '' then return {blob, 0} end
end
if mode == 'r' then  -- never written: abandon the attempt (a late write still succeeds, afresh)
  redis.call('ZADD', k('groups'), now, dkey)
  redis.call('HSET', k('deltas'), dkey, '')
  return {'', 0}
end

-- Lua scripts are atomic but not rolled back: refuse before the first write if a key
-- of this prompt has been overwritten with another type, so nothing partial is stored.
for _, name in ipairs({'meta', 'ord', 'rew', 'rec', 'cnt', 'pv', 'groups', 'deltas'}) do
  local want = 'hash'
  if name == 'ord' or name == 'groups' then want = 'zset' end
  local t = redis.call('TYPE', k(name))['ok']
  if t ~= 'none' and t ~= want then
    return redis.error_reply('WRONGTYPE ' .. k(name) .. ' holds a ' .. t .. ', not a ' .. want)
  end
end

local ord, rew, rec, cnt = k('ord'), k('rew'), k('rec'), k('cnt')
local delta, reward_delta, evicted = {}, 0, 0
local function note(v, r, sign)
  delta[v] = (delta[v] or 0) + sign
  reward_delta = reward_delta + sign * tonumber(r)
end

-- Evict the n oldest samples (oldest version, then oldest arrival).
local function evict_oldest(n)
  local e = redis.call('ZRANGE', ord, 0, n - 1, 'WITHSCORES')
  local hs = {}
  for i = 1, #e, 2 do hs[#hs + 1] = e[i] end
  if #hs == 0 then return end
  local rs = sliced('HMGET', rew, hs)
  for j = 1, #hs do note(math.floor(tonumber(e[2 * j]) / SHIFT), rs[j], -1) end
  redis.call('ZREMRANGEBYRANK', ord, 0, #hs - 1)
  sliced('HDEL', rew, hs)
  sliced('HDEL', rec, hs)
  sliced('HDEL', cnt, hs)
  evicted = evicted + #hs
end

local added, dup = 0, 0
if mode == 'w' then
  local pcap, version, seq0 = tonumber(ARGV[6]), tonumber(ARGV[10]), tonumber(ARGV[11])
  local n = tonumber(ARGV[12])
  if redis.call('EXISTS', k('meta')) == 0 then
    redis.call('HSET', k('meta'), 'ids', ARGV[7], 'text', ARGV[8], 'task', ARGV[9])
  end
  local hs = {}
  for i = 0, n - 1 do hs[i + 1] = ARGV[13 + 3 * i] end
  local old_scores = sliced('ZMSCORE', ord, hs)
  local stored = {}  -- sample id -> {version, reward} of the copy already stored, when it will be replaced
  local replace = {}
  for i = 1, n do
    if old_scores[i] and not stored[hs[i]] then
      local oldv = math.floor(tonumber(old_scores[i]) / SHIFT)
      stored[hs[i]] = {oldv}
      if version >= oldv then replace[#replace + 1] = hs[i] end
    end
  end
  local old_rewards = sliced('HMGET', rew, replace)
  local old_counts = sliced('HMGET', cnt, replace)
  for j, h in ipairs(replace) do
    stored[h][2] = old_rewards[j]
    stored[h][3] = tonumber(old_counts[j]) or 1
  end

  -- sample id -> {score, reward, record, copies}: what this group writes
  local pend, order = {}, {}
  for i = 1, n do
    local h, r, body = hs[i], ARGV[14 + 3 * (i - 1)], ARGV[15 + 3 * (i - 1)]
    local item = {vstr(version * SHIFT + seq0 + i), r, body, 1}
    if pend[h] then  -- repeated within this group: the later copy wins, one more copy of this version
      dup = dup + 1
      note(version, pend[h][2], -1)
      note(version, r, 1)
      item[4] = pend[h][4] + 1
      pend[h] = item
    elseif stored[h] then  -- exact duplicate of a stored sample: keep the newest version
      dup = dup + 1
      if stored[h][2] then
        note(stored[h][1], stored[h][2], -1)
        note(version, r, 1)
        if stored[h][1] == version then item[4] = stored[h][3] + 1 end
        pend[h] = item
        order[#order + 1] = h
      end
    else
      added = added + 1
      note(version, r, 1)
      pend[h] = item
      order[#order + 1] = h
    end
  end
  local zargs, rargs, cargs, nargs, singles = {}, {}, {}, {}, {}
  for _, h in ipairs(order) do
    local e = pend[h]
    zargs[#zargs + 1] = e[1]; zargs[#zargs + 1] = h
    rargs[#rargs + 1] = h; rargs[#rargs + 1] = e[2]
    cargs[#cargs + 1] = h; cargs[#cargs + 1] = e[3]
    if e[4] > 1 then nargs[#nargs + 1] = h; nargs[#nargs + 1] = e[4] else singles[#singles + 1] = h end
  end
  if #order > 0 then
    sliced('ZADD', ord, zargs)
    sliced('HSET', rew, rargs)
    sliced('HSET', rec, cargs)
  end
  if #nargs > 0 then sliced('HSET', cnt, nargs) end
  if #singles > 0 then sliced('HDEL', cnt, singles) end
  local excess = redis.call('ZCARD', ord) - pcap
  if excess > 0 then evict_oldest(excess) end
else  -- 'e': global capacity, samples older than the next prompt's oldest first
  local n = tonumber(ARGV[6])
  if ARGV[7] ~= '+inf' then n = math.min(n, redis.call('ZCOUNT', ord, '-inf', '(' .. ARGV[7])) end
  if n < 1 then n = 1 end
  evict_oldest(n)
end

-- Per-version counts of this prompt, and the state the global indexes should show.
local changes = {}
for v, c in pairs(delta) do
  if c ~= 0 then
    local vs = vstr(v)
    changes[vs] = c
    if redis.call('HINCRBY', k('pv'), vs, c) <= 0 then redis.call('HDEL', k('pv'), vs) end
  end
end
local versions = {}
for _, v in ipairs(redis.call('HKEYS', k('pv'))) do versions[#versions + 1] = tonumber(v) end
local oldest, newest = -1, -1
local first = redis.call('ZRANGE', ord, 0, 0, 'WITHSCORES')
if #first > 0 then
  oldest = tonumber(first[2])
  newest = math.floor(tonumber(redis.call('ZRANGE', ord, -1, -1, 'WITHSCORES')[2]) / SHIFT)
else  -- empty: drop the prompt's data (its group record and change count stay)
  redis.call('DEL', k('meta'), k('rew'), k('rec'), k('cnt'), k('pv'))
end
local blob = cmsgpack.pack({d = changes, rd = string.format('%.17g', reward_delta), a = added, u = dup,
                            e = evicted, rev = redis.call('INCR', k('rev')), o = oldest, m = newest,
                            vs = versions})
redis.call('ZADD', k('groups'), now, dkey)
redis.call('HSET', k('deltas'), dkey, blob)
local old = redis.call('ZRANGEBYSCORE', k('groups'), '-inf', '(' .. string.format('%.17g', now - window))
if #old > 0 then
  sliced('ZREM', k('groups'), old)
  sliced('HDEL', k('deltas'), old)
end
return {blob, 1}
"""

_APPLY_DELTA = """
local stats = G .. 'stats'

-- Counter changes are summed over the batch and written once at the end: additive, so
-- deltas of one prompt may arrive in any order, and a batch costs few commands per group.
local inc, vinc, total, reward = {}, {}, 0, 0
local function add(name, c) inc[name] = (inc[name] or 0) + c end
local function apply_counts(d)
  for vs, c in pairs(d.d) do
    vinc[vs] = (vinc[vs] or 0) + c
    total = total + c
  end
  reward = reward + tonumber(d.rd)
  add('samples_evicted', d.e)
  add('samples_duplicate', d.u)
end
local function flush_counts()
  for vs, c in pairs(vinc) do
    if c ~= 0 and redis.call('HINCRBY', G .. 'vcount', vs, c) <= 0 then redis.call('HDEL', G .. 'vcount', vs) end
  end
  for name, c in pairs(inc) do
    if c ~= 0 then redis.call('HINCRBY', stats, name, c) end
  end
  local samples = redis.call('HINCRBY', stats, 'samples', total)
  -- Summed here and written with HSET, which cannot fail (HINCRBYFLOAT refuses a result it cannot
  -- store): a script that errs after its first write leaves the counters half-updated.
  local sum = 0
  if samples > 0 then sum = (tonumber(redis.call('HGET', stats, 'reward_sum')) or 0) + reward end
  redis.call('HSET', stats, 'reward_sum', string.format('%.17g', sum))
  return samples
end

-- Indexes show the prompt's newest known state: a delta older than the one shown changes none.
local function apply_index(p, d)
  local cur = redis.call('HGET', G .. 'pidx', p)
  local had = {}
  if cur then
    cur = cmsgpack.unpack(cur)
    if cur.rev >= d.rev then return end
    for _, v in ipairs(cur.vs) do had[v] = true end
  end
  local now_in = {}
  for _, v in ipairs(d.vs) do
    now_in[v] = true
    if not had[v] then redis.call('ZADD', G .. 'vp:' .. vstr(v), 0, p) end
  end
  for v in pairs(had) do
    if not now_in[v] then redis.call('ZREM', G .. 'vp:' .. vstr(v), p) end
  end
  if d.o < 0 then
    redis.call('ZREM', G .. 'pmax', p)
    redis.call('ZREM', G .. 'gold', p)
  else
    redis.call('ZADD', G .. 'pmax', vstr(d.m), p)
    redis.call('ZADD', G .. 'gold', vstr(d.o), p)
  end
  redis.call('HSET', G .. 'pidx', p, cmsgpack.pack({rev = d.rev, vs = d.vs}))
end
"""

# ARGV: G now window stream cgroup count, then count items of
#       kind ('g' group, 'e' eviction) id token entry_id prompt_id n searcher_label delta fresh
# An item's token is its stream entry id, or the id of its intent (HTTP writes, evictions).
# Returns {samples stored, then per item: 0 applied, 1 resent group id (counted duplicate),
#          2 nothing to do (entry handled by another consumer, attempt already applied)}.
APPLY = """#!lua
local G, now, window = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local stream, cgroup, count = ARGV[4], ARGV[5], tonumber(ARGV[6])
""" + _COMMON + _APPLY_DELTA + """
local groups, gtok, intents = G .. 'groups', G .. 'gtok', G .. 'intents'
local results, labels = {}, {}
for i = 0, count - 1 do
  local b = 7 + 9 * i
  local kind, id, token, entry, p = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  local n, label, blob, fresh = tonumber(ARGV[b + 5]), ARGV[b + 6], ARGV[b + 7], ARGV[b + 8] == '1'
  local result = 0
  -- Acked here, atomically with what follows; 0 acked: another consumer took it over and finished it.
  if entry ~= '' and redis.call('XACK', stream, cgroup, entry) == 0 then
    result = 2
  elseif kind == 'e' then
    local intent = redis.call('HGET', intents, token)
    if intent then
      redis.call('HDEL', intents, token)
      add('evict_reserved', -cmsgpack.unpack(intent).k)
      local d = cmsgpack.unpack(blob)
      apply_counts(d)
      apply_index(p, d)
    else
      result = 2
    end
  else
    if token ~= entry then redis.call('HDEL', intents, token) end
    local known = redis.call('HGET', gtok, id)
    if known == token then
      result = 2  -- this very attempt was finished already (by the recovery sweep)
    else
      add('groups_ingested', 1)
      add('samples_ingested', n)
      if known and not fresh then  -- resent: its samples were stored by the first copy
        add('groups_duplicate', 1)
        add('samples_duplicate', n)
        result = 1
      else
        local d = cmsgpack.unpack(blob)
        apply_counts(d)
        apply_index(p, d)
        labels[label] = true
        redis.call('ZADD', groups, now, id)
        redis.call('HSET', gtok, id, token)
      end
    end
  end
  results[#results + 1] = result
end
for label in pairs(labels) do redis.call('SADD', G .. 'searchers', label) end
local old = redis.call('ZRANGEBYSCORE', groups, '-inf', '(' .. string.format('%.17g', now - window))
if #old > 0 then
  sliced('ZREM', groups, old)
  sliced('HDEL', gtok, old)
end
local out = {flush_counts()}
for _, r in ipairs(results) do out[#out + 1] = r end
return out
"""

# Before an HTTP write: record the intent (so a crash before the global step is recovered)
# and reserve its arrival numbers.
# ARGV: G token intent n   Returns the first arrival number of the group (seq0; samples take seq0 + i).
INTENT = """#!lua
local G = ARGV[1]
redis.call('HSET', G .. 'intents', ARGV[2], ARGV[3])
return redis.call('INCRBY', G .. 'seq', ARGV[4]) - tonumber(ARGV[4])
"""

# Global capacity: choose the next eviction and record it as an intent, reserving its count so
# that concurrent replicas never evict the same excess twice.
# ARGV: G global_cap token now   Returns {} when within capacity, else {prompt, k, bound}.
PLAN_EVICTION = """#!lua
local G = ARGV[1]
local stats = G .. 'stats'
local total = tonumber(redis.call('HGET', stats, 'samples') or '0')
local reserved = tonumber(redis.call('HGET', stats, 'evict_reserved') or '0')
local over = total - reserved - tonumber(ARGV[2])
if over <= 0 then return {} end
local two = redis.call('ZRANGE', G .. 'gold', 0, 1, 'WITHSCORES')
if #two == 0 then return {} end
local bound = '+inf'
if #two == 4 then bound = two[4] end
redis.call('HSET', G .. 'intents', ARGV[3],
  cmsgpack.pack({kind = 'e', p = two[1], k = over, bound = bound, at = tonumber(ARGV[4])}))
redis.call('HINCRBY', stats, 'evict_reserved', over)
return {two[1], over, bound}
"""

# ARGV: G dead_letter_stream maxlen entry_id reason payload consumer n_samples now stream cgroup
# Returns 1, or 0 when the entry was already handled by another consumer.
DEAD_LETTER = """#!lua
local G = ARGV[1]
local stats = G .. 'stats'
if ARGV[10] ~= '' and #redis.call('XPENDING', ARGV[10], ARGV[11], ARGV[4], ARGV[4], 1) == 0 then return 0 end
redis.call('XADD', ARGV[2], 'MAXLEN', '~', ARGV[3], '*',
  'entry', ARGV[4], 'reason', ARGV[5], 'payload', ARGV[6], 'consumer', ARGV[7], 'at', ARGV[9])
redis.call('HINCRBY', stats, 'dead_letters', 1)
redis.call('HINCRBY', stats, 'groups_ingested', 1)
redis.call('HINCRBY', stats, 'samples_ingested', ARGV[8])
redis.call('HINCRBY', stats, 'samples_dead_lettered', ARGV[8])
if ARGV[10] ~= '' then redis.call('XACK', ARGV[10], ARGV[11], ARGV[4]) end
return 1
"""

# The run's objective, pinned by the first group or trainer that states one.  KEYS[1]: G objective
# ARGV: temperature reference   Returns the pinned {temperature, reference}.
OBJECTIVE = """#!lua
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'temperature', ARGV[1], 'reference', ARGV[2])
end
return redis.call('HMGET', KEYS[1], 'temperature', 'reference')
"""

# Pick the batch's prompts from the global indexes (one consistent snapshot of them).
# ARGV: G trainer_version recent_versions max_staleness('' none) only_version('' none)
#       P recency_slots u_1..u_2P  (uniforms in [0, 1) from the caller's seeded RNG)
# Returns {-1, eligible} when fewer than P prompts are eligible, else
# {vmax, n_recency_eligible, n_reward_eligible, rec_take, prompt ids (recency picks first)...}.
PICK = """#!lua flags=no-writes
local G = ARGV[1]
local tv, R = tonumber(ARGV[2]), tonumber(ARGV[3])
local P, rec_slots = tonumber(ARGV[6]), tonumber(ARGV[7])
local u = 8
local index, N, n_rew, n_rec, vmax
if ARGV[5] ~= '' then
  vmax = tonumber(ARGV[5])
  index = G .. 'vp:' .. ARGV[5]
  N = redis.call('ZCARD', index)
  if ARGV[4] ~= '' and vmax < tv - tonumber(ARGV[4]) then N = 0 end
  n_rew, n_rec = N, N
else
  index = G .. 'pmax'
  N = redis.call('ZCARD', index)
  if N == 0 then return {-1, 0} end
  vmax = tonumber(redis.call('ZRANGE', index, -1, -1, 'WITHSCORES')[2])
  local t_rew = '-inf'
  if ARGV[4] ~= '' then t_rew = tv - tonumber(ARGV[4]) end
  local t_rec = vmax - R + 1
  if t_rew ~= '-inf' and t_rew > t_rec then t_rec = t_rew end
  n_rew = redis.call('ZCOUNT', index, t_rew, '+inf')
  n_rec = redis.call('ZCOUNT', index, t_rec, '+inf')
end
if n_rew < P then return {-1, n_rew} end

-- k distinct ranks in [offset, offset + n): a partial Fisher-Yates over a virtual array.
local function draw(k, n, offset)
  local swap, out = {}, {}
  for i = 0, k - 1 do
    local j = i + math.floor(tonumber(ARGV[u]) * (n - i))
    u = u + 1
    if j > n - 1 then j = n - 1 end
    local vi, vj = swap[i] or i, swap[j] or j
    swap[j] = vi
    out[#out + 1] = offset + vj
  end
  return out
end

local out, chosen = {vmax, n_rec, n_rew, 0}, {}
local rec_take = math.min(rec_slots, n_rec)
for _, rank in ipairs(draw(rec_take, n_rec, N - n_rec)) do
  local p = redis.call('ZRANGE', index, rank, rank)[1]
  chosen[p] = true
  out[#out + 1] = p
end
out[4] = rec_take
local need = P - rec_take
for _, rank in ipairs(draw(math.min(n_rew, P), n_rew, N - n_rew)) do
  if need == 0 then break end
  local p = redis.call('ZRANGE', index, rank, rank)[1]
  if not chosen[p] then
    chosen[p] = true
    out[#out + 1] = p
    need = need - 1
  end
end
return out
"""

# One prompt's record and index, read atomically.  KEYS[1]: its meta key.  ARGV: P
# Returns {prompt_ids, text, task, then per sample: id, score, reward, copies} ({} if the prompt is gone).
READ_PROMPT = """#!lua flags=no-writes
local P = ARGV[1]
local meta = redis.call('HMGET', P .. 'meta', 'ids', 'text', 'task')
if not meta[1] then return {} end
local ord = redis.call('ZRANGE', P .. 'ord', 0, -1, 'WITHSCORES')
local function as_table(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end
local rew = as_table(redis.call('HGETALL', P .. 'rew'))
local cnt = as_table(redis.call('HGETALL', P .. 'cnt'))
local out = {meta[1], meta[2] or '', meta[3] or ''}
for i = 1, #ord, 2 do
  out[#out + 1] = ord[i]
  out[#out + 1] = ord[i + 1]
  out[#out + 1] = rew[ord[i]]
  out[#out + 1] = cnt[ord[i]] or 1
end
return out
"""
