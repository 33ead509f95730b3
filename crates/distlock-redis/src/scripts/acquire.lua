-- distlock acquire, the waiting path (a first attempt is a plain pipelined SET NX PX + HINCRBY;
-- this script serves waiters and resent requests). One round trip, atomic.
-- KEYS[1] lock key: a plain string '<token> <since ms> <owner>' with a TTL, interoperable with
--         other clients' SET NX locks
-- KEYS[2] meta hash: the fence counter (never expires), and the token and fence of the last
--         holder that came through this script (for status)
-- KEYS[3] waiters: zset of waiting clients (client id -> place: server time in µs, unique)
-- KEYS[4] alive: hash of waiting clients (client id -> registration expiry, server ms)
-- ARGV[1] token, ARGV[2] value, ARGV[3] ttl ms,
-- ARGV[4] our client id ('' when we do not hear wake-ups), ARGV[5] registration ms
-- Returns {1, fence} when the lock is ours, {0, holder pttl} when busy.
-- Every write that can fail (WRONGTYPE) runs before the lock is written, and the queue
-- book-keeping after it uses pcall, so an error never leaves a lock half taken.
local cur = redis.call('GET', KEYS[1])
local tok = ARGV[1]
local take = nil
if cur and is_ours(cur, tok) then
  -- A resent request whose first reply was lost: the lock is already ours. Re-arm; keep the
  -- fence this script gave, or (first sent as a pipeline) take one now, while we hold it.
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  local meta = redis.call('HMGET', KEYS[2], 'token', 'holder_fence')
  if meta[1] == tok then
    return {1, tonumber(meta[2])}
  end
  take = 'resent'
elseif cur == false or (ARGV[4] ~= '' and cur == '\t' .. ARGV[4]) then
  take = 'new'
end
if take then
  local fence = redis.call('HINCRBY', KEYS[2], 'fence', 1)
  if take == 'new' then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  end
  redis.call('HSET', KEYS[2], 'token', tok, 'holder_fence', fence)
  if ARGV[4] ~= '' then
    redis.pcall('ZREM', KEYS[3], ARGV[4])
    redis.pcall('HDEL', KEYS[4], ARGV[4])
  end
  return {1, fence}
end
if ARGV[4] ~= '' then
  -- Queue up (keeping our place if we already have one) and stay alive for ARGV[5] ms.
  enqueue(KEYS[3], KEYS[4], ARGV[4], tonumber(ARGV[5]), true)
end
return {0, redis.call('PTTL', KEYS[1])}
