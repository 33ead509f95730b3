-- distlock read release: gives a reader's share back; the last reader out hands the lock to the
-- next waiting client (a writer, or readers), or frees it.
-- KEYS[1] lock key, KEYS[2] meta hash, KEYS[3] the queue of waiting clients (see queue.lua),
-- KEYS[4] the fence counter (see fence.lua), KEYS[5] the readers' sorted set.
-- ARGV[1] token, ARGV[2] the client's clock in ms since the epoch (shown as a next writer's
-- start), ARGV[3] our registration in the queue, if we may have one ('' if not).
-- Returns 1 (it was ours, before its deadline) or 0 (not held).
-- Uses `next_fence` (fence.lua) and `pass_on` (queue.lua), prepended to it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local MARK = '~readers'
local cur = redis.call('GET', KEYS[1])
local d = redis.call('ZSCORE', KEYS[5], ARGV[1])
local out = 0
if d then
  redis.call('ZREM', KEYS[5], ARGV[1])
  if tonumber(d) > now and cur == MARK then
    out = 1
  end
end
redis.call('HDEL', KEYS[2], 'r:' .. ARGV[1], 'o:' .. ARGV[1])
if ARGV[3] ~= '' then
  redis.pcall('LREM', KEYS[3], 1, ARGV[3])
end
if cur ~= MARK then
  -- Not the readers' (a writer's, or free): any share left is void, and the next reader's
  -- sweep takes it out.
  return out
end
local last = {}
if redis.call('ZCARD', KEYS[5]) > 0 then
  -- Other shares: the expired ones go, and the marker lives as long as the longest left.
  for _, r in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)) do
    redis.call('ZREM', KEYS[5], r)
    redis.call('HDEL', KEYS[2], 'r:' .. r, 'o:' .. r)
  end
  last = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')
end
if last[2] then
  redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now)
elseif not pass_on(KEYS[1], KEYS[2], KEYS[4], KEYS[3], '', ARGV[2], nil) then
  redis.call('DEL', KEYS[1])
end
return out
