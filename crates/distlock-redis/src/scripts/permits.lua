-- Helpers of the semaphore's scripts, prepended to each of them (see scripts.rs): `server_ms`,
-- `find_holder`, `sweep_holders`, `live_holders`, `sweep_queue` and `cover`.
--
-- A semaphore's keys (KEYS[1] to KEYS[4] of every script that uses these helpers):
-- KEYS[1] holders: a sorted set of '<fence> <holder value>' (the holder value is '<token>
--         <since> <owner>': a holder's whole record, for resent requests and for status, in
--         the one write that takes the permit) -> deadline in ms on the server's clock (TIME),
--         never the client's. Its member '~', scored 0, keeps the set (and its expiry)
--         between holders; it never counts, since every count is of deadlines ahead of now.
--         A client names its permit by the whole member, which it builds from the fence the
--         acquire returned; a client that lost it finds it by the token (`find_holder`);
-- KEYS[2] meta hash: 'permits' (the size the holders and waiters opened it with), 'seq' (the
--         queue's arrival counter), 'until' (the latest deadline given to any holder or
--         waiter);
-- KEYS[3] queue of waiting clients: a sorted set, '<token> <wake channel>' -> arrival;
-- KEYS[4] the queue's liveness: the same members -> the deadline of their place (a waiter
--         that stopped asking leaves the queue by itself).
--
-- Expiry: every key that exists lives until a second past 'until'. A script that gives a
-- deadline past 'until' raises it (by a TTL more, so that the next acquisitions need not raise
-- it again) and sets the expiry of every key that exists; a script that creates a key sets its
-- expiry; nothing lowers it. So a semaphore nobody uses any more is gone a TTL and a second
-- after its last deadline at most, and nothing it holds can vanish before its own deadline.
--
-- Holders past their deadline are not counted (ZCOUNT of the deadlines still ahead); they are
-- swept out when the semaphore is full, and by the keys' expiry.

-- The server's clock in ms, and the TIME reply it came from.
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end

-- The member of the holder whose token is `tok`, its deadline and its fence, or nil (a scan of
-- the holders: for a client that does not know its member).
local function find_holder(tok)
  local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    local fence, rest = string.match(all[i], '^(%d+) (.*)$')
    if rest and string.sub(rest, 1, #tok + 1) == tok .. ' ' then
      return all[i], tonumber(all[i + 1]), tonumber(fence)
    end
  end
  return nil
end

-- Drops the holders past their deadline (never the member '~').
local function sweep_holders(now)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '(0', now)
end

-- How many holders' deadlines are still ahead.
local function live_holders(now)
  return redis.call('ZCOUNT', KEYS[1], now + 1, '+inf')
end

-- Drops the waiters past their place's deadline; returns how many wait.
local function sweep_queue(now)
  local waiting = redis.call('ZCARD', KEYS[3])
  if waiting > 0 then
    local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
    for _, w in ipairs(gone) do
      redis.call('ZREM', KEYS[3], w)
      redis.call('ZREM', KEYS[4], w)
    end
    if #gone > 0 then
      waiting = redis.call('ZCARD', KEYS[3])
    end
  end
  return waiting
end

-- Lets the first `count` keys live a second past `last` (the new 'until', which the caller
-- wrote).
local function cover(now, last, count)
  for i = 1, count do
    redis.call('PEXPIRE', KEYS[i], last - now + 1000)
  end
end
