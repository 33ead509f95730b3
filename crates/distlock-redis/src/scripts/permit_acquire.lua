-- distlock permit acquire: one of N permits of a semaphore, FIFO among the clients that wait.
-- One round trip, atomic.
-- KEYS[1] to KEYS[4]: the semaphore's keys (see permits.lua); KEYS[5] the fence counter of the
-- name (see fence.lua); KEYS[6] the name's lock key (a lock there is a conflict of kinds).
-- ARGV[1] token, ARGV[2] permits, ARGV[3] ttl ms, ARGV[4] our queue member ('<token> <wake
-- channel>'; '' when we do not hear wake-ups: then we do not queue), ARGV[5] the highest fence
-- of this name the client saw (see fence.lua), ARGV[6] how long our place in the queue is kept
-- without another attempt (ms), ARGV[7] our holder value ('<token> <since> <owner>'), ARGV[8]
-- '1' when this request resends one whose reply was lost.
-- Returns {1, fence} when a permit is ours (its member in the holders' set is '<fence>
-- <ARGV[7]>'); {0, ms until the first holder's deadline (-1: no holder), queued} when not
-- (queued: this call added us to the queue); {-1, permits} when the semaphore is in use with
-- another number of permits; {-2} when a lock holds the name.
-- A permit is ours when fewer than N are held and fewer waiters are ahead of us than permits
-- are free: waiters are served in arrival order, and a first attempt (not queued) goes behind
-- every waiter.
-- Every check runs before anything is written, so an error never leaves a permit half taken.
--
-- The script is three files, in this order (see scripts.rs): this one, the common case (not a
-- resend, neither a lock nor a queue on the name, a permit free: six calls in all), which
-- decides before any helper is defined (each definition is a closure made at every call); then,
-- only when it could not decide, the helpers of permits.lua and permit_acquire_rest.lua, every
-- other case, which either returns or decides to take a permit; then the taking, at the end of
-- permit_acquire_rest.lua. Uses `next_fence` (fence.lua), prepended to it, and `find_holder`,
-- `sweep_holders`, `live_holders`, `sweep_queue`, `cover` (permits.lua) in its rest.
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local now = sec * 1000 + math.floor(usec / 1000)
local n, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
-- What the taking needs: how many others hold a permit, the size and the latest deadline the
-- meta hash has, and our place in the queue when we were queued (false otherwise).
local held, cap, known, rank = 0, nil, 0, false
local decided = false
if ARGV[8] ~= '1' then
  held = redis.call('ZCOUNT', KEYS[1], now + 1, '+inf')
  if held < n and redis.call('EXISTS', KEYS[6], KEYS[3]) == 0 then
    local meta = redis.call('HMGET', KEYS[2], 'permits', 'until')
    cap, known = tonumber(meta[1]), tonumber(meta[2]) or 0
    decided = not cap or cap == n or held == 0
  end
end
if not decided then
