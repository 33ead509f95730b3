if mine == '' and believed ~= '' then
  -- A registration of ours left from a wait whose last task took the lock otherwise.
  redis.pcall('LREM', KEYS[3], 1, believed)
end
local handed, met_self = pass_on(KEYS[1], KEYS[2], KEYS[3], self_chan, now, first)
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
local fence = redis.pcall('HINCRBY', KEYS[2], 'fence', 1)
if next_tok and type(fence) == 'number' then
  redis.call('SET', KEYS[1], next_tok .. ' ' .. now .. ' ' .. owner, 'PX', ttl)
  redis.pcall('HSET', KEYS[2], 'token', next_tok, 'holder_fence', fence)
  if believed ~= '' and not met_self then
    redis.pcall('LREM', KEYS[3], 1, believed)
  end
  return {4, fence}
end
redis.call('DEL', KEYS[1])
return 1
