//! Metrics through the [`metrics`](https://docs.rs/metrics) facade, with the feature
//! `metrics`: whatever recorder the application installs (Prometheus, StatsD, OpenTelemetry)
//! receives them; without one they cost a relaxed atomic load each. Without the feature every
//! function here is empty.
//!
//! | name | type | labels |
//! |---|---|---|
//! | `distlock_acquire_duration_seconds` | histogram | `engine`, `kind`, `outcome` (`acquired`, `busy`, `timeout`, `error`) |
//! | `distlock_wait_duration_seconds` | histogram | `engine`, `kind`: the acquisitions that found the lock busy first |
//! | `distlock_locks_held` | gauge | `engine`, `kind` |
//! | `distlock_lost_total` | counter | `engine`, `reason` (`expired`, `stolen`, `unreachable`) |
//! | `distlock_renew_failures_total` | counter | `engine` |
//! | `distlock_handoffs_total` | counter | `engine`, `where` (`local`: to a task of this client; `server`: the engine passed the lock to a waiting client) |
//! | `distlock_fence_refusals_total` | counter | `engine`: writes the fenced-write helpers refused for a stale fence |
//!
//! Install the recorder before the first lock is taken: the handles of the busiest series are
//! resolved once, at their first use, and one resolved before a recorder exists records
//! nowhere.
//!
//! Lock names are not labels by default (one series per name would grow without bound). A
//! bounded set of names can be given with [`label_keys`]: those get a `key` label with their
//! name, every other name `key="_other"`.

use std::time::Duration;

use crate::engine::{LeaseKind, LostReason};

/// Names that get a `key` label (see the module's doc). Replaces the set given before; an
/// empty set turns the label off. Without the feature `metrics` it does nothing.
pub fn label_keys<I, S>(keys: I)
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    #[cfg(feature = "metrics")]
    on::set_keys(keys.into_iter().map(Into::into).collect());
    #[cfg(not(feature = "metrics"))]
    drop(keys);
}

/// Measures an acquire's time, when the metrics are on (nothing otherwise).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timer {
    #[cfg(feature = "metrics")]
    started: std::time::Instant,
}

impl Timer {
    pub(crate) fn start() -> Self {
        Timer {
            #[cfg(feature = "metrics")]
            started: std::time::Instant::now(),
        }
    }

    /// The time since [`start`](Self::start); zero without the metrics.
    pub(crate) fn elapsed(&self) -> Duration {
        #[cfg(feature = "metrics")]
        return self.started.elapsed();
        #[cfg(not(feature = "metrics"))]
        Duration::ZERO
    }
}

/// The `outcome` label of an acquire's result: `acquired`, or why not.
pub(crate) fn outcome<T>(r: &Result<T, crate::LockError>) -> &'static str {
    match r {
        Ok(_) => "acquired",
        Err(e) => match e.kind() {
            crate::ErrorKind::Busy => "busy",
            crate::ErrorKind::Timeout => "timeout",
            _ => "error",
        },
    }
}

/// A kind's label.
fn kind(kind: LeaseKind) -> &'static str {
    match kind {
        LeaseKind::Exclusive => "exclusive",
        LeaseKind::Shared => "shared",
        _ => "permit",
    }
}

/// A loss reason's label.
fn reason(reason: LostReason) -> &'static str {
    match reason {
        LostReason::Expired => "expired",
        LostReason::Stolen => "stolen",
        LostReason::Unreachable => "unreachable",
    }
}

/// An acquire (`acquire`, `try_acquire` or a campaign) ended with `outcome` after `took`.
pub(crate) fn acquire(
    engine: &'static str,
    k: LeaseKind,
    key: &str,
    outcome: &'static str,
    took: Duration,
) {
    #[cfg(feature = "metrics")]
    on::acquire(engine, kind(k), key, outcome, took);
    #[cfg(not(feature = "metrics"))]
    let _ = (engine, kind(k), key, outcome, took);
}

/// An acquisition that found the lock busy first got it after waiting `waited`.
pub(crate) fn waited(engine: &'static str, k: LeaseKind, key: &str, waited: Duration) {
    #[cfg(feature = "metrics")]
    on::waited(engine, kind(k), key, waited);
    #[cfg(not(feature = "metrics"))]
    let _ = (engine, kind(k), key, waited);
}

