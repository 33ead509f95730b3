-- The token check, prepended to every script that compares a lock key's value with a token:
-- `is_ours`. scripts.rs then writes the expression it returns in place of each call, and takes
-- the function out (a function here would be a closure created at every run of the script).

-- Whether `cur`, a lock key's value, was written by the holder of `tok`: either the bare token
-- (older values, other tools) or '<token> <since> <owner>'. Tokens never contain spaces.
local function is_ours(cur, tok)
  return cur == tok or string.sub(cur, 1, #tok + 1) == tok .. ' '
end
