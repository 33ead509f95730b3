-- The fence helpers, prepended to every script that gives a lock a new holder: `fence_text`
-- and `next_fence`.

-- A fence as the text a command takes. A number given to `redis.call` as it is goes through
-- the server's `%.17g` formatting (a 16-digit fence costs about a microsecond there, the
-- largest part of a multi-name script's time a name); an integer's `%d` costs next to nothing.

-- The next fence of the lock whose fence key (a sorted set, see keys.rs) is `fkey`: one past
-- the larger of its one member's score and a floor. The floor is the larger of the server's
-- clock in microseconds (TIME) and `seen`, the highest fence of this lock the acquiring client
-- saw (0 when it saw none or does not say). One past the floor is proposed with `ZADD GT CH`,
-- which never lowers the score: when it was above the score it is the fence (one call, the
-- common case: the clock moves on faster than locks change hands); when it was not, the score
-- goes up by one (`ZINCRBY`). Either way the fence is above every fence given before.
-- A server that lost the counter (a restart without persistence, a fail-over to a replica that
-- lagged) thus starts above every fence given before, unless its clock is behind by more than
-- the outage lasted; the client's memory covers even that for the fences it saw. The first
-- attempt of a client (a plain pipeline, no script) proposes its own clock the same way.
-- `time`, if given, is a TIME reply the caller took already in this script, and `us`, if given,
-- that reply in microseconds (parsed once); `us_text`, if given, is `fence_text(us + 1)` (a
-- script that takes several fences at one time formats it once).
-- Returns the fence; or nil and the error when the counter cannot be written: WRONGTYPE when
-- the key is not a sorted set (another tool wrote there), or the server's own (READONLY on a
-- demoted master, which the client must see as such to follow the fail-over). It writes
-- nothing then: callers check it before they write the lock.
local function fence_text(f)
  return string.format('%d', f)
end

local function next_fence(fkey, seen, time, us, us_text)
  if not us then
    local now = time or redis.call('TIME')
    us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  end
  local floor, text = us + 1, us_text
  if seen >= us or not text then
    floor = math.max(us, seen) + 1
    text = fence_text(floor)
  end
  local raised = redis.pcall('ZADD', fkey, 'GT', 'CH', text, 'f')
  if type(raised) ~= 'number' then
    local why = type(raised) == 'table' and raised.err or ''
    if why == '' or string.sub(why, 1, 9) == 'WRONGTYPE' then
      why = 'WRONGTYPE distlock: the fence counter is not a sorted set'
    end
    return nil, why
  end
  if raised == 1 then
    return floor
  end
  return tonumber(redis.call('ZINCRBY', fkey, 1, 'f'))
end
