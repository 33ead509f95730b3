-- Seeded bug `counter-fence` (test-only, in a build with `--cfg distlock_seeded_bugs`): the
-- fence helper that takes the place of fence.lua in every script. Its `next_fence` is the bare
-- counter, without fence.lua's floor (the server's clock and the fence the client saw), so a
-- server that lost the counter (a restart without persistence, a fail-over to a lagging
-- replica) gives fences again that it gave before. The fault harness must catch it (CK3).
local function fence_text(f)
  return string.format('%d', f)
end

local function next_fence(fkey, seen)
  local f = redis.pcall('ZINCRBY', fkey, 1, 'f')
  if type(f) ~= 'string' then
    return nil, (type(f) == 'table' and f.err) or 'WRONGTYPE distlock: not a sorted set'
  end
  return tonumber(f)
end
