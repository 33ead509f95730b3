-- distlock release: compare-and-delete, or hand the lock to the next waiting client.
-- KEYS[1] lock key, KEYS[2] meta hash, KEYS[3] the queue of waiting clients (see lib)
-- ARGV[1] token, ARGV[2] wake channel prefix, ARGV[3] our client id, ARGV[4] now (ms, shown as
-- the next holder's start), ARGV[5] when tasks of ours still wait for this lock, the
-- registration of the next one ('<ttl ms> <seq> <token> <owner>'), else '',
-- ARGV[6] our registration in the queue, if we believe we have one ('' if not)
-- Returns 0 (no lock), -1 (another owner's lock, untouched), 1 (released, left free),
-- 2 (released and handed to another client; with ARGV[5], our registration is in the queue:
-- ARGV[6] if it was there, else a new one), 3 (the same, and a new registration of ours was
-- added), {4, fence} (handed to our own next task: nobody else waits).
local cur = redis.call('GET', KEYS[1])
if cur == false then
  return 0
end
if not is_ours(cur, ARGV[1]) then
  return -1
end
if ARGV[5] == '' and ARGV[6] ~= '' then
  -- A registration of ours left from a wait whose last task took the lock otherwise.
  redis.pcall('LREM', KEYS[3], 1, ARGV[6])
end
local handed, met_self = pass_on(KEYS[1], KEYS[2], KEYS[3], ARGV[2], ARGV[3], ARGV[4])
if ARGV[5] == '' then
  if handed then
    return 2
  end
  redis.call('DEL', KEYS[1])
  return 1
end
if handed then
  -- Our own next task waits at the back of the queue, behind the clients already waiting (fair
  -- across processes), and is handed the lock in its turn.
  if ARGV[6] == '' or met_self then
    redis.pcall('RPUSH', KEYS[3], ARGV[3] .. ' ' .. ARGV[5])
    return 3
  end
  return 2
end
-- Nobody else waits: our own next task takes the lock now.
local ttl, _, tok, owner = string.match(ARGV[5], '^(%d+) (%d+) ([^ ]+) (.*)$')
local fence = redis.pcall('HINCRBY', KEYS[2], 'fence', 1)
if tok and type(fence) == 'number' then
  redis.call('SET', KEYS[1], tok .. ' ' .. ARGV[4] .. ' ' .. owner, 'PX', ttl)
  redis.pcall('HSET', KEYS[2], 'token', tok, 'holder_fence', fence)
  if ARGV[6] ~= '' and not met_self then
    redis.pcall('LREM', KEYS[3], 1, ARGV[6])
  end
  return {4, fence}
end
redis.call('DEL', KEYS[1])
return 1
