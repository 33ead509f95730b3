-- distlock read extend: renews a reader's share if it is still ours, on the server's clock.
-- KEYS[1] lock key, KEYS[2] the readers' sorted set; ARGV[1] token, ARGV[2] ttl ms.
-- Returns 1 (ours, renewed) or 0 (not held: expired, or the lock is no longer the readers',
-- after a forced release).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local d = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not d or tonumber(d) <= now or redis.call('GET', KEYS[1]) ~= '~readers' then
  if d then
    redis.call('ZREM', KEYS[2], ARGV[1])
  end
  return 0
end
local until_ms = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], until_ms, ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) + 1000 then
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]) + 1000)
end
return 1
