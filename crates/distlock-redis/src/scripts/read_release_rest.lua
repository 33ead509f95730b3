-- The rest of read_release.lua (see there): shares left, or clients queued. Uses `pass_on`
-- (queue.lua), which goes before it, and `t`, `out` from read_release.lua.
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = {}
if redis.call('ZCARD', KEYS[5]) > 0 then
  -- Other shares: the expired ones go, and the marker lives as long as the longest left.
  for _, r in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)) do
    redis.call('ZREM', KEYS[5], r)
    redis.call('HDEL', KEYS[2], 'r:' .. r, 'o:' .. r)
  end
  last = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')
end
if last[2] then
  redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now)
elseif not pass_on(KEYS[1], KEYS[2], KEYS[4], KEYS[3], '', ARGV[2], nil) then
  redis.call('DEL', KEYS[1])
end
return out
