#!/usr/bin/env bash
# The benchmark with its peers, in one command. Installs each peer in a folder outside the
# repository ($DISTLOCK_PEERS_DIR, default $TMPDIR/distlock-peers) — the Rust peers built with
# cargo, the Python ones in a venv from PyPI, node-redlock and redis-semaphore from npm — then
# runs distlock-bench with them, and plots the figures.
#   bench/run.sh            the full run: writes docs/benchmarks.md, docs/benchmarks.json and the
#                           plots in docs/img/
#   bench/run.sh --quick    (or any other distlock-bench options, e.g. --rounds 7): the same, into
#                           $DISTLOCK_PEERS_DIR/out/ instead of docs/
# A peer that cannot be installed is left out with a warning, or fails the run under CI.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
peers="${DISTLOCK_PEERS_DIR:-${TMPDIR:-/tmp}/distlock-peers}"
mkdir -p "$peers"
# --quick is a smoke run whose figures mean nothing: it builds everything in the dev profile,
# which reuses the test build's dependencies (a release build of the harness and of the peers
# cost CI about seven minutes).
profile=release
for arg in "$@"; do
  if [ "$arg" = --quick ]; then profile=dev; fi
done
bin_dir=release
if [ "$profile" = dev ]; then bin_dir=debug; fi
say() { echo "bench/run.sh: $*" >&2; }
# Under CI a peer that does not install fails the run: the harness must not rot unnoticed.
left_out() {
  say "warning: $1 left out"
  if [ -n "${CI:-}" ]; then exit 1; fi
}

# One peer folder: the executable `run`, and its `name` for the tables.
peer() { # dir name command...
  local dir="$peers/$1" name="$2"
  shift 2
  mkdir -p "$dir"
  printf '#!/bin/sh\nexec %s "$@"\n' "$*" > "$dir/run"
  chmod +x "$dir/run"
  echo "$name" > "$dir/name"
}

rust_peer() { # folder crate-version-label
  local src="$root/bench/peers/$1" dst="$peers/build-$1"
  mkdir -p "$dst"
  # Sources only: the peer's own target folder is kept between runs.
  cp "$src/Cargo.toml" "$dst/"
  rm -rf "$dst/src" && cp -r "$src/src" "$dst/src"
  say "building the $1 peer in $dst"
  # Its own target folder, even when CARGO_TARGET_DIR is set for the harness.
  # One target folder for both Rust peers: they share most of their dependencies.
  if (cd "$dst" && CARGO_TARGET_DIR="$peers/target" cargo build --profile "$profile" --quiet); then
    peer "$1" "$2" "$peers/target/$bin_dir/distlock-peer-$1"
  else
    left_out "the $1 peer (it did not build)"
  fi
}

rust_peer rslock "rslock 0.10"
rust_peer redlock-rs "redlock-rs 2.0"

venv="$peers/venv"
say "installing the Python peers in $venv"
if { [ -x "$venv/bin/python" ] || python3 -m venv "$venv"; } &&
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/bench/peers/python/requirements.txt"; then
  cp "$root/bench/peers/python/peer.py" "$peers/peer.py"
  peer python-redis-py "redis-py 8.1 Lock" "$venv/bin/python $peers/peer.py redis-py"
  peer python-redis-lock "python-redis-lock 4.0" "$venv/bin/python $peers/peer.py python-redis-lock"
  peer python-pottery "pottery 3.0 Redlock" "$venv/bin/python $peers/peer.py pottery"
  peer python-redis-rw-lock "redis-rw-lock 1.0 RWLock" "$venv/bin/python $peers/peer.py redis-rw-lock"
  "$venv/bin/pip" install --quiet --disable-pip-version-check matplotlib ||
    left_out "matplotlib (no plots)"
else
  left_out "the Python peers (they did not install)"
fi

node_dir="$peers/node"
say "installing node-redlock and redis-semaphore in $node_dir"
mkdir -p "$node_dir"
cp "$root/bench/peers/node/package.json" "$root/bench/peers/node/peer.js" \
  "$root/bench/peers/node/semaphore.js" "$node_dir/"
if command -v node >/dev/null && (cd "$node_dir" && npm install --silent --no-audit --no-fund >/dev/null); then
  peer node-redlock "node-redlock 5.0-beta on ioredis 5" "node $node_dir/peer.js"
  peer node-redis-semaphore "redis-semaphore 5.8 on ioredis 5" "node $node_dir/semaphore.js"
else
  left_out "node-redlock and redis-semaphore (they did not install)"
fi

cd "$root"
out="$root/docs"
if [ $# -gt 0 ]; then out="$peers/out"; fi
mkdir -p "$out/img"
cargo run --profile "$profile" --quiet -p distlock-bench -- --peers "$peers" \
  --json "$out/benchmarks.json" --report "$out/benchmarks.md" "$@"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
  "$venv/bin/python" "$root/bench/plot.py" "$out/benchmarks.json" "$out/img"
fi
say "report: $out/benchmarks.md"
