-- distlock release_many: a multi-name lease's release. Each name still ours is freed, or handed
-- to the first client queued for it, as release.lua does for a single name.
-- KEYS: four for each name, as acquire_many.lua's (lock key, meta hash, queue, fence counter).
-- ARGV[1] token, ARGV[2] the client's clock in ms since the epoch (shown as a next holder's
-- start).
-- Returns 1 (every name was ours), 0 (a name had no lock) or -1 (a name was another owner's,
-- left untouched); the names that were ours are released whatever it returns.
-- Uses `is_ours` (token.lua), `next_fence` (fence.lua) and `pass_on` (queue.lua), prepended to
-- it (see scripts.rs).
local tok, now, res = ARGV[1], ARGV[2], 1
for i = 1, #KEYS / 4 do
  local lock, meta, queue, fkey = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local cur = redis.call('GET', lock)
  if cur == false then
    if res == 1 then
      res = 0
    end
  elseif not is_ours(cur, tok) then
    res = -1
  else
    local first = redis.pcall('LPOP', queue)
    local handed = false
    if type(first) == 'string' then
      handed = pass_on(lock, meta, fkey, queue, '', now, first)
    end
    if not handed then
      redis.call('DEL', lock)
    end
  end
end
return res
