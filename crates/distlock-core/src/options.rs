//! Per-acquisition options, validated when built.

use std::time::Duration;

use rand::Rng;

use crate::error::{ErrorKind, LockError};

/// The longest lease accepted (one year): beyond it a lease is a configuration mistake, and
/// millisecond arithmetic stays far from overflow.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long `acquire` waits for a busy lock.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// One attempt; a busy lock is an error of kind `Busy`.
    No,
    /// Wait until the lock is ours, however long that takes.
    Forever,
    /// Wait at most this long, then fail with kind `Timeout`.
    Timeout(Duration),
}

/// Jittered exponential back-off between attempts on a busy lock.
///
/// Attempt `n` sleeps a uniformly random time in `[min, min(max, min·2ⁿ)]` ("full jitter"), and
/// never longer than the holder's remaining lease when the engine reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
}

impl Backoff {
    /// Back-off between `min` and `max`.
    ///
    /// # Errors
    /// `Config` when `min` is zero or greater than `max`.
    pub fn new(min: Duration, max: Duration) -> Result<Self, LockError> {
        if min.is_zero() || min > max {
            return Err(LockError::new(
                ErrorKind::Config,
                format!("back-off needs 0 < min <= max (got min {min:?}, max {max:?})"),
            ));
        }
        Ok(Backoff { min, max })
    }

    /// The smallest sleep.
    pub fn min(&self) -> Duration {
        self.min
    }

    /// The largest sleep.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The sleep before attempt `attempt` (0-based), capped by `holder_ttl` when known.
    pub fn delay(&self, attempt: u32, holder_ttl: Option<Duration>) -> Duration {
        let ceiling = self
            .min
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max);
        let lo = self.min.as_micros() as u64;
        let hi = (ceiling.as_micros() as u64).max(lo);
        let pick = Duration::from_micros(rand::rng().random_range(lo..=hi));
        match holder_ttl {
            // Wake up just after the holder's lease would end; never sleep zero.
            Some(ttl) => pick.min(ttl + Duration::from_millis(1)),
            None => pick,
        }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            min: Duration::from_millis(5),
            max: Duration::from_millis(250),
        }
    }
}

/// Options of one acquisition. Build them with [`LockOptions::builder`]; every combination that
/// `build` accepts is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockOptions {
    ttl: Duration,
    wait: Wait,
    backoff: Backoff,
    drift: Option<Duration>,
    auto_renew: bool,
    renew_interval: Option<Duration>,
    acquire_retries: u32,
    events: bool,
    wake_fallback: Duration,
    max_hold: Option<Duration>,
    max_renewals: Option<u32>,
    handoff: bool,
    handoff_streak: u32,
}

/// The default cap on one sleep of a subscribed waiter ([`LockOptionsBuilder::wake_fallback`]).
pub const DEFAULT_WAKE_FALLBACK: Duration = Duration::from_secs(1);

/// The default longest run of local hand-offs before a real release
/// ([`LockOptionsBuilder::handoff_streak`]).
pub const DEFAULT_HANDOFF_STREAK: u32 = 8;

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            wait: Wait::Forever,
            backoff: Backoff::default(),
            drift: None,
            auto_renew: true,
            renew_interval: None,
            acquire_retries: 2,
            events: true,
            wake_fallback: DEFAULT_WAKE_FALLBACK,
            max_hold: None,
            max_renewals: None,
            handoff: false,
            handoff_streak: DEFAULT_HANDOFF_STREAK,
        }
    }
}

impl LockOptions {
    /// A builder starting from the defaults: 30 s lease, wait forever, 5–250 ms back-off,
    /// drift allowance 1% of the TTL + 2 ms, watchdog renewal every TTL/3, two idempotent retries
    /// of an acquire whose reply was lost.
    pub fn builder() -> LockOptionsBuilder {
        LockOptionsBuilder {
            opts: LockOptions::default(),
        }
    }

    /// A builder starting from these options, to change some of them.
    pub fn to_builder(&self) -> LockOptionsBuilder {
        LockOptionsBuilder { opts: *self }
    }

    /// The lease length asked of the engine.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The waiting policy of `acquire`.
    pub fn wait(&self) -> Wait {
        self.wait
    }

    /// The back-off between attempts.
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// The clock-drift allowance subtracted from every lease: `validity = ttl − elapsed − drift`.
    pub fn drift(&self) -> Duration {
        self.drift.unwrap_or_else(|| default_drift(self.ttl))
    }

    /// The drift allowance for a lease of `ttl` (used by `extend` with another TTL).
    pub fn drift_for(&self, ttl: Duration) -> Duration {
        self.drift.unwrap_or_else(|| default_drift(ttl)).min(ttl)
    }

    /// Whether a watchdog renews the lease while the guard lives.
    pub fn auto_renew(&self) -> bool {
        self.auto_renew
    }

    /// Time between two renewals (TTL/3 unless set).
    pub fn renew_interval(&self) -> Duration {
        self.renew_interval.unwrap_or(self.ttl / 3)
    }

