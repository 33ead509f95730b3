-- distlock permit release: gives our permit back and tells the waiters whose turn it may now be.
-- KEYS[1] to KEYS[4]: the semaphore's keys (see permits.lua); KEYS[5] the name's lock key
-- (what waiters are told: their client wakes its waiters on that name).
-- ARGV[1] token, ARGV[2] our queue member (a waiter that gives up leaves the queue this way),
-- ARGV[3] our member in the holders' set ('<fence> <holder value>'; '' when the client does
-- not know it; '-' when the client removed it already, with a plain ZREM, and runs this script
-- only to tell the waiters): a member not found there is looked for by the token.
-- The client's common path is no script at all: `ZREM` of its member and `ZCARD` of the queue
-- in one round trip, this script following only when somebody waits (see permits.rs).
-- Returns 1 (it was ours, before its deadline) or 0 (not held: expired or removed).
-- The common case (a member found, nobody waiting: four calls) is decided first. Every other
-- (a member the client does not know, or waiters to tell) follows: each waiter told is the next
-- in arrival order, as many as permits are free, by its token ('\n<token> <lock key>': only that
-- task of its client tries); one that nobody hears (its process is gone) leaves the queue and
-- the next is told instead. The telling uses pcall: an ACL without the channel never undoes a
-- release (waiters then fall back to their capped sleep). Uses `tell` (queue.lua), which
-- comes with `next_fence` (fence.lua) for its `pass_on`, and `find_holder`, `sweep_holders`,
-- `live_holders`, `sweep_queue` (permits.lua), all prepended to it (see scripts.rs).
-- It writes no deadline, so expiries stay as they are (see permits.lua).
local t = redis.call('TIME')
local out = nil
local d = ARGV[3] ~= '' and ARGV[3] ~= '-' and redis.call('ZSCORE', KEYS[1], ARGV[3])
if d then
  redis.call('ZREM', KEYS[1], ARGV[3])
  -- Before its deadline? Compared as decimal strings, with no number parsed: the clock in ms is
  -- TIME's seconds followed by the first three digits of its microseconds, and a score that is
  -- a whole number of ms reads back without a fraction or an exponent.
  local us = t[2]
  local now_ms = t[1] .. string.sub(string.rep('0', 6 - #us) .. us, 1, 3)
  out = 0
  if #d > #now_ms or (#d == #now_ms and d > now_ms) then
    out = 1
  end
  -- Nobody waits: nothing to leave, nobody to tell.
  if redis.call('ZCARD', KEYS[3]) == 0 then
    return out
  end
end
-- A member the client does not know, or waiters to tell.
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not out and ARGV[3] == '-' then
  -- Removed by the client already: only the waiters are left to tell.
  out = 0
elseif not out then
  out = 0
  local member, d = find_holder(ARGV[1])
  if member then
    redis.call('ZREM', KEYS[1], member)
    if d > now then
      out = 1
    end
  end
  if redis.call('ZCARD', KEYS[3]) == 0 then
    return out
  end
end
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[2])
sweep_holders(now)
sweep_queue(now)
local n = tonumber(redis.call('HGET', KEYS[2], 'permits') or '0')
local free = n - live_holders(now)
local told = 0
if free > 0 then
  local waiters = redis.call('ZRANGE', KEYS[3], 0, free + 15)
  for _, w in ipairs(waiters) do
    if told >= free then
      break
    end
    local tok, chan = string.match(w, '^([^ ]+) (.+)$')
    local heard = chan and tell(chan, '\n' .. tok .. ' ' .. KEYS[5])
    if type(heard) == 'number' and heard > 0 then
      told = told + 1
    else
      redis.call('ZREM', KEYS[3], w)
      redis.call('ZREM', KEYS[4], w)
    end
  end
end
return out
