#!/bin/bash
# What a Lua helper function costs the server, against the same check written inline: the token
# check of token.lua run 2,000,000 times in one script, (a) defined as a local function at each
# iteration, as a script that prepends token.lua does at each call (Redis runs the script's whole
# chunk at every call, so the closure is created every time), and (b) written inline, as
# scripts.rs ran it until issue 42, item 9 (now the scripts call the helper); (c) the loop
# alone. Usage: bash bench/lua_cpu.sh [ROUNDS]
#
# One redis-server pinned to CPU 0, redis-cli on CPU 1; each EVAL timed from outside (its
# round trip is negligible beside 2,000,000 iterations). Prints each round and the medians.
set -euo pipefail
ROUNDS=${1:-5}
TOKEN=$(cd "$(dirname "$0")/.." && pwd)/crates/distlock-redis/src/scripts/token.lua
CHECK=$(sed -n 's/^  return //p' "$TOKEN")
P=$(python3 -c "import socket;s=socket.socket();s.bind(('127.0.0.1',0));print(s.getsockname()[1])")
D=$(mktemp -d)
taskset -c 0 redis-server --port "$P" --bind 127.0.0.1 --save "" --appendonly no --dir "$D" \
  --daemonize no >/dev/null &
SRV=$!
trap 'kill $SRV; rm -rf "$D"' EXIT
sleep 0.5
LOOP='local n = 0
for i = 1, 2000000 do
  local cur, tok = "tok 123 owner", "tok"'
helper="$LOOP
  local function is_ours(cur, tok)
    return $CHECK
  end
  if is_ours(cur, tok) then n = n + 1 end
end
return n"
inline="$LOOP
  if ($CHECK) then n = n + 1 end
end
return n"
empty="$LOOP
  n = n + 1
end
return n"
OUT=$(mktemp)
for r in $(seq 1 "$ROUNDS"); do
  for v in helper inline empty; do
    s=$(date +%s%N)
    taskset -c 1 redis-cli -p "$P" EVAL "${!v}" 0 >/dev/null
    e=$(date +%s%N)
    ns=$(((e - s) / 2000000))
    echo "round $r $v: $ns ns an iteration"
    echo "$v $ns" >>"$OUT"
  done
done
python3 - "$OUT" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    v, ns = line.split()
    runs.setdefault(v, []).append(int(ns))
m = {v: statistics.median(r) for v, r in runs.items()}
print(f"medians: helper {m['helper']:.0f} ns, inline {m['inline']:.0f} ns, loop alone "
      f"{m['empty']:.0f} ns: the helper costs {m['helper'] - m['inline']:.0f} ns a check")
PY
rm -f "$OUT"
