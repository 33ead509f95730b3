-- The server's clock, in µs.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The queue of waiting clients is two keys: `waiters`, a zset (client id -> place: the server's
-- time in µs when it joined), and `alive`, a hash (client id -> its registration:
-- '<expiry ms> <ttl ms> <seq> <token> <owner>', what a release writes when it hands the lock to
-- that client, and until when the client counts as waiting). Both expire a while after the
-- last registration. Every call on them uses pcall: junk under these keys only costs wake-ups.

-- Puts client `id` in the queue, at the back, or, with `keep`, keeps its place if it has one;
-- registers `reg` ('<ttl ms> <seq> <token> <owner>') for `reg_ms`.
-- `us` is the server's time in µs.
local function enqueue(waiters, alive, id, us, reg_ms, keep, reg)
  if not (keep and redis.pcall('ZSCORE', waiters, id)) then
    redis.pcall('ZADD', waiters, us, id)
  end
  local expiry = math.floor(us / 1000) + reg_ms
  redis.pcall('HSET', alive, id, string.format('%d', expiry) .. ' ' .. reg)
  redis.pcall('PEXPIRE', waiters, reg_ms)
  redis.pcall('PEXPIRE', alive, reg_ms)
end

-- Takes client `id` out of the queue.
local function dequeue(waiters, alive, id)
  redis.pcall('ZREM', waiters, id)
  redis.pcall('HDEL', alive, id)
end

-- Shared by release and leave: hands the lock (free, or still ours: it is overwritten) to the
-- first live waiting client other than `self_id`. The lock is written for it, with the token,
-- owner and TTL it registered, and a new fence (taken while the lock is being written, so
-- fences still order holders); then it is told on its own channel (`chan_prefix` .. id), so
-- no other client wakes up. The message is '\t<fence> <seq> <token> <lock key>'. A waiter
-- whose registration is unusable (or whose fence counter is not a hash) is woken with the bare
-- lock key instead, to try itself. Waiters whose registration expired (gone, or crashed) are
-- dropped on the way.
-- `now` is the server's time in ms. Returns true when the lock was handed over (or freed for a
-- waiter to try), false when nobody live waits (the caller then frees it, or hands it to
-- itself).
-- Every call after the lock is written uses pcall: an ACL without the channel never undoes a
-- release (the waiter then falls back to its capped sleep).
local function pass_on(lock, meta, waiters, alive, chan_prefix, self_id, now)
  for _ = 1, 8 do
    local first = redis.pcall('ZPOPMIN', waiters)
    if type(first) ~= 'table' or first.err or first[1] == nil then
      return false
    end
    local id = first[1]
    if id == self_id then
      -- Our own old place (a wait whose last task took the lock on the fast path): drop it.
    else
      local reg = redis.pcall('HGET', alive, id)
      local expiry, ttl, seq, tok, owner
      if type(reg) == 'string' then
        expiry, ttl, seq, tok, owner = string.match(reg, '^(%d+) (%d+) (%d+) ([^ ]+) (.*)$')
      end
      if expiry and tonumber(expiry) > now then
        local fence = redis.pcall('HINCRBY', meta, 'fence', 1)
        if type(fence) ~= 'number' then
          redis.call('DEL', lock)
          redis.pcall('PUBLISH', chan_prefix .. id, lock)
          return true
        end
        redis.call('SET', lock, tok .. ' ' .. string.format('%d', now) .. ' ' .. owner, 'PX', ttl)
        redis.pcall('HSET', meta, 'token', tok, 'holder_fence', fence)
        redis.pcall('PUBLISH', chan_prefix .. id,
          '\t' .. string.format('%d', fence) .. ' ' .. seq .. ' ' .. tok .. ' ' .. lock)
        return true
      end
    end
  end
  return false
end

-- Whether `cur`, a lock key's value, was written by the holder of `tok`: either the bare token
-- (older values, other tools) or '<token> <since> <owner>'. Tokens never contain spaces.
local function is_ours(cur, tok)
  return cur == tok or string.sub(cur, 1, #tok + 1) == tok .. ' '
end
