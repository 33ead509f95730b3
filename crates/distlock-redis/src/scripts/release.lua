-- distlock release: compare-and-delete, then wake the next waiting client.
-- KEYS[1] lock key, KEYS[2] waiters zset, KEYS[3] alive hash
-- ARGV[1] token, ARGV[2] wake channel prefix, ARGV[3] reservation ms, ARGV[4] our client id,
-- ARGV[5] registration ms, ARGV[6] '1' when tasks of ours still wait for this lock and can be
-- woken ('' otherwise)
-- Returns 0 (no lock), -1 (another owner's lock, untouched), 1 (released, left free),
-- 2 (released, reserved for another client's waiter, which was woken).
local cur = redis.call('GET', KEYS[1])
if cur == false then
  return 0
end
if not is_ours(cur, ARGV[1]) then
  return -1
end
redis.call('DEL', KEYS[1])
local self_id = ''
if ARGV[6] == '' then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    return 1
  end
  -- A place of ours left from an earlier wait (we then took the lock on the fast path).
  redis.pcall('ZREM', KEYS[2], ARGV[4])
  redis.pcall('HDEL', KEYS[3], ARGV[4])
else
  -- Our own next task goes to the back of the queue, behind the clients already waiting
  -- (fair across processes), and is woken in its turn.
  self_id = ARGV[4]
  enqueue(KEYS[2], KEYS[3], self_id, tonumber(ARGV[5]), false)
end
return pass_on(KEYS[1], KEYS[2], KEYS[3], ARGV[2], ARGV[3], self_id)
