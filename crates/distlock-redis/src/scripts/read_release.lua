-- distlock read release: gives a reader's share back; the last reader out hands the lock to the
-- next waiting client (a writer, or readers), or frees it.
-- KEYS[1] lock key, KEYS[2] meta hash, KEYS[3] the queue of waiting clients (see queue.lua),
-- KEYS[4] the fence counter (see fence.lua), KEYS[5] the readers' sorted set.
-- ARGV[1] token, ARGV[2] the client's clock in ms since the epoch (shown as a next writer's
-- start), ARGV[3] our registration in the queue, if we may have one ('' if not).
-- Returns 1 (it was ours, before its deadline) or 0 (not held).
-- The common case (the last share out and nobody queued: the marker goes) is decided first;
-- every other case (shares left, or clients queued) follows, and uses `pass_on` (queue.lua),
-- which calls `next_fence` (fence.lua), both prepended to it (see scripts.rs).
local t = redis.call('TIME')
local MARK = '~readers'
local cur = redis.call('GET', KEYS[1])
local d = redis.call('ZSCORE', KEYS[5], ARGV[1])
local out = 0
if d then
  redis.call('ZREM', KEYS[5], ARGV[1])
  -- Before its deadline? Compared as decimal strings (as permit_release.lua does): TIME's
  -- seconds and the first three digits of its microseconds, against a whole-ms score.
  local us = t[2]
  local now_ms = t[1] .. string.sub(string.rep('0', 6 - #us) .. us, 1, 3)
  if cur == MARK and (#d > #now_ms or (#d == #now_ms and d > now_ms)) then
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
-- (The queue read with pcall: junk under its key takes the other path, whose hand-over
-- tolerates it, never an error after the writes above.)
if redis.call('ZCARD', KEYS[5]) == 0 and redis.pcall('LLEN', KEYS[3]) == 0 then
  -- The last share out, nobody waiting: the lock is free.
  redis.call('DEL', KEYS[1])
  return out
end
-- Shares left, or clients queued.
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