/// A lease began (`+1`) or ended (`-1`).
pub(crate) fn held(engine: &'static str, k: LeaseKind, change: f64) {
    #[cfg(feature = "metrics")]
    on::HELD.with(
        (engine, kind(k), ""),
        |g| g.increment(change),
        || ::metrics::gauge!("distlock_locks_held", "engine" => engine, "kind" => kind(k)),
    );
    #[cfg(not(feature = "metrics"))]
    let _ = (engine, kind(k), change);
}

/// A lease was lost.
pub(crate) fn lost(engine: &'static str, why: LostReason) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("distlock_lost_total", "engine" => engine, "reason" => reason(why))
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (engine, reason(why));
}

/// A renewal failed (the engine did not answer, or answered with an error).
pub(crate) fn renew_failed(engine: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("distlock_renew_failures_total", "engine" => engine).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = engine;
}

/// A lock passed to the next waiter without a release: to a task of this client (`local`),
/// or by the engine to a waiting client (`server`).
pub fn handoff(engine: &'static str, place: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("distlock_handoffs_total", "engine" => engine, "where" => place)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (engine, place);
}

/// A fenced-write helper refused a write whose fence was older than one the resource saw.
pub fn fence_refused(engine: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("distlock_fence_refusals_total", "engine" => engine).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = engine;
}

#[cfg(feature = "metrics")]
mod on {
    use std::collections::HashSet;
    use std::sync::RwLock;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use ::metrics::{Gauge, Histogram, SharedString, histogram};

    /// Handles by their static labels, resolved at first use: the macros build and look up
    /// their key at every call, which cost the uncontended cycle about 0.4 µs each (P9).
    pub(super) struct Handles<T> {
        entries: RwLock<Vec<(Labels, T)>>,
    }

    /// A series' static labels (engine, kind, and the outcome or `""`).
    type Labels = (&'static str, &'static str, &'static str);

    impl<T> Handles<T> {
        const fn new() -> Self {
            Handles {
                entries: RwLock::new(Vec::new()),
            }
        }

        /// Runs `f` on the handle of `labels`, made by `make` the first time.
        pub(super) fn with(&self, labels: Labels, f: impl FnOnce(&T), make: impl FnOnce() -> T) {
            {
                let entries = self
                    .entries
                    .read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some((_, h)) = entries.iter().find(|(l, _)| *l == labels) {
                    return f(h);
                }
            }
            let mut entries = self
                .entries
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !entries.iter().any(|(l, _)| *l == labels) {
                entries.push((labels, make()));
            }
            if let Some((_, h)) = entries.iter().find(|(l, _)| *l == labels) {
                f(h);
            }
        }
    }

    pub(super) static HELD: Handles<Gauge> = Handles::new();
    static ACQUIRE: Handles<Histogram> = Handles::new();

    /// Whether any name gets a `key` label (checked before the lock is taken).
    static LABELLED: AtomicBool = AtomicBool::new(false);
    static KEYS: RwLock<Option<HashSet<String>>> = RwLock::new(None);

    pub(super) fn set_keys(keys: HashSet<String>) {
        let mut set = KEYS
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        LABELLED.store(!keys.is_empty(), Ordering::Relaxed);
        *set = Some(keys).filter(|k| !k.is_empty());
    }

    /// The `key` label of `key`, when names are labelled.
    fn key_label(key: &str) -> Option<SharedString> {
        if !LABELLED.load(Ordering::Relaxed) {
            return None;
        }
        let set = KEYS
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Some(match set.as_ref() {
            Some(s) if s.contains(key) => SharedString::from(key.to_owned()),
            _ => SharedString::const_str("_other"),
        })
    }

    pub(super) fn acquire(
        engine: &'static str,
        kind: &'static str,
        key: &str,
        outcome: &'static str,
        took: Duration,
    ) {
        match key_label(key) {
            Some(k) => histogram!("distlock_acquire_duration_seconds",
                "engine" => engine, "kind" => kind, "outcome" => outcome, "key" => k)
            .record(took),
            None => ACQUIRE.with(
                (engine, kind, outcome),
                |h| h.record(took),
                || {
                    histogram!("distlock_acquire_duration_seconds",
                        "engine" => engine, "kind" => kind, "outcome" => outcome)
                },
            ),
        }
    }

    pub(super) fn waited(engine: &'static str, kind: &'static str, key: &str, waited: Duration) {
        match key_label(key) {
            Some(k) => histogram!("distlock_wait_duration_seconds",
                "engine" => engine, "kind" => kind, "key" => k)
            .record(waited),
            None => histogram!("distlock_wait_duration_seconds",
                "engine" => engine, "kind" => kind)
            .record(waited),
        }
    }
}
