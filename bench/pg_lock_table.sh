#!/usr/bin/env bash
# How many advisory locks a PostgreSQL server with default settings holds, all in one session:
# the shared lock table (max_locks_per_transaction x (max_connections +
# max_prepared_transactions) nominal slots, plus its hash table's slack) bounds every session
# together. Usage: bash bench/pg_lock_table.sh [N...]   (default: 6400 12000 13000)
set -euo pipefail
. "$(dirname "$0")/pg_scratch.sh"
pg_scratch_start
"${psql[@]}" -c "SELECT 'PostgreSQL ' || current_setting('server_version') || ': max_connections ' || current_setting('max_connections') || ', max_locks_per_transaction ' || current_setting('max_locks_per_transaction') || ', max_prepared_transactions ' || current_setting('max_prepared_transactions')"
for n in "${@:-6400 12000 13000}"; do
  for m in $n; do
    if out="$("${psql[@]}" -c "SELECT count(pg_advisory_lock(g)) FROM generate_series(1, $m) g" 2>&1)"; then
      echo "$m advisory locks in one session: held ($out)"
    else
      echo "$m advisory locks in one session: refused: $(echo "$out" | tr '\n' ' ')"
    fi
  done
done
