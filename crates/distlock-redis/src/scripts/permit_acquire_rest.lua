-- The rest of permit_acquire.lua (see there): a resent request, a lock or a queue on the name, a
-- semaphore that is full or opened with another size; then the taking of a permit. It runs
-- inside the `if not decided then` that permit_acquire.lua opens, after the helpers of
-- permits.lua (`find_holder`, `sweep_holders`, `live_holders`, `sweep_queue`, `cover`), and it
-- closes it.
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
