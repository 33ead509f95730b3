-- distlock relabel: a new label for our lock's holder (an election's leader publishing a new
-- value), keeping the lock: its token, its start, its fence and its deadline stay.
-- KEYS[1] lock key; ARGV[1] token, ARGV[2] the new label.
-- Returns 1 (ours, relabelled), 0 (no lock), -1 (another owner's lock, untouched).
-- Uses `is_ours` (token.lua), prepended to it (see scripts.rs).
local cur = redis.call('GET', KEYS[1])
if cur == false then
  return 0
end
if not is_ours(cur, ARGV[1]) then
  return -1
end
-- The start the holder value has ('<token> <since> <owner>'), or now for a bare token.
local since = string.match(cur, '^[^ ]+ (%d+) ')
if not since then
  local t = redis.call('TIME')
  since = t[1] .. string.sub(string.rep('0', 6 - #t[2]) .. t[2], 1, 3)
end
local left = redis.call('PTTL', KEYS[1])
local value = ARGV[1] .. ' ' .. since .. ' ' .. ARGV[2]
if left > 0 then
  redis.call('SET', KEYS[1], value, 'PX', left)
else
  redis.call('SET', KEYS[1], value)
end
return 1
