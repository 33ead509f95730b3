-- distlock release: compare-and-delete, and wake the next waiter.
-- KEYS[1] lock key, KEYS[2] waiters zset, KEYS[3] alive hash, KEYS[4] reservation
-- ARGV[1] token, ARGV[2] the release channel, ARGV[3] reservation ms
-- Returns 1 (ours, deleted), 0 (no lock), -1 (another owner's lock, untouched).
-- The first live waiting client (in order of arrival) gets a short reservation and is the only
-- one woken: no thundering herd. With nobody queued, '*' wakes every subscriber.
-- Everything after the DEL uses pcall: a user whose ACL forbids the channel, or junk under the
-- queue keys, still releases (waiters then fall back to polling).
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local pick = '*'
  for _ = 1, 8 do
    local first = redis.pcall('ZRANGE', KEYS[2], 0, 0)
    if type(first) ~= 'table' or first.err or first[1] == nil then
      break
    end
    local expiry = tonumber(redis.pcall('HGET', KEYS[3], first[1])) or 0
    if expiry > now then
      pick = first[1]
      break
    end
    -- A waiter that stopped asking (gone, or crashed): drop it.
    redis.pcall('ZREM', KEYS[2], first[1])
    redis.pcall('HDEL', KEYS[3], first[1])
  end
  if pick ~= '*' then
    redis.pcall('SET', KEYS[4], pick, 'PX', ARGV[3])
  end
  redis.pcall('PUBLISH', ARGV[2], pick)
  return 1
end
if cur == false then
  return 0
end
return -1
