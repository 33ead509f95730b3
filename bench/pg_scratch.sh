# Sourced by the PostgreSQL probes (bench/pg_*.sh): a throw-away server in a temporary folder
# on a random port, stopped and removed on exit.
#
# pg_scratch_start [SETTINGS...]: SETTINGS go to the server (e.g. "-c max_locks_per_transaction=2048");
# with PG_SCRATCH_PIN=N the server runs on CPU N. Sets $dir, $port and the psql command array.
pg_scratch_start() {
  local bin
  bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
  dir="$(mktemp -d)"
  port=$((20000 + RANDOM % 20000))
  as_pg=()
  if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; as_pg=(runuser -u postgres --); fi
  pg_ctl="$bin/pg_ctl"
  trap '"${as_pg[@]}" "$pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
  "${as_pg[@]}" "$bin/initdb" -D "$dir/data" -U postgres >/dev/null 2>&1
  local pin=()
  if [ -n "${PG_SCRATCH_PIN:-}" ]; then pin=(taskset -c "$PG_SCRATCH_PIN"); fi
  "${as_pg[@]}" "${pin[@]}" "$pg_ctl" -D "$dir/data" -o "-p $port -k $dir -c listen_addresses='' $*" \
    -l "$dir/log" -w start >/dev/null
  psql=("${as_pg[@]}" psql -h "$dir" -p "$port" -U postgres -X -q -At)
}
