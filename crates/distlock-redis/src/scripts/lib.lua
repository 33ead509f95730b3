-- The server's clock, in ms.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Puts client `id` in the queue of waiting clients, at the back (strictly behind everybody
-- already there, even within one microsecond), or, with `keep`, keeps its place if it has one.
-- Its registration lives `reg_ms`. Uses pcall: junk under the queue keys only costs wake-ups.
local function enqueue(waiters, alive, id, reg_ms, keep)
  if keep and redis.pcall('ZSCORE', waiters, id) then
    redis.pcall('HSET', alive, id, now_ms() + reg_ms)
    return
  end
  local t = redis.call('TIME')
  local score = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = redis.pcall('ZRANGE', waiters, -1, -1, 'WITHSCORES')
  if type(last) == 'table' and not last.err and last[2] then
    score = math.max(score, tonumber(last[2]) + 1)
  end
  redis.pcall('ZADD', waiters, score, id)
  redis.pcall('HSET', alive, id, math.floor(score / 1000) + reg_ms)
  redis.pcall('PEXPIRE', waiters, reg_ms)
  redis.pcall('PEXPIRE', alive, reg_ms)
end

-- Shared by release and leave: give a just-freed lock to the first live waiting client.
-- The lock key then holds '\t' .. <client id> for `resv_ms`: a reservation that every other
-- attempt sees as busy (distlock or not), that only that client's next attempt takes over, and
-- that expires by itself if the client is gone. The client is woken on its own channel
-- (`chan_prefix` .. id, payload the lock key), so no other client wakes up.
-- Returns 2 when reserved for another client, 1 when the lock was left free (nobody live
-- waits, or `self_id` is first: this client's own next task goes on its own).
-- Every call after the lock is written uses pcall: junk under the queue keys, or an ACL without
-- the channel, never undoes a release (waiters then fall back to their capped sleep).
local function pass_on(lock, waiters, alive, chan_prefix, resv_ms, self_id)
  local now = now_ms()
  for _ = 1, 8 do
    local first = redis.pcall('ZRANGE', waiters, 0, 0)
    if type(first) ~= 'table' or first.err or first[1] == nil then
      return 1
    end
    local id = first[1]
    if id == self_id then
      return 1
    end
    local expiry = tonumber(redis.pcall('HGET', alive, id)) or 0
    if expiry > now then
      redis.call('SET', lock, '\t' .. id, 'PX', resv_ms)
      redis.pcall('PUBLISH', chan_prefix .. id, lock)
      return 2
    end
    -- A waiter that stopped asking (gone, or crashed): drop it.
    redis.pcall('ZREM', waiters, id)
    redis.pcall('HDEL', alive, id)
  end
  return 1
end

-- Whether `cur`, a lock key's value, was written by the holder of `tok`: either the bare token
-- (older values, other tools) or '<token> <since> <owner>'. Tokens never contain spaces.
local function is_ours(cur, tok)
  return cur == tok or string.sub(cur, 1, #tok + 1) == tok .. ' '
end
