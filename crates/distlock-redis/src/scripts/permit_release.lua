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
-- This file is the common path (a member found, nobody waiting: four calls);
-- permit_release_rest.lua, after the helpers, is every other: it uses `tell` (queue.lua,
-- which comes with `next_fence` of fence.lua) and `find_holder`, `sweep_holders`,
-- `live_holders`, `sweep_queue` (permits.lua).
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
