-- distlock status: who holds a name, whatever its kind, and how many clients wait for it.
-- KEYS[1] lock key, KEYS[2] meta hash, KEYS[3] the fence counter (see fence.lua), KEYS[4] the
-- lock's queue of waiting clients (see queue.lua), KEYS[5] the readers' sorted set (see
-- read_acquire.lua), KEYS[6] the semaphore's holders, KEYS[7] its meta hash, KEYS[8] its queue
-- (see permits.lua).
-- Returns {code, last fence, waiters, ...}:
-- {0, last, waiters} when free;
-- {1, last, waiters, pttl, value, meta token, holder fence} when a writer (or a mutex, or
-- another client's SET NX) holds it (the value is '<token> <since> <owner>' for distlock
-- holders);
-- {2, last, waiters, then per reader: token, fence, ms left, holder value} for readers;
-- {3, last, waiters, permits, then per permit: token, fence, ms left, holder value} for a
-- semaphore's holders.
-- Holders past their deadline, not yet swept, are left out. A semaphore whose holders' set is
-- left with none (it lives until its expiry, see permits.lua) reads as {3, ...} without holders.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = tonumber(redis.call('ZSCORE', KEYS[3], 'f')) or 0
local cur = redis.call('GET', KEYS[1])
local function count(cmd, key)
  local n = redis.pcall(cmd, key)
  if type(n) ~= 'number' then
    return 0
  end
  return n
end
local function each(out, set, meta, fence_prefix)
  local hs = redis.call('ZRANGEBYSCORE', set, now + 1, '+inf', 'WITHSCORES')
  for i = 1, #hs, 2 do
    local tok = hs[i]
    local m = redis.call('HMGET', meta, fence_prefix .. tok, 'o:' .. tok)
    out[#out + 1] = tok
    out[#out + 1] = tonumber(m[1]) or 0
    out[#out + 1] = tonumber(hs[i + 1]) - now
    out[#out + 1] = m[2] or ''
  end
  return out
end
if cur == '~readers' then
  return each({2, last, count('LLEN', KEYS[4])}, KEYS[5], KEYS[2], 'r:')
end
if cur then
  local meta = redis.call('HMGET', KEYS[2], 'token', 'holder_fence')
  return {1, last, count('LLEN', KEYS[4]), redis.call('PTTL', KEYS[1]), cur, meta[1] or '',
    tonumber(meta[2]) or 0}
end
if redis.call('EXISTS', KEYS[6]) == 1 then
  -- A semaphore's holders are members '<fence> <holder value>' (see permits.lua).
  local n = tonumber(redis.call('HGET', KEYS[7], 'permits')) or 0
  local out = {3, last, count('ZCARD', KEYS[8]), n}
  local hs = redis.call('ZRANGEBYSCORE', KEYS[6], now + 1, '+inf', 'WITHSCORES')
  for i = 1, #hs, 2 do
    local fence, value = string.match(hs[i], '^(%d+) (.*)$')
    if value then
      out[#out + 1] = string.match(value, '^(%S*)')
      out[#out + 1] = tonumber(fence)
      out[#out + 1] = tonumber(hs[i + 1]) - now
      out[#out + 1] = value
    end
  end
  return out
end
return {0, last, count('LLEN', KEYS[4])}
