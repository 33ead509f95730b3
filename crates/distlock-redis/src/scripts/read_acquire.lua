-- distlock read acquire: a reader's share of a read-write lock. One round trip, atomic.
-- The writer is the plain lock (acquire.lua, and the first attempt's SET NX). Readers hold the
-- lock key with the marker '~readers' (so a writer's SET NX fails), living as long as the
-- longest share; each share is a member of the readers' sorted set, scored with its deadline
-- on the server's clock.
-- KEYS[1] lock key, KEYS[2] meta hash ('r:<token>': each reader's fence; 'o:<token>': its holder
-- value), KEYS[3] the queue of
-- waiting clients (see queue.lua), KEYS[4] the fence counter (see fence.lua), KEYS[5] the
-- readers' sorted set, KEYS[6] the name's semaphore holders (a semaphore there is a conflict).
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] our registration (a reader's: its owner field starts
-- with '~r '; '' when we do not hear wake-ups: then we do not queue), ARGV[4] the client's clock
-- in ms since the epoch (shown as a next writer's start), ARGV[5] our wake channel, ARGV[6] our
-- holder value ('<token> <since> <owner>', kept in the meta hash as 'o:<token>' for status).
-- Returns {1, fence} when the share is ours, where the fence is the counter as the last writer
-- left it (0 before any writer); {0, the lock's pttl, queued} when a writer holds it or waits
-- (a waiting writer holds back new readers: readers and writers are served in arrival order);
-- {-2} when a semaphore holds the name.
-- The common case (the lock free and nobody queued: the first share, with the marker) is
-- decided first; every other case follows, and uses `pass_on` (queue.lua), which calls
-- `next_fence` (fence.lua), both prepended to it (see scripts.rs).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tok, ttl = ARGV[1], tonumber(ARGV[2])
local MARK = '~readers'
-- A permit in the semaphore's holders' set, besides its member '~' (the set outlives its
-- holders: see permits.lua). One past its deadline, not yet swept, counts until it is.
if redis.call('ZCARD', KEYS[6]) > 1 then
  return {-2}
end
local cur = redis.call('GET', KEYS[1])
if cur == false and redis.call('LLEN', KEYS[3]) == 0 then
  local fence = tonumber(redis.call('ZSCORE', KEYS[4], 'f')) or 0
  redis.call('ZADD', KEYS[5], now + ttl, tok)
  redis.call('HSET', KEYS[2], 'r:' .. tok, fence, 'o:' .. tok, ARGV[6])
  redis.call('SET', KEYS[1], MARK, 'PX', ttl)
  if redis.call('ZCARD', KEYS[5]) == 1 then
    -- The first share: the marker just written lives as long as it.
    redis.call('PEXPIRE', KEYS[5], ttl + 1000)
  else
    -- Shares past their deadline that outlived the marker: the set lives as long as the
    -- longest share.
    local last = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')
    redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now)
    redis.call('PEXPIRE', KEYS[5], tonumber(last[2]) - now + 1000)
  end
  if ARGV[3] ~= '' then
    redis.pcall('LREM', KEYS[3], 1, ARGV[3])
  end
  return {1, fence}
end
-- Every other case: the lock held, or clients queued.
local function stretch()
  local last = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now)
    redis.call('PEXPIRE', KEYS[5], tonumber(last[2]) - now + 1000)
  end
end
local function queued_now()
  if ARGV[3] == '' then
    return 0
  end
  if type(redis.pcall('LPOS', KEYS[3], ARGV[3])) == 'number' then
    return 0
  end
  redis.pcall('RPUSH', KEYS[3], ARGV[3])
  return 1
end
if cur == false and redis.call('LLEN', KEYS[3]) > 0 then
  -- Free, with clients queued: it goes to the first of them, as a release would give it (we
  -- may be among the readers let in).
  pass_on(KEYS[1], KEYS[2], KEYS[4], KEYS[3], '', ARGV[4], nil)
  cur = redis.call('GET', KEYS[1])
end
if cur == MARK then
  -- The expired shares go. (Without the marker there are no live shares: it lives as long as
  -- the longest.)
  for _, d in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)) do
    redis.call('ZREM', KEYS[5], d)
    redis.call('HDEL', KEYS[2], 'r:' .. d, 'o:' .. d)
  end
end
if cur == MARK and redis.call('ZSCORE', KEYS[5], tok) then
  -- Ours: let in by a release, or a resent request. Counted from now.
  redis.call('ZADD', KEYS[5], now + ttl, tok)
  stretch()
  if ARGV[3] ~= '' then
    redis.pcall('LREM', KEYS[3], 1, ARGV[3])
  end
  return {1, tonumber(redis.call('HGET', KEYS[2], 'r:' .. tok)) or 0}
end
if cur and cur ~= MARK then
  return {0, redis.call('PTTL', KEYS[1]), queued_now()}
end
if cur == MARK then
  local head = redis.call('LINDEX', KEYS[3], 0)
  if head and head ~= ARGV[3] and not string.find(head, '^[^ ]+ %d+ %d+ [^ ]+ ~r ') then
    -- A writer waits: it goes before us.
    return {0, redis.call('PTTL', KEYS[1]), queued_now()}
  end
end
local fence = tonumber(redis.call('ZSCORE', KEYS[4], 'f')) or 0
redis.call('ZADD', KEYS[5], now + ttl, tok)
redis.call('HSET', KEYS[2], 'r:' .. tok, fence, 'o:' .. tok, ARGV[6])
if cur == false then
  redis.call('SET', KEYS[1], MARK, 'PX', ttl)
end
if cur == false and redis.call('ZCARD', KEYS[5]) == 1 then
  -- The first share (the common case): the marker just written lives as long as it.
  redis.call('PEXPIRE', KEYS[5], ttl + 1000)
else
  stretch()
end
if ARGV[3] ~= '' then
  redis.pcall('LREM', KEYS[3], 1, ARGV[3])
end
return {1, fence}
