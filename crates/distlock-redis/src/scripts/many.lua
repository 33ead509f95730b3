-- The helper of the multi-name scripts, prepended to them (see scripts.rs): `values_of`.

-- The values of KEYS[first], KEYS[first + step], ... (the names' lock keys), in order, with the
-- keys, read with MGET (one call where a GET a name took one each), in chunks: Lua's `unpack`
-- takes a few thousand values at most.
local function values_of(first, step)
  local keys, out = {}, {}
  for k = first, #KEYS, step do
    keys[#keys + 1] = KEYS[k]
  end
  for from = 1, #keys, 1000 do
    local got = redis.call('MGET', unpack(keys, from, math.min(from + 999, #keys)))
    for j = 1, #got do
      out[from + j - 1] = got[j]
    end
  end
  return out, keys
end
