-- distlock permit acquire: one of N permits of a semaphore, FIFO among the clients that wait.
-- One round trip, atomic.
-- KEYS[1] to KEYS[4]: the semaphore's keys (see permits.lua); KEYS[5] the fence counter of the
-- name (see fence.lua); KEYS[6] the name's lock key (a lock there is a conflict of kinds).
-- ARGV[1] token, ARGV[2] permits, ARGV[3] ttl ms, ARGV[4] our queue member ('<token> <wake
-- channel>'; '' when we do not hear wake-ups: then we do not queue), ARGV[5] the highest fence
-- of this name the client saw (see fence.lua), ARGV[6] how long our place in the queue is kept
-- without another attempt (ms), ARGV[7] our holder value ('<token> <since> <owner>'), ARGV[8]
-- '1' when this request resends one whose reply was lost.
-- Returns {1, fence} when a permit is ours (its member in the holders' set is '<fence>
-- <ARGV[7]>'); {0, ms until the first holder's deadline (-1: no holder), queued} when not
-- (queued: this call added us to the queue); {-1, permits} when the semaphore is in use with
-- another number of permits; {-2} when a lock holds the name.
-- A permit is ours when fewer than N are held and fewer waiters are ahead of us than permits
-- are free: waiters are served in arrival order, and a first attempt (not queued) goes behind
-- every waiter.
-- Every check runs before anything is written, so an error never leaves a permit half taken.
-- The common case (not a resend, neither a lock nor a queue on the name, a permit free: six
-- calls in all) is decided first; only when it could not decide do the other cases run (a
-- resent request, a lock or a queue on the name, a semaphore that is full or opened with
-- another size), which either return or decide to take a permit; then the taking. Uses
-- `next_fence` (fence.lua), and in the other cases `find_holder`, `sweep_holders`,
-- `live_holders`, `sweep_queue`, `cover` (permits.lua), both prepended to it (see scripts.rs).
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local now = sec * 1000 + math.floor(usec / 1000)
local n, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
-- What the taking needs: how many others hold a permit, the size and the latest deadline the
-- meta hash has, and our place in the queue when we were queued (false otherwise).
local held, cap, known, rank = 0, nil, 0, false
local decided = false
if ARGV[8] ~= '1' then
  held = redis.call('ZCOUNT', KEYS[1], now + 1, '+inf')
  if held < n and redis.call('EXISTS', KEYS[6], KEYS[3]) == 0 then
    local meta = redis.call('HMGET', KEYS[2], 'permits', 'until')
    cap, known = tonumber(meta[1]), tonumber(meta[2]) or 0
    decided = not cap or cap == n or held == 0
  end
end
if not decided then
  -- Every other case: a resent request, a lock or a queue on the name, a semaphore that is
  -- full or opened with another size. It returns, or decides to take a permit.
  if ARGV[8] == '1' then
    local member, deadline, fence = find_holder(ARGV[1])
    if member and deadline > now then
      -- Ours already: a resent request whose first reply was lost. Its member is written
      -- again with this request's holder value, the one the client now names it by.
      local last = math.max(now + ttl, tonumber(redis.call('HGET', KEYS[2], 'until')) or 0)
      redis.call('ZREM', KEYS[1], member)
      redis.call('ZADD', KEYS[1], now + ttl, string.format('%d', fence) .. ' ' .. ARGV[7])
      redis.call('HSET', KEYS[2], 'until', last)
      cover(now, last, 4)
      return {1, fence}
    end
  end
  held = live_holders(now)
  -- Neither a lock nor a queue in one call; which of them, only when not.
  local waiting = 0
  local lock_held = false
  if redis.call('EXISTS', KEYS[6], KEYS[3]) > 0 then
    lock_held = redis.call('EXISTS', KEYS[6]) == 1
    waiting = sweep_queue(now)
  end
  local meta = redis.call('HMGET', KEYS[2], 'permits', 'until')
  cap, known = tonumber(meta[1]), tonumber(meta[2]) or 0
  if cap and cap ~= n and held + waiting > 0 then
    return {-1, cap}
  end
  if lock_held then
    return {-2}
  end
  if ARGV[4] ~= '' and waiting > 0 then
    rank = redis.call('ZRANK', KEYS[3], ARGV[4])
  end
  local ahead = rank or waiting
  if not (held < n and ahead < n - held) then
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
    local first = redis.call('ZRANGEBYSCORE', KEYS[1], now + 1, '+inf', 'WITHSCORES', 'LIMIT',
      0, 1)
    local left = -1
    if first[2] then
      left = tonumber(first[2]) - now
    end
    return {0, left, queued}
  end
end

-- The taking: a permit is ours.
local fence, why = next_fence(KEYS[5], tonumber(ARGV[5]) or 0, t, sec * 1000000 + usec)
if not fence then
  return redis.error_reply(why)
end
local deadline = now + ttl
-- Our member, and '~' that keeps the set between holders (see permits.lua): 2 when both were
-- new, so the set too.
local added = redis.call('ZADD', KEYS[1], deadline, string.format('%d', fence) .. ' ' .. ARGV[7],
  '0', '~')
if deadline > known then
  local last = deadline + ttl
  redis.call('HSET', KEYS[2], 'permits', n, 'until', last)
  for i = 1, 4 do
    redis.call('PEXPIRE', KEYS[i], last - now + 1000)
  end
else
  if cap ~= n then
    redis.call('HSET', KEYS[2], 'permits', n)
  end
  if added == 2 then
    redis.call('PEXPIRE', KEYS[1], known - now + 1000)
  end
end
if rank then
  redis.call('ZREM', KEYS[3], ARGV[4])
  redis.call('ZREM', KEYS[4], ARGV[4])
end
return {1, fence}
