//! Several names taken together, all or none ([`MultiLock`]): the capability behind
//! `LockClient::lock_many`.
//!
//! The core hands an engine the names distinct and sorted (one canonical order for every
//! client), two or more of them, with one token for all. Each name is the same lock as a
//! single-name lease of it: a name held by a single-name lock is busy for a multi-name attempt,
//! and the other way round. An engine takes them atomically where it can (one script, one
//! transaction), or in the given order with every name it took given back when one is busy. An
//! attempt never leaves some of the names taken: a waiter holds nothing while it waits, so no
//! set of clients can deadlock on each other's names.

use std::sync::Arc;
use std::time::Duration;

use super::{AcquireMode, Clock, LeaseCheck};
use crate::error::LockError;
use crate::token::Token;

/// One attempt to take several names at once, as handed to an engine.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct AcquireMany<'a> {
    /// The names, distinct and sorted (validated by the core), two or more.
    pub names: &'a [&'a str],
    /// One token for all of them. A resend of a request whose reply was lost carries the same
    /// token.
    pub token: &'a Token,
    /// The lease to ask for, the same for every name.
    pub ttl: Duration,
    /// A label naming the holder, shown by `status` on each name.
    pub owner: &'a str,
    /// A first try, a waiter's attempt, or a resend (see [`AcquireMode`]).
    pub mode: AcquireMode,
    /// The clock the core measures lease deadlines on.
    pub clock: &'a Arc<dyn Clock>,
}

impl<'a> AcquireMany<'a> {
    /// An attempt on `names` for `token`, of `ttl`, labelled `owner`.
    pub fn new(
        names: &'a [&'a str],
        token: &'a Token,
        ttl: Duration,
        owner: &'a str,
        clock: &'a Arc<dyn Clock>,
    ) -> Self {
        AcquireMany {
            names,
            token,
            ttl,
            owner,
            mode: AcquireMode::Try,
            clock,
        }
    }

    /// The same attempt, sent as `mode` says.
    #[must_use]
    pub fn mode(mut self, mode: AcquireMode) -> Self {
        self.mode = mode;
        self
    }
}

/// What one attempt on several names found.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManyAttempt {
    /// Every name is ours, counted from when this request was sent.
    Acquired {
        /// Each name's fence, in the order of the names (`None` on an engine without fences).
        fences: Vec<Option<u64>>,
    },
    /// At least one name is held by somebody else, and none was kept.
    Busy {
        /// The place in the names of one that was busy.
        name: usize,
        /// That holder's remaining lease, when the engine knows it.
        holder_ttl: Option<Duration>,
    },
}

/// Several names taken, renewed and released as one lease.
#[async_trait::async_trait]
pub trait MultiLock: Send + Sync {
    /// Takes every name of the request for its token, or none of them. Idempotent for a
    /// repeated token: names already held with it count as taken.
    async fn acquire_all(&self, req: &AcquireMany<'_>) -> Result<ManyAttempt, LockError>;

    /// Extends every name to `ttl` from now. `Ours` only when every name still held the token;
    /// otherwise what one that did not held (`Foreign` before `Missing`), and the names still
    /// ours are left as they were.
    async fn renew_all(
        &self,
        names: &[&str],
        token: &Token,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError>;

    /// Ends every name still held by the token. `Ours` when every one was; otherwise as for
    /// [`renew_all`](Self::renew_all) (the ones still ours are released all the same).
    async fn release_all(&self, names: &[&str], token: &Token) -> Result<LeaseCheck, LockError>;
}

/// What several names' checks come to: `Ours` when all were ours, else `Foreign` if any was
/// somebody else's, else `Missing`.
pub fn combine_checks(checks: impl IntoIterator<Item = LeaseCheck>) -> LeaseCheck {
    let mut out = LeaseCheck::Ours;
    for c in checks {
        match c {
            LeaseCheck::Foreign => return LeaseCheck::Foreign,
            LeaseCheck::Missing => out = LeaseCheck::Missing,
            LeaseCheck::Ours => {}
        }
    }
    out
}

/// The character that starts a multi-name lease's key in the core and separates its names: a
/// control character, which no lock name may contain (`validate_key`), so the key is never a
/// name's.
pub(crate) const MANY_MARK: char = '\u{1e}';

/// The key the core keeps a multi-name lease under: the names, each after [`MANY_MARK`].
pub(crate) fn many_key<S: AsRef<str>>(names: &[S]) -> String {
    let mut key = String::with_capacity(names.iter().map(|n| n.as_ref().len() + 1).sum());
    for n in names {
        key.push(MANY_MARK);
        key.push_str(n.as_ref());
    }
    key
}

/// The names of a multi-name lease's key, or `None` for a single name's.
pub(crate) fn many_names(key: &str) -> Option<Vec<&str>> {
    let rest = key.strip_prefix(MANY_MARK)?;
    Some(rest.split(MANY_MARK).collect())
}

/// The names as logs and errors show them.
pub(crate) fn shown_names<S: AsRef<str>>(names: &[S]) -> String {
    let mut out = String::from("[");
    for (i, n) in names.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&format!("{:?}", n.as_ref()));
    }
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multi_name_key_is_never_a_name_and_gives_its_names_back() {
        let key = many_key(&["a", "b:{1}"]);
        assert!(crate::key::validate_key(&key).is_err());
        assert_eq!(many_names(&key), Some(vec!["a", "b:{1}"]));
        assert_eq!(many_names("a"), None);
    }

    #[test]
    fn checks_combine_to_the_worst() {
        use LeaseCheck::{Foreign, Missing, Ours};
        assert_eq!(combine_checks([Ours, Ours]), Ours);
        assert_eq!(combine_checks([Ours, Missing]), Missing);
        assert_eq!(combine_checks([Missing, Foreign, Ours]), Foreign);
    }
}
