-- The token check, prepended to every script that compares a lock key's value with a token:
-- `is_ours`. The scripts call it as it is (see scripts.rs).

-- Whether `cur`, a lock key's value, was written by the holder of `tok`: either the bare token
-- (older values, other tools) or '<token> <since> <owner>'. Tokens never contain spaces.
local function is_ours(cur, tok)
  return cur == tok or string.sub(cur, 1, #tok + 1) == tok .. ' '
end
