-- distlock downgrade: turns the writer's hold of a read-write lock into a reader's share, in one
-- step, so that no other writer gets in between. The lock key takes the readers' marker, our
-- token a share scored with its deadline on the server's clock, and the readers waiting at the
-- head of the queue come in with us (a writer at the head stays there; see read_acquire.lua
-- and `pass_on` in queue.lua).
-- KEYS[1] lock key, KEYS[2] meta hash, KEYS[3] the queue of waiting clients, KEYS[4] the fence
-- counter, KEYS[5] the readers' sorted set.
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] the client's clock in ms since the epoch.
-- Returns 1 when the lock is now our reader's share (also when it already was: a resent
-- request), 0 when the writer's lock is not ours.
-- Uses `is_ours` (token.lua), `next_fence` (fence.lua) and `pass_on` (queue.lua), prepended.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tok, ttl = ARGV[1], tonumber(ARGV[2])
local MARK = '~readers'
local cur = redis.call('GET', KEYS[1])
if cur == MARK then
  local d = redis.call('ZSCORE', KEYS[5], tok)
  if d and tonumber(d) > now then
    return 1
  end
  return 0
end
if not cur or not is_ours(cur, tok) then
  return 0
end
-- The reader reads after our own write: its fence is ours, the counter as we left it.
local fence = tonumber(redis.call('ZSCORE', KEYS[4], 'f')) or 0
redis.call('SET', KEYS[1], MARK, 'PX', ttl)
redis.call('ZADD', KEYS[5], now + ttl, tok)
redis.call('PEXPIRE', KEYS[5], ttl + 1000)
redis.call('HSET', KEYS[2], 'r:' .. tok, fence, 'o:' .. tok, cur)
redis.call('HDEL', KEYS[2], 'token', 'holder_fence')
local head = redis.pcall('LINDEX', KEYS[3], 0)
if type(head) == 'string' and string.find(head, '^[^ ]+ %d+ %d+ [^ ]+ ~r ') then
  pass_on(KEYS[1], KEYS[2], KEYS[4], KEYS[3], '', ARGV[3], nil, true)
end
return 1
