-- The fence helper, prepended to every script that gives a lock a new holder: `next_fence`.

-- The next fence of the lock whose fence key (a sorted set, see keys.rs) is `fkey`: its one
-- member's score raised to a floor (`ZADD GT`, which never lowers it), then one added
-- (`ZINCRBY`). The floor is the larger of the server's clock in microseconds (TIME) and `seen`,
-- the highest fence of this lock the acquiring client saw (0 when it saw none or does not say).
-- A server that lost the counter (a restart without persistence, a fail-over to a replica that
-- lagged) thus starts above every fence given before, unless its clock is behind by more than
-- the outage lasted; the client's memory covers even that for the fences it saw. The first
-- attempt of a client (a plain pipeline, no script) proposes its own clock with ZADD GT CH
-- instead, and falls back to ZINCRBY when that is not above the counter.
-- Returns the fence; or nil and the error when the counter cannot be written: WRONGTYPE when
-- the key is not a sorted set (another tool wrote there), or the server's own (READONLY on a
-- demoted master, which the client must see as such to follow the fail-over). It writes
-- nothing then: callers check it before they write the lock.
local function next_fence(fkey, seen)
  local now = redis.call('TIME')
  local floor = math.max(tonumber(now[1]) * 1000000 + tonumber(now[2]), seen)
  local added = redis.pcall('ZADD', fkey, 'GT', floor, 'f')
  if type(added) ~= 'number' then
    local why = type(added) == 'table' and added.err or ''
    if why == '' or string.sub(why, 1, 9) == 'WRONGTYPE' then
      why = 'WRONGTYPE distlock: the fence counter is not a sorted set'
    end
    return nil, why
  end
  return tonumber(redis.call('ZINCRBY', fkey, 1, 'f'))
end
