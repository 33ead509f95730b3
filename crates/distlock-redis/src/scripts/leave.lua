-- distlock leave: this client has nobody waiting for the lock any more. Leave the queue, and
-- pass on a lock a release handed to us meanwhile that none of our tasks will use.
-- KEYS[1] lock key, KEYS[2] meta hash, KEYS[3] the queue of waiting clients (see queue.lua),
-- KEYS[4] the fence counter (see fence.lua)
-- ARGV[1] our wake channel, ARGV[2] the token the lock was handed to ('' if none), ARGV[3] the
-- client's clock in ms since the epoch (shown as the start of the next holder, if any),
-- ARGV[4] '1' when only our exclusive waiters leave (our readers, whose owner field starts
-- with '~r ', keep their places), '' when all of ours do
-- Returns 0 (nothing to pass on), 1 (the lock freed), 2 (handed to the next client).
-- Uses `is_ours` (token.lua), and `pass_on` (queue.lua) with the `next_fence` it calls
-- (fence.lua), prepended to it (see scripts.rs).
local list = redis.pcall('LRANGE', KEYS[3], 0, -1)
if type(list) == 'table' and not list.err then
  local mine = ARGV[1] .. ' '
  for _, e in ipairs(list) do
    if string.sub(e, 1, #mine) == mine
      and not (ARGV[4] == '1' and string.find(e, '^[^ ]+ %d+ %d+ [^ ]+ ~r ')) then
      redis.pcall('LREM', KEYS[3], 0, e)
    end
  end
end
if ARGV[2] ~= '' then
  local cur = redis.call('GET', KEYS[1])
  if cur and is_ours(cur, ARGV[2]) then
    -- (Our readers, when they stay, are served like any other client's.)
    local self_chan = ARGV[1]
    if ARGV[4] == '1' then
      self_chan = ''
    end
    if pass_on(KEYS[1], KEYS[2], KEYS[4], KEYS[3], self_chan, ARGV[3]) then
      return 2
    end
    redis.call('DEL', KEYS[1])
    return 1
  end
end
return 0
