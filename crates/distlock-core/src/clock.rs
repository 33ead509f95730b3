//! The monotonic clock that every lease deadline is measured on.

use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A monotonic clock. Lease deadlines are computed on it from the moment a request is **sent**.
///
/// The default is [`SystemClock`] (`Instant::now()`); tests inject a [`ManualClock`]. An
/// implementation must never go backwards.
pub trait Clock: Send + Sync + Debug + 'static {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// `std::time::Instant::now()`: the OS monotonic clock, immune to wall-clock jumps.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// An instant in 8 bytes (a `std` one takes 16): signed nanoseconds from the instant the process
/// first packed one, so an instant taken before (an injected clock, a request sent before the
/// first lease) packs too. Within about 292 years either way, [`unpack`] gives back exactly the
/// instant packed, and the order of two packed instants is theirs; past that, an instant packs
/// as the nearest end. A lease keeps its deadlines so (a client holds 100,000 leases).
pub(crate) fn pack(t: Instant) -> i64 {
    let base = pack_base();
    let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    if t >= base {
        nanos(t - base)
    } else {
        -nanos(base - t)
    }
}

/// The instant that [`pack`] made `ns` of (one that the platform cannot hold: the nearest it can
/// on the way, which only an instant never packed can ask for).
pub(crate) fn unpack(ns: i64) -> Instant {
    let base = pack_base();
    let d = Duration::from_nanos(ns.unsigned_abs());
    if ns >= 0 {
        base.checked_add(d).unwrap_or(base)
    } else {
        base.checked_sub(d).unwrap_or(base)
    }
}

fn pack_base() -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// A clock that only moves when told to, for tests of deadline arithmetic.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<Instant>,
}

impl ManualClock {
    /// A clock frozen at the current instant.
    pub fn new() -> Self {
        ManualClock {
            now: Mutex::new(Instant::now()),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        *now += by;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_instant_unpacks_to_the_same_one() {
        let now = Instant::now();
        for t in [
            now,
            now + Duration::from_nanos(1),
            now + Duration::from_secs(86_400 * 365),
            now.checked_sub(Duration::from_secs(86_400)).unwrap_or(now),
        ] {
            assert_eq!(unpack(pack(t)), t);
        }
        // Order is kept, to the nanosecond.
        assert!(pack(now) < pack(now + Duration::from_nanos(1)));
    }

    #[test]
    fn an_instant_before_the_first_one_packed_packs_below_it() {
        let base = unpack(0);
        assert_eq!(pack(base), 0);
        if let Some(before) = base.checked_sub(Duration::from_secs(3_600)) {
            assert_eq!(pack(before), -3_600_000_000_000);
            assert_eq!(unpack(pack(before)), before);
            assert!(pack(before) < pack(base));
        }
    }
}
