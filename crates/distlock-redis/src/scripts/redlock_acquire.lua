-- distlock Redlock acquire on one master, for a resent or waiting attempt (a first attempt is a
-- plain SET NX PX). KEYS[1] lock key; ARGV[1] token, ARGV[2] value, ARGV[3] ttl ms.
-- Returns 1 when the lock is ours here (newly set, or already ours: re-armed), {0, pttl} when
-- another owner holds it.
-- Uses `is_ours` (token.lua), prepended to it (see scripts.rs).
local cur = redis.call('GET', KEYS[1])
if cur == false then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if is_ours(cur, ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return {0, redis.call('PTTL', KEYS[1])}
