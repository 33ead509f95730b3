-- distlock release_many: a multi-name lease's release. Each name still ours is freed, or handed
-- to the first client queued for it, as release.lua does for a single name.
-- KEYS: four for each name: the lock key, the meta hash, the queue and the fence counter (the
-- last three for a hand-off; acquire_many.lua takes the lock key and the fence counter only).
-- ARGV[1] token, ARGV[2] the client's clock in ms since the epoch (shown as a next holder's
-- start).
-- Returns 1 (every name was ours), 0 (a name had no lock) or -1 (a name was another owner's,
-- left untouched); the names that were ours are released whatever it returns.
-- Uses `is_ours` (token.lua), `next_fence` (fence.lua), `pass_on` (queue.lua) and `values_of`
-- (many.lua), prepended to it (see scripts.rs).
local tok, now, res = ARGV[1], ARGV[2], 1
local curs = values_of(1, 4)
-- The names still ours (their places), and whether any of them has clients queued.
local ours, queues = {}, {}
for i = 1, #curs do
  local cur = curs[i]
  if cur == false then
    if res == 1 then
      res = 0
    end
  elseif not is_ours(cur, tok) then
    res = -1
  else
    ours[#ours + 1] = i
    queues[#queues + 1] = KEYS[4 * i - 1]
  end
end
local queued = 0
for from = 1, #queues, 1000 do
  queued = queued + redis.call('EXISTS', unpack(queues, from, math.min(from + 999, #queues)))
end
-- The names nobody is queued for (or whose queue had nobody left to take it) are deleted
-- together: one DEL for all of them, where one a name cost a call each.
local free = {}
for _, i in ipairs(ours) do
  local lock, meta, queue, fkey = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local handed = false
  if queued > 0 then
    local first = redis.pcall('LPOP', queue)
    if type(first) == 'string' then
      handed = pass_on(lock, meta, fkey, queue, '', now, first)
    end
  end
  if not handed then
    free[#free + 1] = lock
  end
end
for from = 1, #free, 1000 do
  redis.call('DEL', unpack(free, from, math.min(from + 999, #free)))
end
return res
