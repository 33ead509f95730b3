#!/usr/bin/env bash
# What the arrival-order check costs a PostgreSQL acquire, on the server: the try-lock and
# unlock of 200,000 ids in a PL/pgSQL loop, bare and behind the check on distlock_waiters
# (empty, as when nobody waits, and with 1,000 live tickets of other locks), interleaved
# rounds, medians. Also what the release's check for waiters to notify costs (the unlock
# evaluating it as its statement does: see crates/distlock-postgres/src/backend/listen.rs). The server is pinned to CPU 0. Usage: bash bench/pg_order_cost.sh [ROUNDS]
set -euo pipefail
rounds="${1:-5}"
. "$(dirname "$0")/pg_scratch.sh"
PG_SCRATCH_PIN=0 pg_scratch_start
"${psql[@]}" -c "CREATE UNLOGGED TABLE distlock_waiters (lock_id bigint NOT NULL,
  seq bigint GENERATED ALWAYS AS IDENTITY, kind smallint NOT NULL, until timestamptz NOT NULL,
  PRIMARY KEY (lock_id, seq))"
n=200000
time_loop() { # $1: the condition that gates the try-lock
  "${psql[@]}" -c "DO \$\$ DECLARE t0 timestamptz := clock_timestamp(); BEGIN
    FOR i IN 1..$n LOOP
      PERFORM CASE WHEN $1 THEN NULL WHEN pg_try_advisory_lock(i) THEN pg_advisory_unlock(i) END;
    END LOOP;
    RAISE NOTICE '%', extract(epoch FROM clock_timestamp() - t0) * 1e6 / $n;
  END \$\$" 2>&1 | sed 's/.*NOTICE: *//'
}
notify="CASE WHEN EXISTS (SELECT 1 FROM distlock_waiters w WHERE w.lock_id = i AND w.until > now() - interval '1 minute') THEN pg_notify('distlock:' || i::text, '') END"
release_loop() { # $1: what the unlock also evaluates
  "${psql[@]}" -c "DO \$\$ DECLARE t0 timestamptz := clock_timestamp(); BEGIN
    FOR i IN 1..$n LOOP
      PERFORM pg_try_advisory_lock(i); PERFORM pg_advisory_unlock(i), $1;
    END LOOP;
    RAISE NOTICE '%', extract(epoch FROM clock_timestamp() - t0) * 1e6 / $n;
  END \$\$" 2>&1 | sed 's/.*NOTICE: *//'
}
check="EXISTS (SELECT 1 FROM distlock_waiters w WHERE w.lock_id = i AND w.until > now() AND (NULL::bigint IS NULL OR w.seq < NULL::bigint))"
bare=(); empty=(); busy=(); rbare=(); rnotify=()
for r in $(seq "$rounds"); do
  bare+=("$(time_loop false)")
  empty+=("$(time_loop "$check")")
  rbare+=("$(release_loop NULL)")
  rnotify+=("$(release_loop "$notify")")
done
"${psql[@]}" -c "INSERT INTO distlock_waiters (lock_id, kind, until)
  SELECT -g, 0, now() + interval '1 hour' FROM generate_series(1, 1000) g; ANALYZE distlock_waiters"
for r in $(seq "$rounds"); do busy+=("$(time_loop "$check")"); done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {printf "%.2f\n", a[int((NR+1)/2)]}'; }
echo "PostgreSQL $("${psql[@]}" -c 'SHOW server_version'), server pinned to CPU 0, $rounds rounds of $n, medians, µs per try-lock + unlock:"
echo "  bare:                          $(median "${bare[@]}")"
echo "  behind the check (no tickets): $(median "${empty[@]}")"
echo "  behind the check (1,000 other locks' tickets): $(median "${busy[@]}")"
echo "  the unlock alone:              $(median "${rbare[@]}")"
echo "  the unlock checking for waiters to notify (none): $(median "${rnotify[@]}")"
