-- Composed into every script by services/buffer/redis_scripts.py, right after the script's `#!lua`
-- line and after `local VERSION_SHIFT = ...`, which that module writes from its Python constant.

-- A version as Redis stores it: an integer, never `1e+15`.
local function vstr(v) return string.format('%d', v) end

-- The version of a sample's order score (version * VERSION_SHIFT + arrival).
local function version_of(score) return math.floor(tonumber(score) / VERSION_SHIFT) end

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
