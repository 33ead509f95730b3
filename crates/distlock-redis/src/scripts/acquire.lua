-- distlock acquire, the waiting path (a first attempt is a plain pipelined SET NX PX, ZADD GT
-- and ZINCRBY; this script serves waiters and resent requests). One round trip, atomic.
-- KEYS[1] lock key: a plain string '<token> <since ms> <owner>' with a TTL, interoperable with
--         other clients' SET NX locks
-- KEYS[2] meta hash: the token and fence of the last holder that came through a script (for
--         status)
-- KEYS[3] the queue of waiting clients (see queue.lua)
-- KEYS[4] the fence counter (see fence.lua)
-- ARGV[1] token, ARGV[2] value, ARGV[3] ttl ms,
-- ARGV[4] our registration, to queue when busy ('' when we do not hear wake-ups: then we do
-- not queue),
-- ARGV[5] a token of ours a release handed the lock to and that none of our tasks will use
-- ('' if none): take that lock over,
-- ARGV[6] our registration in the queue, if we believe we have one ('' if not),
-- ARGV[7] the highest fence of this lock the client saw ('0' when none; see fence.lua)
-- Returns {1, fence} when the lock is ours; {0, holder pttl, queued} when busy, where queued is
-- 1 when this call added our registration to the queue, 0 when it kept the one we had.
-- Every write that can fail (WRONGTYPE) runs before the lock is written, and the queue
-- book-keeping after it uses pcall, so an error never leaves a lock half taken.
-- Uses `is_ours` (token.lua) and `next_fence` (fence.lua), prepended to it (see scripts.rs).
local cur = redis.call('GET', KEYS[1])
local tok = ARGV[1]
local take, fence = nil, nil
if cur and ARGV[5] ~= '' and is_ours(cur, ARGV[5]) then
  -- Handed to our client for a token that is no longer used: it is ours, with its fence.
  local meta = redis.call('HMGET', KEYS[2], 'token', 'holder_fence')
  if meta[1] == ARGV[5] then
    fence = tonumber(meta[2])
  end
  take = 'takeover'
elseif cur and is_ours(cur, tok) then
  -- Ours already: a resent request whose first reply was lost, or a release handed it to us
  -- and its message has not reached us yet. Re-arm; keep the fence a script gave, or (first
  -- sent as a pipeline) take one now, while we hold it.
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  local meta = redis.call('HMGET', KEYS[2], 'token', 'holder_fence')
  if meta[1] == tok then
    return {1, tonumber(meta[2])}
  end
  take = 'resent'
elseif cur == false then
  take = 'new'
end
if take then
  if not fence then
    local why
    fence, why = next_fence(KEYS[4], tonumber(ARGV[7]) or 0)
    if not fence then
      return redis.error_reply(why)
    end
  end
  if take ~= 'resent' then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  end
  -- A meta key of another type is not a reason to fail once the lock is written: pcall.
  redis.pcall('HSET', KEYS[2], 'token', tok, 'holder_fence', fence_text(fence))
  if ARGV[6] ~= '' then
    redis.pcall('LREM', KEYS[3], 1, ARGV[6])
  end
  return {1, fence}
end
local queued = 0
if ARGV[4] ~= '' then
  -- Queue up, unless our registration is still there (then we keep our place).
  local pos = false
  if ARGV[6] ~= '' then
    pos = redis.pcall('LPOS', KEYS[3], ARGV[6])
  end
  if type(pos) ~= 'number' then
    redis.pcall('RPUSH', KEYS[3], ARGV[4])
    queued = 1
  end
end
return {0, redis.call('PTTL', KEYS[1]), queued}
