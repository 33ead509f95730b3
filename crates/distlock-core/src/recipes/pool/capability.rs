//! The pool as an engine's `BatchRenew` and `Sessions`: an engine whose leases are its
//! sessions' (PostgreSQL's advisory locks, MySQL's named locks) returns its pool from both
//! getters, and the watchdog and the loss watcher talk to the pool.

use std::time::Duration;

use super::{RENEW_CHUNK, SessionOps, SessionPool};
use crate::engine::{BatchRenew, LeaseCheck, LeaseRef, RenewItem, SessionWatch, Sessions};
use crate::error::LockError;

#[async_trait::async_trait]
impl<O: SessionOps> BatchRenew for SessionPool<O> {
    /// One statement per session (setting its idle timeout), however many of its locks are
    /// due: a session that answers still holds every lock it took and did not let go.
    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        SessionPool::renew_many(self, items).await
    }

    /// A chunk costs a statement per session it touches, whatever its size.
    fn max_batch(&self) -> usize {
        RENEW_CHUNK
    }
}

#[async_trait::async_trait]
impl<O: SessionOps> Sessions for SessionPool<O> {
    /// The end of the session the lock is on (the server closed it, a timeout, a kill): every
    /// lock on that session hears it.
    fn session_end(&self, lease: &LeaseRef<'_>) -> SessionWatch {
        SessionPool::session_end(self, lease.token.as_str())
    }

    /// Unless the client released it at its deadline meanwhile (nobody renewed it).
    fn still_on(&self, lease: &LeaseRef<'_>, session: u64) -> bool {
        SessionPool::still_on(self, lease.token.as_str(), session)
    }

    /// The client lets it go when `ttl` has passed: a session's lock cannot move to a session
    /// of its own, and the session lives on for its other locks.
    async fn detach(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<(), LockError> {
        SessionPool::detach(self, lease.name, lease.token.as_str(), ttl);
        Ok(())
    }
}
