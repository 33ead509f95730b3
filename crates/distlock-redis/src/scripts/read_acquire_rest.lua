-- The rest of read_acquire.lua (see there): the lock held, or clients queued. Uses `pass_on`
-- (queue.lua), which goes before it, and `cur`, `now`, `tok`, `ttl` and `MARK` from
-- read_acquire.lua.
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
