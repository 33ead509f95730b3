-- distlock release: compare-and-delete, or hand the lock to the next waiting client.
-- KEYS[1] lock key, KEYS[2] meta hash, KEYS[3] the queue of waiting clients (see below)
-- ARGV[1] token, ARGV[2] the client's clock in ms since the epoch (shown as the next holder's
-- start: the server's TIME would cost more than the rest of a release); then, only when they
-- are not empty:
-- ARGV[3] when tasks of ours still wait for this lock, the registration of the next one (an
--         element of the queue), ARGV[4] our registration in the queue, if we believe we have
--         one, ARGV[5] our wake channel
-- Returns 0 (no lock), -1 (another owner's lock, untouched), 1 (released, left free),
-- 2 (released and handed to another client; with ARGV[3], our registration is in the queue:
-- ARGV[4] if it was there, else ARGV[3]), 3 (the same, and ARGV[3] was added),
-- {4, fence} (handed to our own next task: nobody else waits).
-- The common case (nobody waits) comes first, before the helpers are even defined.
local cur = redis.call('GET', KEYS[1])
if cur == false then
  return 0
end
local tok = ARGV[1]
if cur ~= tok and string.sub(cur, 1, #tok + 1) ~= tok .. ' ' then
  return -1
end
local now, mine, believed, self_chan = ARGV[2], ARGV[3] or '', ARGV[4] or '', ARGV[5] or ''
-- Without registrations of ours, the first waiter (if any) is taken out here: the queue is read
-- once whether or not somebody waits.
local first = nil
if mine == '' and believed == '' then
  first = redis.pcall('LPOP', KEYS[3])
  if type(first) ~= 'string' then
    redis.call('DEL', KEYS[1])
    return 1
  end
end
