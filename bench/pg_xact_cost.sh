#!/usr/bin/env bash
# What one statement costs a PostgreSQL session that holds N advisory locks: PostgreSQL ends
# every transaction with a walk over the session's lock table (LockReleaseAll), so the time of
# a trivial statement grows with the locks its session holds. The reason distlock's session
# pool spreads many locks over several sessions. Pin it (taskset -c 0) for steady figures.
# Usage: bash bench/pg_xact_cost.sh [N...]   (default: 0 1000 10000 50000)
set -euo pipefail
bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
dir="$(mktemp -d)"
port=$((20000 + RANDOM % 20000))
as_pg=()
if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; as_pg=(runuser -u postgres --); fi
cleanup() { "${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
"${as_pg[@]}" "$bin/initdb" -D "$dir/data" -U postgres >/dev/null 2>&1
"${as_pg[@]}" "$bin/pg_ctl" -D "$dir/data" -o "-p $port -k $dir -c listen_addresses='' -c max_locks_per_transaction=2048" -l "$dir/log" -w start >/dev/null
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
  us="$("${as_pg[@]}" psql -h "$dir" -p "$port" -U postgres -X -q -At -f "$script" | tail -1)"
  echo "$n advisory locks held by the session: $us µs per statement ($statements statements, each its own transaction)"
done
