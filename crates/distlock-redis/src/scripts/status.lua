-- distlock status: who holds the lock.
-- KEYS[1] lock key, KEYS[2] meta hash, KEYS[3] the fence counter (see fence.lua).
-- Returns {0, last fence} when free; {1, pttl, value, meta token, holder fence, last fence} when
-- held (the value is '<token> <since> <owner>' for distlock holders, anything else for other
-- clients).
local meta = redis.call('HMGET', KEYS[2], 'token', 'holder_fence')
local last = tonumber(redis.call('ZSCORE', KEYS[3], 'f')) or 0
local cur = redis.call('GET', KEYS[1])
if cur == false then
  return {0, last}
end
return {1, redis.call('PTTL', KEYS[1]), cur, meta[1] or '', tonumber(meta[2]) or 0, last}