    /// How many times an acquire whose outcome is unknown (timeout, broken connection) is resent
    /// with the same token.
    pub fn acquire_retries(&self) -> u32 {
        self.acquire_retries
    }

    /// Whether waiters use the engine's release events (default on). Off, they poll with
    /// jittered back-off only.
    pub fn events(&self) -> bool {
        self.events
    }

    /// The longest sleep of a waiter between two attempts while it is subscribed to release
    /// events (default 1 s). It bounds the wait when an event is missed, for example when a
    /// client in another language deletes its plain lock key and keyspace notifications are off.
    pub fn wake_fallback(&self) -> Duration {
        self.wake_fallback
    }

    /// The longest the watchdog keeps a lease alive, counted from the acquire (default: no
    /// limit). The last renewal is shortened so the lease ends at this bound.
    pub fn max_hold(&self) -> Option<Duration> {
        self.max_hold
    }

    /// The most renewals the watchdog sends for one lease (default: no limit).
    pub fn max_renewals(&self) -> Option<u32> {
        self.max_renewals
    }

    /// Whether a release hands the lease to the next waiter of this process (default off).
    pub fn handoff(&self) -> bool {
        self.handoff
    }

    /// How many hand-offs in a row before a real release (default 8).
    pub fn handoff_streak(&self) -> u32 {
        self.handoff_streak
    }

    /// The part of a lease we may rely on: `ttl − drift`, saturating at zero.
    pub fn validity(&self) -> Duration {
        self.ttl.saturating_sub(self.drift())
    }
}

/// The drift allowance of Redlock's analysis: 1% of the TTL plus 2 ms for timer granularity.
pub fn default_drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// Builder of [`LockOptions`]; see [`LockOptions::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct LockOptionsBuilder {
    opts: LockOptions,
}

impl LockOptionsBuilder {
    /// The lease length (default 30 s).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.opts.ttl = ttl;
        self
    }

    /// How long `acquire` waits (default [`Wait::Forever`]).
    pub fn wait(mut self, wait: Wait) -> Self {
        self.opts.wait = wait;
        self
    }

    /// Shorthand for `wait(Wait::Timeout(d))`.
    pub fn wait_timeout(self, d: Duration) -> Self {
        self.wait(Wait::Timeout(d))
    }

    /// Shorthand for `wait(Wait::No)`.
    pub fn no_wait(self) -> Self {
        self.wait(Wait::No)
    }

    /// The back-off between attempts on a busy lock.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.opts.backoff = backoff;
        self
    }

    /// A fixed clock-drift allowance instead of 1% of the TTL + 2 ms.
    pub fn drift(mut self, drift: Duration) -> Self {
        self.opts.drift = Some(drift);
        self
    }

    /// Turns the watchdog on (default) or off.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.opts.auto_renew = on;
        self
    }

    /// Time between renewals (default TTL/3).
    pub fn renew_interval(mut self, every: Duration) -> Self {
        self.opts.renew_interval = Some(every);
        self
    }

    /// Resends of an acquire whose reply was lost (default 2).
    pub fn acquire_retries(mut self, n: u32) -> Self {
        self.opts.acquire_retries = n;
        self
    }

    /// Use the engine's release events to wake waiters (default on); off, waiters poll with
    /// jittered back-off only.
    pub fn events(mut self, on: bool) -> Self {
        self.opts.events = on;
        self
    }

    /// The longest sleep of a subscribed waiter between two attempts (default 1 s).
    pub fn wake_fallback(mut self, cap: Duration) -> Self {
        self.opts.wake_fallback = cap;
        self
    }

    /// Stop renewing after this long since the acquire; the lease then runs out (default: no
    /// limit).
    pub fn max_hold(mut self, limit: Duration) -> Self {
        self.opts.max_hold = Some(limit);
        self
    }

    /// Stop renewing after this many renewals (default: no limit).
    pub fn max_renewals(mut self, n: u32) -> Self {
        self.opts.max_renewals = Some(n);
        self
    }

    /// Local hand-off (default off): `release` gives the lease to the next task of this client
    /// waiting for the same key, with one renewal instead of a release and a new acquire. The
    /// new holder keeps the same token and the same fence. After
    /// [`handoff_streak`](Self::handoff_streak) hand-offs in a row the lock is really released,
    /// so other processes get their turn.
    pub fn handoff(mut self, on: bool) -> Self {
        self.opts.handoff = on;
        self
    }

    /// Hand-offs in a row before a real release (default 8).
    pub fn handoff_streak(mut self, n: u32) -> Self {
        self.opts.handoff_streak = n;
        self
    }

    /// Checks and returns the options.
    ///
    /// # Errors
    /// `Config` when the TTL is zero, under 1 ms or over [`MAX_TTL`]; when the drift allowance
    /// leaves no validity; when the renew interval is zero or not shorter than the validity;
    /// when a wait timeout is zero.
    pub fn build(self) -> Result<LockOptions, LockError> {
        let o = self.opts;
        let cfg = |m: String| Err(LockError::new(ErrorKind::Config, m));
        if o.ttl < Duration::from_millis(1) {
            return cfg(format!("the TTL must be at least 1 ms (got {:?})", o.ttl));
        }
        if o.ttl > MAX_TTL {
            return cfg(format!(
                "the TTL must be at most one year (got {:?})",
                o.ttl
            ));
        }
        if !o.ttl.subsec_nanos().is_multiple_of(1_000_000) {
            return cfg(format!(
                "the TTL must be a whole number of milliseconds (got {:?})",
                o.ttl
            ));
        }
        if o.drift() >= o.ttl {
            return cfg(format!(
                "the drift allowance {:?} leaves no validity in a TTL of {:?}",
                o.drift(),
                o.ttl
            ));
        }
        if o.auto_renew && (o.renew_interval().is_zero() || o.renew_interval() >= o.validity()) {
            return cfg(format!(
                "the renew interval {:?} must be above zero and below the validity {:?}",
                o.renew_interval(),
                o.validity()
            ));
        }
        if o.wake_fallback.is_zero() {
            return cfg("the wake fallback interval must be above zero".into());
        }
        if o.max_hold.is_some_and(|d| d.is_zero()) {
            return cfg("a maximum hold time of zero: use auto_renew(false)".into());
        }
        if o.wait == Wait::Timeout(Duration::ZERO) {
            return cfg("a wait timeout of zero: use no_wait() for a single attempt".into());
        }
        Ok(o)
    }
}

