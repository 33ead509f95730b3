-- distlock permit acquire: one of N permits of a semaphore, FIFO among the clients that wait.
-- One round trip, atomic.
-- KEYS[1] to KEYS[4]: the semaphore's keys (see permits.lua); KEYS[5] the fence counter of the
-- name (see fence.lua); KEYS[6] the name's lock key (a lock there is a conflict of kinds).
-- ARGV[1] token, ARGV[2] permits, ARGV[3] ttl ms, ARGV[4] our queue member ('<token> <wake
-- channel>'; '' when we do not hear wake-ups: then we do not queue), ARGV[5] the highest fence
-- of this name the client saw (see fence.lua), ARGV[6] how long our place in the queue is kept
-- without another attempt (ms), ARGV[7] our holder value ('<token> <since> <owner>', for
-- status), ARGV[8] '1' when this request resends one whose reply was lost.
-- Returns {1, fence} when a permit is ours; {0, ms until the first holder's deadline (-1: no
-- holder), queued} when not (queued: this call added us to the queue); {-1, permits} when the
-- semaphore is in use with another number of permits; {-2} when a lock holds the name.
-- A permit is ours when fewer than N are held and fewer waiters are ahead of us than permits
-- are free: waiters are served in arrival order, and a first attempt (not queued) goes behind
-- every waiter.
-- Every check runs before anything is written, so an error never leaves a permit half taken.
-- Uses `next_fence` (fence.lua) and `server_ms`, `sweep_holders`, `sweep_queue`, `cover`
-- (permits.lua), prepended to it. The uncontended path makes eight calls.
local now, time = server_ms()
local tok, n, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if ARGV[8] == '1' and redis.call('ZSCORE', KEYS[1], tok) then
  -- Ours already: a resent request whose first reply was lost.
  local last = math.max(now + ttl, tonumber(redis.call('HGET', KEYS[2], 'until')) or 0)
  redis.call('ZADD', KEYS[1], now + ttl, tok)
  redis.call('HSET', KEYS[2], 'until', last)
  cover(now, last, 4)
  return {1, tonumber(redis.call('HGET', KEYS[2], 'f:' .. tok)) or 0}
end
-- The holders whose deadline is still ahead.
local held = redis.call('ZCOUNT', KEYS[1], now + 1, '+inf')
-- Neither a lock nor a queue (the common case) in one call; which of them, only when not.
local waiting = 0
local lock_held = false
if redis.call('EXISTS', KEYS[6], KEYS[3]) > 0 then
  lock_held = redis.call('EXISTS', KEYS[6]) == 1
  waiting = sweep_queue(now)
end
local meta = redis.call('HMGET', KEYS[2], 'permits', 'until')
local cap, known = tonumber(meta[1]), tonumber(meta[2]) or 0
if cap and cap ~= n and held + waiting > 0 then
  return {-1, cap}
end
if lock_held then
  return {-2}
end
local rank = false
if ARGV[4] ~= '' and waiting > 0 then
  rank = redis.call('ZRANK', KEYS[3], ARGV[4])
end
local ahead = rank or waiting
if held < n and ahead < n - held then
  local fence, why = next_fence(KEYS[5], tonumber(ARGV[5]) or 0, time)
  if not fence then
    return redis.error_reply(why)
  end
  local deadline = now + ttl
  redis.call('ZADD', KEYS[1], deadline, tok)
  if deadline > known then
    local last = deadline + ttl
    redis.call('HSET', KEYS[2], 'permits', n, 'until', last, 'f:' .. tok, fence, 'o:' .. tok,
      ARGV[7])
    cover(now, last, 4)
  else
    redis.call('HSET', KEYS[2], 'permits', n, 'f:' .. tok, fence, 'o:' .. tok, ARGV[7])
    if held == 0 then
      -- The holders' set may be new: it lives as long as the others.
      redis.call('PEXPIRE', KEYS[1], known - now + 1000)
    end
  end
  if rank then
    redis.call('ZREM', KEYS[3], ARGV[4])
    redis.call('ZREM', KEYS[4], ARGV[4])
  end
  return {1, fence}
end
-- No permit for us: the expired holders go now (a crashed holder's is found here).
sweep_holders(now)
local queued = 0
if ARGV[4] ~= '' then
  if not rank then
    redis.call('ZADD', KEYS[3], redis.call('HINCRBY', KEYS[2], 'seq', 1), ARGV[4])
    queued = 1
  end
  local place = now + tonumber(ARGV[6])
  redis.call('ZADD', KEYS[4], place, ARGV[4])
  local last = known
  if place > known then
    last = place + ttl
  end
  redis.call('HSET', KEYS[2], 'permits', n, 'until', last)
  cover(now, last, 4)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local left = -1
if first[2] then
  left = tonumber(first[2]) - now
end
return {0, left, queued}
