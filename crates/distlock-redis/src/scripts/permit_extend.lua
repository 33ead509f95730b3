-- distlock permit extend: renews our permit if it is still ours, on the server's clock.
-- KEYS[1] to KEYS[4]: the semaphore's keys (see permits.lua); ARGV[1] token, ARGV[2] ttl ms,
-- ARGV[3] our member in the holders' set ('' when the client does not know it): a member not
-- found there is looked for by the token.
-- Returns 1 (ours, renewed) or 0 (not held: expired or removed).
-- Uses `server_ms`, `find_holder`, `cover` (permits.lua), prepended to it.
local now = server_ms()
local member, d = ARGV[3], nil
if member ~= '' then
  d = tonumber(redis.call('ZSCORE', KEYS[1], member))
end
if not d then
  member, d = find_holder(ARGV[1])
end
if not d or d <= now then
  return 0
end
local deadline = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', deadline, member)
local known = tonumber(redis.call('HGET', KEYS[2], 'until')) or 0
if deadline > known then
  redis.call('HSET', KEYS[2], 'until', deadline + tonumber(ARGV[2]))
  cover(now, deadline + tonumber(ARGV[2]), 4)
end
return 1
