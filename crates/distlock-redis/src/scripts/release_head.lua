-- distlock release: compare-and-delete, or hand the lock to the next waiting client.
-- KEYS[1] lock key, KEYS[2] meta hash, KEYS[3] the queue of waiting clients (see below)
-- ARGV[1] token; then, only when they are not empty:
-- ARGV[2] when tasks of ours still wait for this lock, the registration of the next one (an
--         element of the queue), ARGV[3] our registration in the queue, if we believe we have
--         one, ARGV[4] our wake channel
-- Returns 0 (no lock), -1 (another owner's lock, untouched), 1 (released, left free),
-- 2 (released and handed to another client; with ARGV[2], our registration is in the queue:
-- ARGV[3] if it was there, else ARGV[2]), 3 (the same, and ARGV[2] was added),
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
local mine, believed, self_chan = ARGV[2] or '', ARGV[3] or '', ARGV[4] or ''
if mine == '' and believed == '' and redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('DEL', KEYS[1])
  return 1
end
