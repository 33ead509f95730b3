-- distlock leave: this client has nobody waiting for the lock any more. Leave the queue, and
-- pass on a reservation a release made for us meanwhile.
-- KEYS[1] lock key, KEYS[2] waiters zset, KEYS[3] alive hash
-- ARGV[1] our client id, ARGV[2] wake channel prefix, ARGV[3] reservation ms
redis.pcall('ZREM', KEYS[2], ARGV[1])
redis.pcall('HDEL', KEYS[3], ARGV[1])
if redis.call('GET', KEYS[1]) == '\t' .. ARGV[1] then
  redis.call('DEL', KEYS[1])
  return pass_on(KEYS[1], KEYS[2], KEYS[3], ARGV[2], ARGV[3], '')
end
return 0