/// The option setters every request type has (`ttl`, `wait`, `wait_timeout`, `no_wait`,
/// `auto_renew`, `options`), written once: a request keeps its options in a field `options`, a
/// [`LockOptionsBuilder`].
macro_rules! request_option_setters {
    () => {
        /// The lease length for this call.
        pub fn ttl(mut self, ttl: std::time::Duration) -> Self {
            self.options = self.options.ttl(ttl);
            self
        }

        /// How this call waits while the lock is busy (for several names: while any is).
        pub fn wait(mut self, wait: $crate::options::Wait) -> Self {
            self.options = self.options.wait(wait);
            self
        }

        /// Waits at most `d` for a busy lock, then fails with `Timeout`.
        pub fn wait_timeout(mut self, d: std::time::Duration) -> Self {
            self.options = self.options.wait_timeout(d);
            self
        }

        /// One attempt: a busy lock fails with `Busy`.
        pub fn no_wait(mut self) -> Self {
            self.options = self.options.no_wait();
            self
        }

        /// Whether the watchdog renews the lease while the guard lives.
        pub fn auto_renew(mut self, on: bool) -> Self {
            self.options = self.options.auto_renew(on);
            self
        }

        /// Replaces every option with `options`.
        pub fn options(mut self, options: $crate::options::LockOptions) -> Self {
            self.options = options.to_builder();
            self
        }
    };
}
pub(crate) use request_option_setters;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let o = LockOptions::builder().build().expect("defaults");
        assert_eq!(o.ttl(), Duration::from_secs(30));
        assert_eq!(o.drift(), Duration::from_millis(302));
        assert_eq!(o.renew_interval(), Duration::from_secs(10));
        assert_eq!(o.validity(), Duration::from_millis(29_698));
    }

    #[test]
    fn bad_options_are_config_errors() {
        let bad = [
            LockOptions::builder().ttl(Duration::ZERO),
            LockOptions::builder().ttl(Duration::from_micros(500)),
            LockOptions::builder().ttl(Duration::from_micros(1500)),
            LockOptions::builder().ttl(MAX_TTL + Duration::from_secs(1)),
            LockOptions::builder()
                .ttl(Duration::from_millis(100))
                .drift(Duration::from_millis(100)),
            LockOptions::builder().renew_interval(Duration::ZERO),
            LockOptions::builder()
                .ttl(Duration::from_secs(3))
                .renew_interval(Duration::from_secs(3)),
            LockOptions::builder().wait_timeout(Duration::ZERO),
            LockOptions::builder().wake_fallback(Duration::ZERO),
            LockOptions::builder().max_hold(Duration::ZERO),
        ];
        for b in bad {
            let err = b
                .clone()
                .build()
                .expect_err(&format!("{b:?} must be refused"));
            assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        }
        // Without a watchdog, the renew interval does not matter.
        assert!(
            LockOptions::builder()
                .ttl(Duration::from_millis(3))
                .auto_renew(false)
                .build()
                .is_ok()
        );
        assert!(Backoff::new(Duration::ZERO, Duration::from_millis(1)).is_err());
        assert!(Backoff::new(Duration::from_millis(2), Duration::from_millis(1)).is_err());
    }

    #[test]
    fn backoff_stays_in_bounds_and_under_holder_ttl() {
        let b = Backoff::new(Duration::from_millis(2), Duration::from_millis(40)).expect("backoff");
        for attempt in 0..40 {
            let d = b.delay(attempt, None);
            assert!(
                d >= Duration::from_millis(2) && d <= Duration::from_millis(40),
                "{d:?}"
            );
            let capped = b.delay(attempt, Some(Duration::ZERO));
            assert!(capped <= Duration::from_millis(1), "{capped:?}");
        }
    }
}
