-- distlock release: compare-and-delete, or hand the lock to the next waiting client.
-- KEYS[1] lock key, KEYS[2] meta hash, KEYS[3] waiters zset, KEYS[4] alive hash
-- ARGV[1] token, ARGV[2] wake channel prefix, ARGV[3] our client id, ARGV[4] registration ms,
-- ARGV[5] when tasks of ours still wait for this lock, the registration of the next one
-- ('<ttl ms> <seq> <token> <owner>'), else ''
-- Returns 0 (no lock), -1 (another owner's lock, untouched), 1 (released, left free),
-- 2 (released and handed to another client), {3, fence} (handed to our own next task: nobody
-- else waits).
local cur = redis.call('GET', KEYS[1])
if cur == false then
  return 0
end
if not is_ours(cur, ARGV[1]) then
  return -1
end
if ARGV[5] == '' and redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('DEL', KEYS[1])
  return 1
end
local us = now_us()
if pass_on(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[3], math.floor(us / 1000)) then
  if ARGV[5] ~= '' then
    -- Our own next task goes to the back of the queue, behind the clients already waiting
    -- (fair across processes), and is handed the lock in its turn.
    enqueue(KEYS[3], KEYS[4], ARGV[3], us, tonumber(ARGV[4]), false, ARGV[5])
  end
  return 2
end
if ARGV[5] ~= '' then
  -- Nobody else waits: our own next task takes the lock now.
  local ttl, _, tok, owner = string.match(ARGV[5], '^(%d+) (%d+) ([^ ]+) (.*)$')
  local fence = redis.pcall('HINCRBY', KEYS[2], 'fence', 1)
  if tok and type(fence) == 'number' then
    redis.call('SET', KEYS[1], tok .. ' ' .. string.format('%d', math.floor(us / 1000)) .. ' ' .. owner, 'PX', ttl)
    redis.pcall('HSET', KEYS[2], 'token', tok, 'holder_fence', fence)
    return {3, fence}
  end
end
redis.call('DEL', KEYS[1])
return 1
