//! Seeded bugs for the fault-injection harness's negative controls (test-only).
//!
//! A harness that reports "0 violations" proves something only if it catches builds that are
//! broken on purpose. Most seeded bugs are a lie that an engine tells the core (a release that
//! deletes whatever holds the lock, a renewal that says "ours" of another's lease): the test
//! kit makes those with a wrapper around a real engine (`distlock_testkit::seeded`), and the
//! library has no switch for them. The few that break the library's own algorithms (Redlock's
//! quorum and its clean-up, the floor of Redis's fence, Redis's count of the replicas that
//! acknowledged, an election's local deadline) are
//! [`SeededBug::in_library`]: in a build compiled with
//! `RUSTFLAGS="--cfg distlock_seeded_bugs"`, the one named by the environment variable
//! `DISTLOCK_SEEDED_BUG` (read once, at first use) is switched on; in every other build, [`on`]
//! is a constant `false` and the compiler removes every seeded branch.
//!
//! It is a `--cfg` flag, not a Cargo feature, on purpose (as tokio keeps loom behind
//! `--cfg loom`): Cargo unifies features across a dependency graph, so a feature could be
//! switched on for everyone by any crate in it. A `--cfg` comes only from whoever runs the
//! build: the fault harness and CI (`.ci/seeded`). Each bug breaks mutual exclusion or liveness
//! on purpose.

/// One deliberately broken behaviour.
#[doc(hidden)]
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeededBug {
    /// Redis release is a plain `DEL`, whoever holds the key.
    PlainDel,
    /// Redis renewal is an unconditional `PEXPIRE`, whoever holds the key.
    UnconditionalPexpire,
    /// The lease's validity counts from the reply, not from when the request was sent.
    ReplyTimeValidity,
    /// Lease deadlines follow the wall clock (`SystemTime`) instead of the monotonic one.
    WallClock,
    /// Redlock takes `N/2` votes as a quorum instead of `N/2 + 1`.
    HalfQuorum,
    /// A failed Redlock acquisition leaves the copies it got on the masters.
    KeepPartial,
    /// The watchdog goes on renewing a lease after it ended (lost, leaked or dropped).
    RenewAfterLoss,
    /// PostgreSQL: a dropped session is treated as still holding its lock (no loss event,
    /// renewals on the dead session succeed).
    PgSessionHeld,
    /// MySQL/MariaDB: a connection that ended is treated as still holding its locks (no loss
    /// event, renewals on the dead connection succeed).
    MysqlSessionHeld,
    /// Redis: an acquisition or renewal that no replica acknowledged (`WAIT`) is counted as
    /// done, as without `wait_replicas`.
    IgnoreWait,
    /// memcached: release deletes the item whoever holds it (no CAS).
    BlindDelete,
    /// Redis's fence is the bare counter, without the floor of the server's clock or of the
    /// fences the client saw: a restart without persistence starts it over.
    CounterFence,
    /// Redis: a reader takes its share while a writer holds the lock (the read script skips
    /// its check of the holder).
    ReaderIgnoresWriter,
    /// Redis: a semaphore admits one holder more than its permits (`held <= n`).
    PermitOverCount,
    /// An election's leader does not step down at its local deadline: `is_leading()` stays
    /// true until it resigns.
    LeaderKeepsLeading,
}

impl SeededBug {
    /// Every seeded bug, in the order the harness reports them.
    pub const ALL: [SeededBug; 15] = [
        SeededBug::PlainDel,
        SeededBug::UnconditionalPexpire,
        SeededBug::ReplyTimeValidity,
        SeededBug::WallClock,
        SeededBug::HalfQuorum,
        SeededBug::KeepPartial,
        SeededBug::RenewAfterLoss,
        SeededBug::PgSessionHeld,
        SeededBug::CounterFence,
        SeededBug::MysqlSessionHeld,
        SeededBug::IgnoreWait,
        SeededBug::BlindDelete,
        SeededBug::ReaderIgnoresWriter,
        SeededBug::PermitOverCount,
        SeededBug::LeaderKeepsLeading,
    ];

    /// The name used in `DISTLOCK_SEEDED_BUG` and in reports.
    pub fn name(self) -> &'static str {
        match self {
            SeededBug::PlainDel => "plain-del",
            SeededBug::UnconditionalPexpire => "unconditional-pexpire",
            SeededBug::ReplyTimeValidity => "reply-time-validity",
            SeededBug::WallClock => "wall-clock",
            SeededBug::HalfQuorum => "half-quorum",
            SeededBug::KeepPartial => "keep-partial",
            SeededBug::RenewAfterLoss => "renew-after-loss",
            SeededBug::PgSessionHeld => "pg-session-held",
            SeededBug::CounterFence => "counter-fence",
            SeededBug::MysqlSessionHeld => "mysql-session-held",
            SeededBug::IgnoreWait => "ignore-wait",
            SeededBug::BlindDelete => "blind-delete",
            SeededBug::ReaderIgnoresWriter => "reader-ignores-writer",
            SeededBug::PermitOverCount => "permit-over-count",
            SeededBug::LeaderKeepsLeading => "leader-keeps-leading",
        }
    }

    /// Whether the library itself makes this bug, in a build with
    /// `--cfg distlock_seeded_bugs`; the test kit's engine wrapper and the harness make the
    /// others, in any build.
    pub fn in_library(self) -> bool {
        matches!(
            self,
            SeededBug::HalfQuorum
                | SeededBug::KeepPartial
                | SeededBug::CounterFence
                | SeededBug::IgnoreWait
                | SeededBug::LeaderKeepsLeading
        )
    }

    /// The bug named by [`ENV`] in this process's environment, if any.
    pub fn from_env() -> Option<SeededBug> {
        std::env::var(ENV)
            .ok()
            .and_then(|n| SeededBug::from_name(&n))
    }

    /// The bug called `name`, if any.
    pub fn from_name(name: &str) -> Option<SeededBug> {
        SeededBug::ALL.into_iter().find(|b| b.name() == name)
    }
}

/// The environment variable that names the active seeded bug.
pub const ENV: &str = "DISTLOCK_SEEDED_BUG";

/// Whether `bug` is switched on in this process.
#[cfg(distlock_seeded_bugs)]
pub fn on(bug: SeededBug) -> bool {
    static ACTIVE: std::sync::OnceLock<Option<SeededBug>> = std::sync::OnceLock::new();
    bug.in_library() && *ACTIVE.get_or_init(SeededBug::from_env) == Some(bug)
}

/// Whether `bug` is switched on in this process: never, in a build without
/// `--cfg distlock_seeded_bugs`.
#[cfg(not(distlock_seeded_bugs))]
#[inline(always)]
pub fn on(_bug: SeededBug) -> bool {
    false
}

/// Whether this build can switch seeded bugs on at all.
pub const fn available() -> bool {
    cfg!(distlock_seeded_bugs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_nothing_is_on_by_default() {
        for b in SeededBug::ALL {
            assert_eq!(SeededBug::from_name(b.name()), Some(b));
            if !available() {
                assert!(!on(b));
            }
        }
        assert_eq!(SeededBug::from_name("no-such-bug"), None);
    }
}
