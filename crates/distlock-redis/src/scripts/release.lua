-- distlock release: compare-and-delete, and wake the waiters.
-- KEYS[1] lock key; ARGV[1] token, ARGV[2] the release channel.
-- Returns 1 (ours, deleted), 0 (no lock), -1 (another owner's lock, untouched).
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('DEL', KEYS[1])
  -- pcall: a user whose ACL forbids the channel still releases (waiters then poll).
  redis.pcall('PUBLISH', ARGV[2], '1')
  return 1
end
if cur == false then
  return 0
end
return -1
