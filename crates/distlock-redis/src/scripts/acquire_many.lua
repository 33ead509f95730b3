-- distlock acquire_many: several names taken at once, all or none (lock_many). One round trip,
-- atomic: each name is the same lock as a single-name lease of it (its lock key and fence
-- counter, as the first attempt's pipeline writes them: no meta hash, see below).
-- KEYS: two for each name, in the names' order: the lock key and the fence counter.
-- ARGV[1] token, ARGV[2] value ('<token> <since ms> <owner>'), ARGV[3] ttl ms, then for each
-- name the highest fence of it the client saw ('0' when none; see fence.lua).
-- Returns {1, fence, fence, ...} (one fence a name, in order) when every name is ours;
-- {0, i, pttl} when the i-th name (from 1) is held by somebody else, with its holder's pttl.
-- Nothing is written unless every name is free or ours already, and every fence is taken
-- before any lock key is written: an error (WRONGTYPE) leaves no name taken.
-- A resent request (its first reply lost: every name ours already) takes new fences, as the
-- single name's pipeline does: the fences first given reached nobody, and every fence given is
-- still above the ones before. So nothing is written for a name but its lock key and its
-- counter, two calls a name (the meta hash's token and fence cost a third): `status` gives no
-- holder's fence then, and its last fence (the counter's score) bounds it from above, as for
-- a pipelined holder.
-- A lock key of another type (a hash, a list: another tool's data) reads as nil in MGET: one
-- EXISTS of the names read as free tells, and the call fails with WRONGTYPE, nothing written,
-- where SET would have replaced that data.
-- A multi-name waiter never queues on a name: it would then hold that name while it waited
-- for the others.
-- Uses `is_ours` (token.lua), `next_fence` (fence.lua) and `values_of` (many.lua), prepended
-- to it (see scripts.rs).
local tok, n = ARGV[1], #KEYS / 2
local curs, locks = values_of(1, 2)
local free = {}
for i = 1, n do
  local cur = curs[i]
  if not cur then
    free[#free + 1] = locks[i]
  elseif not is_ours(cur, tok) then
    return {0, i, redis.call('PTTL', KEYS[2 * i - 1])}
  end
end
for from = 1, #free, 1000 do
  if redis.call('EXISTS', unpack(free, from, math.min(from + 999, #free))) > 0 then
    return redis.error_reply('WRONGTYPE distlock: a lock key holds a value of another type')
  end
end
-- The server's clock, read once for every name's fence (see fence.lua).
local now = redis.call('TIME')
local us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local us_text = fence_text(us + 1)
local out = {1}
for i = 1, n do
  local fence, why = next_fence(KEYS[2 * i], tonumber(ARGV[3 + i]) or 0, now, us, us_text)
  if not fence then
    return redis.error_reply(why)
  end
  out[i + 1] = fence
end
for i = 1, n do
  redis.call('SET', KEYS[2 * i - 1], ARGV[2], 'PX', ARGV[3])
end
return out
