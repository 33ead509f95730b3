#!/usr/bin/env bash
# The benchmark with its peers: builds each peer in a folder outside the repository
# ($DISTLOCK_PEERS_DIR, default $TMPDIR/distlock-peers), then runs distlock-bench with them.
# Arguments go to distlock-bench (for example --quick, --json out.json, --rounds 7).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
peers="${DISTLOCK_PEERS_DIR:-${TMPDIR:-/tmp}/distlock-peers}"
mkdir -p "$peers/rslock"
# Sources only: the peer's own target folder is kept between runs.
cp "$root/bench/peers/rslock/Cargo.toml" "$peers/rslock/"
rm -rf "$peers/rslock/src" && cp -r "$root/bench/peers/rslock/src" "$peers/rslock/src"
echo "building the rslock peer in $peers/rslock" >&2
(cd "$peers/rslock" && cargo build --release --quiet)
cd "$root"
exec cargo run --release --quiet -p distlock-bench -- \
  --rslock "$peers/rslock/target/release/distlock-peer-rslock" "$@"
