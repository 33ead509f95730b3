#!/usr/bin/env bash
# What one statement costs a PostgreSQL session that holds N advisory locks: PostgreSQL ends
# every transaction with a walk over the session's lock table (LockReleaseAll), so the time of
# a trivial statement grows with the locks its session holds. The reason distlock's session
# pool spreads many locks over several sessions. Pin it (taskset -c 0) for steady figures.
# Usage: bash bench/pg_xact_cost.sh [N...]   (default: 0 1000 10000 50000)
set -euo pipefail
. "$(dirname "$0")/pg_scratch.sh"
pg_scratch_start "-c max_locks_per_transaction=2048"
statements=2000
script="$dir/script.sql"
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(0 1000 10000 50000)
for n in "${sizes[@]}"; do
  {
    echo "SELECT count(pg_advisory_lock(g)) FROM generate_series(1, $n) g;"
    echo "\\o /dev/null"
    echo "SELECT extract(epoch from clock_timestamp()) AS t0 \\gset"
    for _ in $(seq "$statements"); do echo "SELECT 1;"; done
    echo "\\o"
    echo "SELECT round(((extract(epoch from clock_timestamp()) - :t0) * 1e6 / $statements)::numeric, 1) AS us;"
  } >"$script"
  us="$("${psql[@]}" -f "$script" | tail -1)"
  echo "$n advisory locks held by the session: $us µs per statement ($statements statements, each its own transaction)"
done
