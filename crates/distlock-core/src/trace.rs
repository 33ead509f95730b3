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
//!
//! A wait with a budget tries a failing engine again (see `Wait::Timeout`; the facade's
//! `open_backend_within` does the same for opening it). Each such retry is an event of the
//! target `distlock::retry`, with `error` (the cause, on one line) and `attempt` (the failed
//! attempt's number), and `key` for a lock's wait: the first of a wait at WARN, every later one
//! at DEBUG. A program that shows its own progress (the `distlock` command's spinner) can take
//! these events by their target and keep them out of its log.

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

/// Logs that an attempt of a wait failed and is tried again (target `distlock::retry`, see
/// the module docs): at WARN the first time for this wait (`warned` then set), else at DEBUG.
pub(crate) fn engine_retry(
    key: &str,
    error: &crate::error::LockError,
    attempt: u32,
    warned: &mut bool,
) {
    let error = crate::error::error_chain(error);
    let key = key_field(key);
    if std::mem::replace(warned, true) {
        tracing::debug!(target: "distlock::retry", key, error, attempt,
            "the lock engine failed; trying again within the wait");
    } else {
        tracing::warn!(target: "distlock::retry", key, error, attempt,
            "the lock engine failed; trying again within the wait");
    }
}
