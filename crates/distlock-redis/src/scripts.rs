//! The Lua scripts of the Redis engines, loaded once per engine and run by hash, and the
//! helpers that turn arguments into their text.

use std::time::Duration;

use distlock_core::seeded::{self, SeededBug};
use redis::Value;

/// The Lua scripts, hashed once per backend and run with EVALSHA (loaded on NOSCRIPT).
pub(crate) struct Scripts {
    pub(crate) acquire: redis::Script,
    pub(crate) extend: redis::Script,
    pub(crate) release: redis::Script,
    pub(crate) status: redis::Script,
}

/// The helpers (`pass_on`, `is_ours`) that the scripts share, prepended to each.
macro_rules! with_lib {
    ($file:literal) => {
        concat!(include_str!("scripts/lib.lua"), include_str!($file))
    };
}
pub(crate) use with_lib;

/// The release script (compare-and-delete, or hand-over to the next queued client).
pub(crate) const RELEASE_SCRIPT: &str = concat!(
    include_str!("scripts/release_head.lua"),
    include_str!("scripts/lib.lua"),
    include_str!("scripts/release.lua")
);

/// Seeded bug `plain-del`: release deletes the key whoever holds it.
const SEEDED_PLAIN_DEL: &str = "redis.call('DEL', KEYS[1]) return 1";
/// Seeded bug `unconditional-pexpire`: renewal extends the key whoever holds it.
const SEEDED_PEXPIRE: &str = "return redis.call('PEXPIRE', KEYS[1], ARGV[2])";

/// The compare-and-pexpire renewal (or, under the seeded bug, the unconditional one).
pub(crate) fn extend_script() -> &'static str {
    if seeded::on(SeededBug::UnconditionalPexpire) {
        SEEDED_PEXPIRE
    } else {
        include_str!("scripts/extend.lua")
    }
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            acquire: redis::Script::new(with_lib!("scripts/acquire.lua")),
            extend: redis::Script::new(extend_script()),
            release: redis::Script::new(if seeded::on(SeededBug::PlainDel) {
                SEEDED_PLAIN_DEL
            } else {
                RELEASE_SCRIPT
            }),
            status: redis::Script::new(include_str!("scripts/status.lua")),
        }
    }
}

/// A TTL as the scripts take it: whole milliseconds.
pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    // Options guarantee whole milliseconds ≥ 1 and at most a year; clamp anyway.
    (ttl.as_millis() as u64).max(1)
}

/// The wall clock in ms since the epoch (shown as a holder's start; never used for deadlines).
pub(crate) fn unix_ms() -> u64 {
    u64::try_from(distlock_core::engine::unix_ms()).unwrap_or(u64::MAX)
}

/// A reply's text, if it is a string.
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}
