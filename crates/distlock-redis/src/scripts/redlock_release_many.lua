-- distlock Redlock release_many on one master: compare-and-delete of each name.
-- KEYS: the names' lock keys; ARGV[1] token.
-- Returns 1 (every name was ours, all deleted), 0 (a name had no lock) or -1 (a name was
-- another owner's, left untouched); the names that were ours are deleted whatever it returns.
-- Uses `is_ours` (token.lua), prepended to it (see scripts.rs).
local res = 1
for i = 1, #KEYS do
  local cur = redis.call('GET', KEYS[i])
  if cur == false then
    if res == 1 then
      res = 0
    end
  elseif is_ours(cur, ARGV[1]) then
    redis.call('DEL', KEYS[i])
  else
    res = -1
  end
end
return res
