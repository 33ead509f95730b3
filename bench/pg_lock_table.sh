#!/usr/bin/env bash
# How many advisory locks a PostgreSQL server with default settings holds, all in one session:
# the shared lock table (max_locks_per_transaction x (max_connections +
# max_prepared_transactions) nominal slots, plus its hash table's slack) bounds every session
# together. Usage: bash bench/pg_lock_table.sh [N...]   (default: 6400 12000 13000)
set -euo pipefail
bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
dir="$(mktemp -d)"
port=$((20000 + RANDOM % 20000))
as_pg=()
if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; as_pg=(runuser -u postgres --); fi
cleanup() { "${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
"${as_pg[@]}" "$bin/initdb" -D "$dir/data" -U postgres >/dev/null 2>&1
"${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" -o "-p $port -k $dir -c listen_addresses=''" -l "$dir/log" -w start >/dev/null
psql=("${as_pg[@]}" psql -h "$dir" -p "$port" -U postgres -X -q -At)
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
