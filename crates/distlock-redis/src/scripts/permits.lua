-- Helpers of the semaphore's scripts, prepended to them (see scripts.rs): `server_ms`,
-- `sweep`, `settle` and `keep` (the two in one).
--
-- A semaphore's keys (KEYS[1] to KEYS[4] of every script that uses these helpers):
-- KEYS[1] holders: a sorted set, token -> deadline in ms on the server's clock (TIME), never
--         the client's;
-- KEYS[2] meta hash: 'permits' (the size the holders and waiters opened it with), 'seq' (the
--         queue's arrival counter), 'f:<token>' (each holder's fence), 'o:<token>' (its holder
--         value, '<token> <since> <owner>', for status);
-- KEYS[3] queue of waiting clients: a sorted set, '<token> <wake channel>' -> arrival;
-- KEYS[4] the queue's liveness: the same members -> the deadline of their place (a waiter
--         that stopped asking leaves the queue by itself).

-- The server's clock in ms.
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Drops the holders past their deadline and the waiters past theirs.
local function sweep(now)
  for _, d in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
    redis.call('ZREM', KEYS[1], d)
    redis.call('HDEL', KEYS[2], 'f:' .. d, 'o:' .. d)
  end
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)) do
    redis.call('ZREM', KEYS[3], w)
    redis.call('ZREM', KEYS[4], w)
  end
end

-- Lets the four keys live a second past the last deadline of any holder or waiter, so a
-- semaphore nobody uses any more leaves nothing behind. (A script that writes a deadline calls
-- it once, after its writes.)
local function settle(now)
  local a = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  local b = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
  local last = math.max(tonumber(a[2] or 0), tonumber(b[2] or 0))
  if last > now then
    for i = 1, 4 do
      redis.call('PEXPIRE', KEYS[i], last - now + 1000)
    end
  else
    redis.call('DEL', KEYS[2])
  end
end

-- `sweep`, then `settle`.
local function keep(now)
  sweep(now)
  settle(now)
end
