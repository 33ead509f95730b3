-- distlock extend_many: a multi-name lease's renewal, all names or none.
-- KEYS: the names' lock keys; ARGV[1] token, ARGV[2] ttl in ms.
-- Returns 1 (every name ours, all renewed), 0 (a name had no lock) or -1 (a name was another
-- owner's); with 0 or -1 nothing is renewed.
-- Uses `is_ours` (token.lua) and `values_of` (many.lua), prepended to it (see scripts.rs).
local res = 1
local curs = values_of(1, 1)
for i = 1, #KEYS do
  local cur = curs[i]
  if cur == false then
    if res == 1 then
      res = 0
    end
  elseif not is_ours(cur, ARGV[1]) then
    res = -1
  end
end
if res == 1 then
  for i = 1, #KEYS do
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
  end
end
return res
