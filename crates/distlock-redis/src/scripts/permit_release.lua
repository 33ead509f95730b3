-- distlock permit release: gives our permit back and tells the waiters whose turn it may now be.
-- KEYS[1] to KEYS[4]: the semaphore's keys (see permits.lua); KEYS[5] the name's lock key
-- (what waiters are told: their client wakes its waiters on that name).
-- ARGV[1] token, ARGV[2] our queue member (a waiter that gives up leaves the queue this way).
-- Returns 1 (it was ours, before its deadline) or 0 (not held: expired or removed).
-- Each waiter told is the next in arrival order, as many as permits are free, by its token
-- ('\n<token> <lock key>': only that task of its client tries); one that nobody hears (its
-- process is gone) leaves the queue and the next is told instead. The telling uses
-- pcall: an ACL without the channel never undoes a release (waiters then fall back to their
-- capped sleep).
-- It writes no deadline, so expiries stay as they are (see permits.lua).
-- Uses `tell` (queue.lua), which comes with `next_fence` (fence.lua), and `server_ms`,
-- `sweep_holders`, `sweep_queue` (permits.lua), prepended to it.
local now = server_ms()
local d = redis.call('ZSCORE', KEYS[1], ARGV[1])
local out = 0
if d then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], 'f:' .. ARGV[1], 'o:' .. ARGV[1])
  if tonumber(d) > now then
    out = 1
  end
end
-- Nobody waits (the common case): nothing to leave, nobody to tell.
if redis.call('ZCARD', KEYS[3]) == 0 then
  return out
end
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[2])
sweep_holders(now)
sweep_queue(now)
local n = tonumber(redis.call('HGET', KEYS[2], 'permits') or '0')
local free = n - redis.call('ZCARD', KEYS[1])
local told = 0
if free > 0 then
  local waiters = redis.call('ZRANGE', KEYS[3], 0, free + 15)
  for _, w in ipairs(waiters) do
    if told >= free then
      break
    end
    local tok, chan = string.match(w, '^([^ ]+) (.+)$')
    local heard = chan and tell(chan, '\n' .. tok .. ' ' .. KEYS[5])
    if type(heard) == 'number' and heard > 0 then
      told = told + 1
    else
      redis.call('ZREM', KEYS[3], w)
      redis.call('ZREM', KEYS[4], w)
    end
  end
end
return out
