-- distlock acquire: one round trip, atomic.
-- KEYS[1] lock key (a plain string holding the token: interoperable with other clients)
-- KEYS[2] meta hash (fence counter, never expires; holder label and fence)
-- ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] owner label, ARGV[4] unix time in ms (display only)
-- Returns {1, fence} when the lock is ours, {0, holder pttl} when busy.
-- Every read that can fail (WRONGTYPE) runs before the first write, so an error never leaves a
-- lock half taken.
local cur = redis.call('GET', KEYS[1])
if cur == false then
  local fence = redis.call('HINCRBY', KEYS[2], 'fence', 1)
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.call('HSET', KEYS[2], 'token', ARGV[1], 'owner', ARGV[3], 'since', ARGV[4], 'holder_fence', fence)
  return {1, fence}
end
if cur == ARGV[1] then
  -- A retry whose first reply was lost: the lock is already ours. Re-arm, count nothing.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local meta = redis.call('HMGET', KEYS[2], 'token', 'holder_fence')
  if meta[1] == ARGV[1] then
    return {1, tonumber(meta[2])}
  end
  return {1, tonumber(redis.call('HGET', KEYS[2], 'fence'))}
end
return {0, redis.call('PTTL', KEYS[1])}
