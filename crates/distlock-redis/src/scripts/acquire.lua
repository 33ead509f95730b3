-- distlock acquire: one round trip, atomic.
-- KEYS[1] lock key (a plain string holding the token: interoperable with other clients)
-- KEYS[2] meta hash (fence counter, never expires; holder label and fence)
-- KEYS[3] waiters: zset of waiting clients (client id -> first seen, server ms)
-- KEYS[4] alive: hash of waiting clients (client id -> registration expiry, server ms)
-- KEYS[5] reservation: the client id the last release woke, for a short time
-- ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] owner label, ARGV[4] unix time in ms (display only),
-- ARGV[5] our client id ('' when we are not subscribed to wake-ups), ARGV[6] registration ms
-- Returns {1, fence} when the lock is ours, {0, holder pttl} when busy ({0, -1}: reserved for
-- the waiter a release woke; wait for our own turn).
-- Every read that can fail (WRONGTYPE) runs before the first write of the lock, and the queue
-- book-keeping after it uses pcall, so an error never leaves a lock half taken.
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  -- A retry whose first reply was lost: the lock is already ours. Re-arm, count nothing.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local meta = redis.call('HMGET', KEYS[2], 'token', 'holder_fence')
  if meta[1] == ARGV[1] then
    return {1, tonumber(meta[2])}
  end
  return {1, tonumber(redis.call('HGET', KEYS[2], 'fence'))}
end
if cur == false then
  local resv = redis.call('GET', KEYS[5])
  if resv == false or resv == ARGV[5] then
    local fence = redis.call('HINCRBY', KEYS[2], 'fence', 1)
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    redis.call('HSET', KEYS[2], 'token', ARGV[1], 'owner', ARGV[3], 'since', ARGV[4], 'holder_fence', fence)
    if resv then
      redis.call('DEL', KEYS[5])
    end
    if ARGV[5] ~= '' then
      redis.pcall('ZREM', KEYS[3], ARGV[5])
      redis.pcall('HDEL', KEYS[4], ARGV[5])
    end
    return {1, fence}
  end
end
if ARGV[5] ~= '' then
  -- Queue up (keeping our place if we already have one) and stay alive for ARGV[6] ms.
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.pcall('ZADD', KEYS[3], 'NX', now, ARGV[5])
  redis.pcall('HSET', KEYS[4], ARGV[5], now + tonumber(ARGV[6]))
  redis.pcall('PEXPIRE', KEYS[3], ARGV[6])
  redis.pcall('PEXPIRE', KEYS[4], ARGV[6])
end
if cur == false then
  return {0, -1}
end
return {0, redis.call('PTTL', KEYS[1])}
