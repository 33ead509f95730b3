-- A fenced write to the protected resource (not to a lock): writes only when the writer's
-- fencing token is at least the highest token that wrote this key before.
-- KEYS[1] the resource (a hash: `value`, `fence`)
-- ARGV[1] the writer's fence (decimal), ARGV[2] the value
-- Returns 1 when written, 0 when a newer fence wrote it (the writer's lock is stale).
local fence = tonumber(ARGV[1])
if fence == nil or fence < 0 or ARGV[1]:find('[^0-9]') then
  return redis.error_reply('ERR distlock: the fence must be a decimal integer')
end
local cur = redis.call('HGET', KEYS[1], 'fence')
-- Compared as numbers of equal width: tokens are below 2^63, beyond a double's exactness, so
-- compare the decimal strings by length first, then lexically.
if cur then
  if #cur > #ARGV[1] or (#cur == #ARGV[1] and cur > ARGV[1]) then
    return 0
  end
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1
