-- distlock leave: this client has nobody waiting for the lock any more. Leave the queue, and
-- pass on a lock a release handed to us meanwhile that none of our tasks will use.
-- KEYS[1] lock key, KEYS[2] meta hash, KEYS[3] waiters zset, KEYS[4] alive hash
-- ARGV[1] our client id, ARGV[2] wake channel prefix, ARGV[3] the token it was handed to ('' if
-- none)
-- Returns 0 (nothing to pass on), 1 (the lock freed), 2 (handed to the next client).
dequeue(KEYS[3], KEYS[4], ARGV[1])
if ARGV[3] ~= '' then
  local cur = redis.call('GET', KEYS[1])
  if cur and is_ours(cur, ARGV[3]) then
    if pass_on(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], '', math.floor(now_us() / 1000)) then
      return 2
    end
    redis.call('DEL', KEYS[1])
    return 1
  end
end
return 0
