-- distlock status: who holds the lock.
-- KEYS[1] lock key, KEYS[2] meta hash.
-- Returns {0, last fence} when free; {1, pttl, value, meta token, holder fence, last fence} when
-- held (the value is '<token> <since> <owner>' for distlock holders, anything else for other
-- clients).
local meta = redis.call('HMGET', KEYS[2], 'token', 'holder_fence', 'fence')
local cur = redis.call('GET', KEYS[1])
if cur == false then
  return {0, tonumber(meta[3]) or 0}
end
return {1, redis.call('PTTL', KEYS[1]), cur, meta[1] or '', tonumber(meta[2]) or 0, tonumber(meta[3]) or 0}
