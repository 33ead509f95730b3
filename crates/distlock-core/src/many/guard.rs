//! The guard of several names held together.

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::LockError;
use crate::guard::{LockGuard, Released};
use crate::lease::{LeaseHandle, LostReason};
use crate::token::Token;

/// Proof that we hold every name of a [`lock_many`](crate::LockClient::lock_many) request,
/// until they are released, dropped or lost. The names are one lease: renewed together by the
/// watchdog, lost together (when any one of them is), released together. Dropping the guard
/// releases them in the background, as [`LockGuard`]'s drop does.
#[must_use = "dropping the guard releases the locks at once (in the background)"]
pub struct MultiGuard {
    names: Vec<String>,
    fences: Vec<Option<u64>>,
    guard: LockGuard,
}

impl MultiGuard {
    pub(super) fn new(names: Vec<String>, fences: Vec<Option<u64>>, guard: LockGuard) -> Self {
        MultiGuard {
            names,
            fences,
            guard,
        }
    }

    /// One name's lock, held as an ordinary single-name lease.
    pub(super) fn single(names: Vec<String>, guard: LockGuard) -> Self {
        let fences = vec![guard.fence()];
        MultiGuard::new(names, fences, guard)
    }

    /// The names held, distinct and sorted: the canonical order every client takes them in.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Each name's fence, in the order of [`names`](Self::names) (`None` on an engine without
    /// fences). Each is above every earlier holder's fence of that name, whether that holder
    /// took the name alone or with others.
    pub fn fences(&self) -> &[Option<u64>] {
        &self.fences
    }

    /// The fence of `name`, if it is one of the names held and the engine gives fences.
    pub fn fence(&self, name: &str) -> Option<u64> {
        let i = self.names.binary_search_by(|n| n.as_str().cmp(name)).ok()?;
        self.fences[i]
    }

    /// The token the names are held with.
    pub fn token(&self) -> Token {
        self.guard.token()
    }

    /// Until when the names are held at the latest, as of the last renewal.
    pub fn valid_until(&self) -> Instant {
        self.guard.valid_until()
    }

    /// Whether every name is still held as far as this client knows (no I/O).
    pub fn is_held(&self) -> bool {
        self.guard.is_held()
    }

    /// A handle on the lease that outlives a borrow of the guard (its lost signal).
    pub fn handle(&self) -> LeaseHandle {
        self.guard.handle()
    }

    /// Resolves when the lease is lost: when any one of the names is found gone or taken by
    /// somebody else, or could not be renewed in time. Cancel-safe.
    pub async fn lost(&self) -> LostReason {
        self.guard.lost().await
    }

    /// Renews every name to `ttl`, counted from the moment this request is sent.
    ///
    /// # Errors
    /// As [`LockGuard::extend`]: `Lost` when any name is no longer ours.
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        self.guard.extend(ttl).await
    }

    /// Releases every name, and says whether they were all still held.
    ///
    /// # Errors
    /// The engine's errors (the names are then freed when their TTL runs out).
    pub async fn release(self) -> Result<Released, LockError> {
        self.guard.release().await
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGuard")
            .field("names", &self.names)
            .field("fences", &self.fences)
            .field("held", &self.is_held())
            .finish()
    }
}
