-- distlock status: who holds the lock.
-- KEYS[1] lock key, KEYS[2] meta hash.
-- Returns {0} when free; {1, pttl, owner, since, fence} when held by a distlock client;
-- {1, pttl} when held by another client (a plain key with no distlock metadata).
local cur = redis.call('GET', KEYS[1])
if cur == false then
  return {0}
end
local pttl = redis.call('PTTL', KEYS[1])
local meta = redis.call('HMGET', KEYS[2], 'token', 'owner', 'since', 'holder_fence')
if meta[1] == cur then
  return {1, pttl, meta[2], meta[3], tonumber(meta[4])}
end
return {1, pttl}
