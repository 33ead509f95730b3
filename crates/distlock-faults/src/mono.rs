//! Monotonic timestamps shared by every process of a run.
//!
//! `CLOCK_MONOTONIC` is one clock for the whole machine, so the orchestrator and its workers
//! stamp events on the same time line (libfaketime is told not to touch it:
//! `FAKETIME_DONT_FAKE_MONOTONIC=1`).

use std::time::Instant;

use nix::time::{ClockId, clock_gettime};

/// Nanoseconds on `CLOCK_MONOTONIC`.
pub(crate) fn now_ns() -> i64 {
    match clock_gettime(ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => ts.tv_sec() * 1_000_000_000 + ts.tv_nsec(),
        Err(_) => 0,
    }
}

/// `at` as monotonic nanoseconds, where `now` is the same clock's reading at this moment (the
/// lock library's clock, which a seeded bug may make follow the wall clock).
pub(crate) fn instant_ns(at: Instant, now: Instant) -> i128 {
    let base = i128::from(now_ns());
    if at >= now {
        base + (at - now).as_nanos() as i128
    } else {
        base - (now - at).as_nanos() as i128
    }
}
