-- distlock release: compare-and-delete, or hand the lock to the next waiting client.
-- KEYS[1] lock key, KEYS[2] meta hash, KEYS[3] the queue of waiting clients (see queue.lua),
-- KEYS[4] the fence counter (see fence.lua)
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
-- Uses `is_ours` (token.lua), `next_fence` (fence.lua) and `pass_on` (queue.lua), prepended to
-- it (see scripts.rs).
local cur = redis.call('GET', KEYS[1])
if cur == false then
  return 0
end
local tok = ARGV[1]
if not is_ours(cur, tok) then
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
if mine == '' and believed ~= '' then
  -- A registration of ours left from a wait whose last task took the lock otherwise.
  redis.pcall('LREM', KEYS[3], 1, believed)
end
local handed, met_self = pass_on(KEYS[1], KEYS[2], KEYS[4], KEYS[3], self_chan, now, first)
if mine == '' then
  if handed then
    return 2
  end
  redis.call('DEL', KEYS[1])
  return 1
end
if handed then
  -- Our own next task waits at the back of the queue, behind the clients already waiting (fair
  -- across processes), and is handed the lock in its turn.
  -- A believed registration is checked: one that has left the queue unnoticed (its grant
  -- still on its way to us) must not keep our tasks out of it.
  if believed == '' or met_self or type(redis.pcall('LPOS', KEYS[3], believed)) ~= 'number' then
    redis.pcall('RPUSH', KEYS[3], mine)
    return 3
  end
  return 2
end
-- Nobody else waits: our own next task takes the lock now.
local ttl, next_tok, owner = string.match(mine, '^[^ ]+ (%d+) %d+ ([^ ]+) (.*)$')
local fence = next_fence(KEYS[4], 0)
if next_tok and fence then
  redis.call('SET', KEYS[1], next_tok .. ' ' .. now .. ' ' .. owner, 'PX', ttl)
  redis.pcall('HSET', KEYS[2], 'token', next_tok, 'holder_fence', fence_text(fence))
  if believed ~= '' and not met_self then
    redis.pcall('LREM', KEYS[3], 1, believed)
  end
  return {4, fence}
end
redis.call('DEL', KEYS[1])
return 1
