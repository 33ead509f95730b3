-- distlock acquire_many: several names taken at once, all or none (lock_many). One round trip,
-- atomic: each name is the same lock as a single-name lease of it (its lock key, meta hash,
-- queue of waiting clients and fence counter, as acquire.lua uses them).
-- KEYS: four for each name, in the names' order: the lock key, the meta hash, the queue of
-- waiting clients (not used: a multi-name waiter is not queued, see below) and the fence
-- counter.
-- ARGV[1] token, ARGV[2] value ('<token> <since ms> <owner>'), ARGV[3] ttl ms, then for each
-- name the highest fence of it the client saw ('0' when none; see fence.lua).
-- Returns {1, fence, fence, ...} (one fence a name, in order) when every name is ours;
-- {0, i, pttl} when the i-th name (from 1) is held by somebody else, with its holder's pttl.
-- Nothing is written unless every name is free or ours already (a resent request), and every
-- fence is taken before any lock key is written: an error (WRONGTYPE) leaves no name taken.
-- A multi-name waiter never queues on a name: it would then hold that name while it waited
-- for the others.
-- Uses `is_ours` (token.lua), `next_fence` (fence.lua) and `values_of` (many.lua), prepended
-- to it (see scripts.rs).
local tok, n = ARGV[1], #KEYS / 4
local ours = {}
local curs = values_of(1, 4)
for i = 1, n do
  local cur = curs[i]
  if cur then
    if not is_ours(cur, tok) then
      return {0, i, redis.call('PTTL', KEYS[4 * i - 3])}
    end
    ours[i] = true
  end
end
-- The server's clock, read once for every name's fence (see fence.lua).
local now = redis.call('TIME')
local us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local out = {1}
for i = 1, n do
  local fence = nil
  if ours[i] then
    -- A resent request: keep the fence this token was given.
    local meta = redis.call('HMGET', KEYS[4 * i - 2], 'token', 'holder_fence')
    if meta[1] == tok then
      fence = tonumber(meta[2])
    end
  end
  if not fence then
    local why
    fence, why = next_fence(KEYS[4 * i], tonumber(ARGV[3 + i]) or 0, now, us)
    if not fence then
      return redis.error_reply(why)
    end
  end
  out[i + 1] = fence
end
for i = 1, n do
  redis.call('SET', KEYS[4 * i - 3], ARGV[2], 'PX', ARGV[3])
  redis.call('HSET', KEYS[4 * i - 2], 'token', tok, 'holder_fence', fence_text(out[i + 1]))
end
return out
