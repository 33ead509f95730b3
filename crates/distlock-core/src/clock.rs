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
        if crate::seeded::on(crate::seeded::SeededBug::WallClock) {
            return wall_clock_instant();
        }
        Instant::now()
    }
}

/// Seeded bug `wall-clock`: an `Instant` that follows `SystemTime`, jumps included.
fn wall_clock_instant() -> Instant {
    use std::sync::OnceLock;
    use std::time::SystemTime;
    static BASE: OnceLock<(Instant, SystemTime)> = OnceLock::new();
    let (base, base_wall) = *BASE.get_or_init(|| (Instant::now(), SystemTime::now()));
    match SystemTime::now().duration_since(base_wall) {
        Ok(ahead) => base + ahead,
        Err(behind) => base.checked_sub(behind.duration()).unwrap_or(base),
    }
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
