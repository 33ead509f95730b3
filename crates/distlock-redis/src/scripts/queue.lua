-- Helpers of the waiting clients' queue, prepended to the scripts that use them (see
-- scripts.rs): `tell` and `pass_on`. `pass_on` calls `next_fence` (fence.lua), which goes
-- before this file.
--
-- The queue of waiting clients is a list (KEYS[3] of the scripts that use it), in order of
-- arrival. Each element is one client's registration:
-- '<wake channel> <ttl ms> <seq> <token> <owner>', what a release writes when it hands the lock
-- to that client, and where it tells it. A client is live while it listens on its wake channel: a release that finds
-- nobody listening there (PUBLISH reaches no one: the process is gone) skips it. An empty list
-- is deleted by Redis itself; nothing else here expires.

-- Tells the client registered on `chan`; returns how many listeners heard it. A channel that
-- starts with the byte 0x01 is a sharded one (Redis Cluster, where a classic PUBLISH is
-- broadcast to every node and counts only this node's listeners): the rest of its name carries
-- the lock's hash tag, and SPUBLISH reaches the listeners on this slot's node.
local function tell(chan, msg)
  if string.byte(chan, 1) == 1 then
    return redis.pcall('SPUBLISH', string.sub(chan, 2), msg)
  end
  return redis.pcall('PUBLISH', chan, msg)
end

-- Hands the lock (ours, being released, or handed to us and unused) to the first live waiting
-- client other than the one listening on `self_chan`, which it takes out of the queue (`first`,
-- if not nil, is the queue's first element, already taken out by the caller) (Lua:
-- returns two booleans: handed over, and whether an element of `self_chan` was met and dropped
-- on the way).
-- A writer (or a mutex's waiter) gets the lock written with the token, owner and TTL it
-- registered (`now`, the releasing client's clock in ms, shown as the start), and a new fence
-- (taken while the lock is being written, so fences still order holders; see fence.lua). It is
-- told on its own channel, so no other client wakes up: '\t<fence> <seq> <token> <lock key>'.
-- If the fence counter is not a sorted set, the lock is freed instead and the waiter woken
-- with the bare lock key, to try itself (and get the error).
-- A reader at the head is let in with every reader right behind it, up to the next writer,
-- which stays at the head: readers and writers are served in arrival order. Each is told by
-- its token, '\n<token> <lock key>' (as a semaphore's waiters are), and its next attempt finds
-- its share. Not with the bare lock key: that says the client's registration left the queue,
-- and a writer of the same client, still queued behind the readers, would then queue its
-- token a second time (a later release hands the lock to that copy, which nobody takes).
-- `only_readers` (a writer turned reader, see downgrade.lua) lets in the readers at the head
-- and never a writer.
-- Every call after the lock may be written uses pcall: junk under the queue key, or an ACL
-- without the channel, never undoes a release (waiters then fall back to their capped sleep).
local function pass_on(lock, meta, fkey, queue, self_chan, now, first, only_readers)
  local met_self = false
  local readers = 0
  for _ = 1, 16 do
    local e = first
    first = nil
    if not e and (readers > 0 or only_readers) then
      -- After readers, only readers: a writer stays at the head.
      local head = redis.pcall('LINDEX', queue, 0)
      if type(head) ~= 'string' or not string.find(head, '^[^ ]+ %d+ %d+ [^ ]+ ~r ') then
        return true, met_self
      end
    end
    e = e or redis.pcall('LPOP', queue)
    if type(e) ~= 'string' then
      return readers > 0, met_self
    end
    local chan, ttl, seq, tok, owner = string.match(e, '^([^ ]+) (%d+) (%d+) ([^ ]+) (.*)$')
    if chan == self_chan then
      met_self = true
    elseif chan and string.sub(owner, 1, 3) == '~r ' then
      -- A reader (its owner field starts with '~r '): its share of the lock, on the server's
      -- clock; the lock key holds the readers' marker, which lives as long as the longest
      -- share. (Written here, not as a helper: every function defined in a script is made
      -- anew at each call, releases included.)
      local heard = tell(chan, '\n' .. tok .. ' ' .. lock)
      if type(heard) == 'number' and heard > 0 then
        local t = redis.call('TIME')
        local snow = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        redis.call('ZADD', lock .. ':readers', snow + tonumber(ttl), tok)
        redis.call('HSET', meta, 'r:' .. tok, tonumber(redis.call('ZSCORE', fkey, 'f')) or 0,
          'o:' .. tok, tok .. ' ' .. now .. ' ' .. string.sub(owner, 4))
        if redis.call('GET', lock) ~= '~readers' then
          redis.call('SET', lock, '~readers', 'PX', ttl)
        elseif redis.call('PTTL', lock) < tonumber(ttl) then
          redis.call('PEXPIRE', lock, ttl)
        end
        readers = readers + 1
      end
    elseif chan and readers > 0 then
      -- (Not reached: the head was a reader.) Back to the head.
      redis.pcall('LPUSH', queue, e)
      return true, met_self
    elseif chan then
      local fence = next_fence(fkey, 0)
      if not fence then
        redis.call('DEL', lock)
        tell(chan, lock)
        return true, met_self
      end
      local heard = tell(chan,
        '\t' .. string.format('%d', fence) .. ' ' .. seq .. ' ' .. tok .. ' ' .. lock)
      if type(heard) == 'number' and heard > 0 then
        redis.call('SET', lock, tok .. ' ' .. now .. ' ' .. owner, 'PX', ttl)
        redis.pcall('HSET', meta, 'token', tok, 'holder_fence', fence_text(fence))
        return true, met_self
      end
      -- Nobody listens on its channel: that client is gone. Its fence number is burnt.
    end
  end
  return readers > 0, met_self
end
