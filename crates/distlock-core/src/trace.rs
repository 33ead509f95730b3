//! `tracing` spans of the lock's work, so that it shows inside the caller's trace (an
//! OpenTelemetry layer exports them like any other span):
//!
//! | span | level | fields |
//! |---|---|---|
//! | `distlock.acquire` | INFO | `engine`, `key`, `kind`, `attempts`, `fence`, `outcome` (`acquired`, `busy`, `timeout`, `error`) |
//! | `distlock.attempt` | DEBUG | `engine`, `attempt` (1, 2, …): one request to the engine, inside `distlock.acquire` |
//! | `distlock.release` | INFO | `engine`, `key`, `fence`, `outcome` (`released`, `lost`, `error`) |
//! | `distlock.renew` | DEBUG | `engine`, `leases`: one batch of the watchdog's renewals (a span of its own: the watchdog is no request's) |
//!
//! A lost lease is the WARN event `lock lost`, with `key`, `fence` and `reason`. Every span's
//! target is `distlock`. [`record_keys`]`(false)` leaves the lock names out (`key` stays
//! empty).

use std::sync::atomic::{AtomicBool, Ordering};

use tracing::Span;
use tracing::field::Empty;

use crate::engine::LeaseKind;

static KEYS: AtomicBool = AtomicBool::new(true);

/// Whether spans carry the lock's name in `key` (default on). Names can be personal data or
/// unbounded; turn them off here, once, for the whole process.
pub fn record_keys(on: bool) {
    KEYS.store(on, Ordering::Relaxed);
}

fn key_field(key: &str) -> Option<&str> {
    KEYS.load(Ordering::Relaxed).then_some(key)
}

/// The span of one acquire (the request, every attempt and every wait).
pub(crate) fn acquire(engine: &'static str, key: &str, kind: LeaseKind) -> Span {
    tracing::info_span!(target: "distlock", "distlock.acquire",
        engine, key = key_field(key), kind = kind.name(),
        attempts = 1u32, fence = Empty, outcome = Empty)
}

/// Records how an acquire ended on its span.
pub(crate) fn acquired(span: &Span, outcome: &'static str, fence: Option<u64>) {
    span.record("outcome", outcome);
    if let Some(f) = fence {
        span.record("fence", f);
    }
}

/// Counts an attempt on the current acquire span (which starts at one), and makes its own
/// span.
pub(crate) fn attempt(engine: &'static str, n: u32) -> Span {
    if n > 1 {
        Span::current().record("attempts", n);
    }
    tracing::debug_span!(target: "distlock", "distlock.attempt", engine, attempt = n)
}

/// The span of a release.
pub(crate) fn release(engine: &'static str, key: &str, fence: Option<u64>) -> Span {
    tracing::info_span!(target: "distlock", "distlock.release",
        engine, key = key_field(key), fence, outcome = Empty)
}

/// The span of a batch of renewals.
pub(crate) fn renew(engine: &'static str, leases: usize) -> Span {
    tracing::debug_span!(target: "distlock", "distlock.renew", engine, leases)
}
