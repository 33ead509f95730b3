-- distlock extend: compare-and-pexpire.
-- KEYS[1] lock key; ARGV[1] token, ARGV[2] ttl in ms.
-- Returns 1 (ours, renewed), 0 (no lock), -1 (another owner's lock, untouched).
-- Uses `is_ours` (token.lua), prepended to it (see scripts.rs).
local cur = redis.call('GET', KEYS[1])
if cur == false then
  return 0
end
if is_ours(cur, ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return -1
