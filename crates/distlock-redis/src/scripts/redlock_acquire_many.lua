-- distlock Redlock acquire_many on one master: several names taken at once, all or none.
-- KEYS: the names' lock keys, in the names' order; ARGV[1] token, ARGV[2] value, ARGV[3] ttl ms.
-- Returns 1 when every name is ours here (newly set, or already ours: written again with the
-- new lease); {0, i, pttl} when the i-th name (from 1) is another owner's, with its pttl, and
-- then nothing is written. Every key is read before any is written, so an error (WRONGTYPE)
-- leaves no name taken.
-- Uses `is_ours` (token.lua), prepended to it (see scripts.rs).
for i = 1, #KEYS do
  local cur = redis.call('GET', KEYS[i])
  if cur and not is_ours(cur, ARGV[1]) then
    return {0, i, redis.call('PTTL', KEYS[i])}
  end
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], ARGV[2], 'PX', ARGV[3])
end
return 1
