#!/usr/bin/env bash
# P5 on PostgreSQL taken apart (bench/p5pg/main.rs): the raw floor, the engine's statements
# with one part taken away at a time, and distlock's cycle.
#   bash bench/p5pg.sh time [ROUNDS] [N] [MODE...]   pinned wall clock, interleaved, medians
#   bash bench/p5pg.sh statements [N]                the statements the server ran for N
#       cycles of distlock's (pg_stat_statements), with their calls a cycle
#   bash bench/p5pg.sh count [N] [MODE...]           instructions a cycle under callgrind: the
#       server's client backends (postgres runs under callgrind; N and N/5 cycles, the
#       difference), and the client process's (the probe under callgrind, the same way).
# The server is started here as the test kit starts it (fsync=off, data in a temp dir on
# tmpfs; the engine sets synchronous_commit=on on its sessions, and so do the raw modes).
# Builds the probe against this checkout's crates in a folder of its own.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="${TMPDIR:-/tmp}/distlock-p5pg"
mkdir -p "$work"
cat > "$work/Cargo.toml" <<TOML
[package]
name = "p5pg"
version = "0.0.0"
edition = "2024"
publish = false

[[bin]]
name = "p5pg"
path = "$root/bench/p5pg/main.rs"

[dependencies]
distlock-core = { path = "$root/crates/distlock-core" }
distlock-postgres = { path = "$root/crates/distlock-postgres", default-features = false }
tokio-postgres = "0.7"
tokio = { version = "1", features = ["rt", "time", "macros"] }

[profile.release]
debug = 1

[workspace]
TOML
cp "$root/Cargo.lock" "$work/Cargo.lock"
(cd "$work" && cargo build --release --quiet)
probe="$work/target/release/p5pg"
what="${1:-time}"; shift || true
all=(floor nextval no-fence no-label no-notify no-check no-select1 engine distlock)

bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
dir="$(mktemp -d /dev/shm/p5pg.XXXXXX 2>/dev/null || mktemp -d)"
chmod 755 "$dir"
as_pg=()
# setpriv execs (runuser would stay as the parent, and not pass a signal on).
if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; as_pg=(setpriv --reuid=postgres --regid=postgres --init-groups); fi
port=$((20000 + RANDOM % 20000))
pgpid=""
stop() { if [ -n "$pgpid" ]; then kill -INT "$pgpid" 2>/dev/null || true; wait "$pgpid" 2>/dev/null || true; pgpid=""; fi; }
trap 'stop; rm -rf "$dir"' EXIT
"${as_pg[@]}" "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync --locale C >/dev/null
url="postgres://postgres@127.0.0.1:$port/postgres"
opts=(-D "$dir/data" -p "$port" -k "$dir" -c listen_addresses=127.0.0.1 -c fsync=off
      -c synchronous_commit=off -c full_page_writes=off ${P5PG_SERVER_OPTS:-})
start() { # $@: a prefix (valgrind ...)
  "${as_pg[@]}" taskset -c 0 "$@" "$bin/postgres" "${opts[@]}" >"$dir/log" 2>&1 &
  pgpid=$!
  for _ in $(seq 600); do
    "${as_pg[@]}" psql -h "$dir" -p "$port" -U postgres -X -q -At -c 'SELECT 1' >/dev/null 2>&1 && return
    sleep 0.1
  done
  cat "$dir/log" >&2; exit 1
}

case "$what" in
time)
  rounds="${1:-8}"; n="${2:-2000}"; shift 2 || true
  modes=("$@"); [ ${#modes[@]} -gt 0 ] || modes=("${all[@]}")
  start
  echo "PostgreSQL $("$bin/postgres" -V | awk '{print $3}'), server and probe pinned to CPU 0, $rounds interleaved rounds of $n cycles, medians"
  taskset -c 0 "$probe" time "$url" "$rounds" "$n" "${modes[@]}"
  ;;
statements)
  n="${1:-1000}"
  opts+=(-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track_utility=on)
  start
  psql=("${as_pg[@]}" psql -h "$dir" -p "$port" -U postgres -X -q -At)
  "${psql[@]}" -c 'CREATE EXTENSION pg_stat_statements'
  "$probe" count "$url" distlock 50 >/dev/null
  "${psql[@]}" -c 'SELECT pg_stat_statements_reset()' >/dev/null
  "$probe" count "$url" distlock "$n" >/dev/null
  echo "statements the server ran for $n cycles of distlock's (calls a cycle, the statement):"
  "${psql[@]}" -F ' | ' -c "SELECT round(calls / $n.0, 2), left(regexp_replace(query, '\s+', ' ', 'g'), 110)
    FROM pg_stat_statements WHERE calls >= $n / 2 ORDER BY calls DESC"
  ;;
count)
  n="${1:-1000}"; shift || true
  modes=("$@"); [ ${#modes[@]} -gt 0 ] || modes=("${all[@]}")
  small=$((n / 5))
  start valgrind --tool=callgrind --trace-children=no --callgrind-out-file="$dir/cg.%p"
  sum() { # $@: pids; the instructions their callgrind files counted, once they have exited
    local t=0 f
    for p in "$@"; do
      f="$dir/cg.$p"
      for _ in $(seq 300); do [ -s "$f" ] && grep -q '^totals:' "$f" && break; sleep 0.1; done
      t=$((t + $(awk '/^totals:/ {print $2}' "$f")))
    done
    echo "$t"
  }
  server() { # $1 mode, $2 cycles: the client backends' instructions
    local pids
    pids="$("$probe" count "$url" "$1" "$2" | awk '/^pids/ {$1=""; print}')"
    sum $pids
  }
  client() { # $1 mode, $2 cycles: the probe's own instructions
    valgrind --tool=callgrind --callgrind-out-file="$dir/client.out" "$probe" count "$url" "$1" "$2" \
      >/dev/null 2>&1
    awk '/^totals:/ {print $2}' "$dir/client.out"
  }
  echo "PostgreSQL $("$bin/postgres" -V | awk '{print $3}') under callgrind; instructions a cycle ($n and $small cycles, the difference)"
  echo "| cycle | server | client |"
  echo "|---|---:|---:|"
  for m in "${modes[@]}"; do
    s=$(( ($(server "$m" "$n") - $(server "$m" "$small")) / (n - small) ))
    c=$(( ($(client "$m" "$n") - $(client "$m" "$small")) / (n - small) ))
    echo "| $m | $s | $c |"
  done
  ;;
*) echo "usage: bash bench/p5pg.sh time|count ..." >&2; exit 2 ;;
esac
