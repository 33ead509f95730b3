-- distlock Redlock release on one master: compare-and-delete.
-- KEYS[1] lock key; ARGV[1] token.
-- Returns 1 (ours, deleted), 0 (no lock), -1 (another owner's lock, untouched).
-- Uses `is_ours` (token.lua), prepended to it (see scripts.rs).
local cur = redis.call('GET', KEYS[1])
if cur == false then
  return 0
end
if is_ours(cur, ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return -1
