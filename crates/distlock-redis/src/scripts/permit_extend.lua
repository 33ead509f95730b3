-- distlock permit extend: renews our permit if it is still ours, on the server's clock.
-- KEYS[1] to KEYS[4]: the semaphore's keys (see permits.lua); ARGV[1] token, ARGV[2] ttl ms.
-- Returns 1 (ours, renewed) or 0 (not held: expired or removed).
-- Uses `server_ms`, `keep` (permits.lua), prepended to it.
local now = server_ms()
local d = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not d or tonumber(d) <= now then
  keep(now)
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
keep(now)
return 1
