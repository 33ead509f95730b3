-- The rest of permit_release.lua (see there): a member the client does not know, or waiters to
-- tell. Each waiter told is the next in arrival order, as many as permits are free, by its
-- token ('\n<token> <lock key>': only that task of its client tries); one that nobody hears
-- (its process is gone) leaves the queue and the next is told instead. The telling uses pcall:
-- an ACL without the channel never undoes a release (waiters then fall back to their capped
-- sleep).
-- Uses `tell` (queue.lua), and `find_holder`, `sweep_holders`, `live_holders`, `sweep_queue`
-- (permits.lua), which go before it.
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not out and ARGV[3] == '-' then
  -- Removed by the client already: only the waiters are left to tell.
  out = 0
elseif not out then
  out = 0
  local member, d = find_holder(ARGV[1])
  if member then
    redis.call('ZREM', KEYS[1], member)
    if d > now then
      out = 1
    end
  end
  if redis.call('ZCARD', KEYS[3]) == 0 then
    return out
  end
end
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[2])
sweep_holders(now)
sweep_queue(now)
local n = tonumber(redis.call('HGET', KEYS[2], 'permits') or '0')
local free = n - live_holders(now)
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
