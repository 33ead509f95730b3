#!/usr/bin/env bash
# P5 on MariaDB taken apart (bench/p5maria/main.rs): the raw client's cycle in text and
# prepared form, with the fence's sequence read, and distlock's, pinned, interleaved.
# Builds the probe against this checkout's crates in a folder of its own.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="${TMPDIR:-/tmp}/distlock-p5maria"
mkdir -p "$work"
cat > "$work/Cargo.toml" <<TOML
[package]
name = "p5maria"
version = "0.0.0"
edition = "2024"
publish = false

[[bin]]
name = "p5maria"
path = "$root/bench/p5maria/main.rs"

[dependencies]
distlock-core = { path = "$root/crates/distlock-core" }
distlock-mysql = { path = "$root/crates/distlock-mysql" }
distlock-testkit = { path = "$root/crates/distlock-testkit" }
mysql_async = { version = "0.37", default-features = false, features = ["minimal-rust"] }
tokio = { version = "1", features = ["rt", "time", "macros"] }

[workspace]
TOML
cp "$root/Cargo.lock" "$work/Cargo.lock"
(cd "$work" && cargo build --release --quiet)
"$work/target/release/p5maria"
