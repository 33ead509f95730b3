//! A lease is its session's: the watchdog's renewals, one statement per session however many
//! of its locks are due (`BatchRenew`); the session's end, heard by every lock on it, and why
//! the server ended it; and a lease nobody renews, released by the client when its time is up
//! (`Sessions`).

use std::time::Duration;

use distlock_core::engine::{
    BatchRenew, LeaseCheck, LeaseRef, LockError, LostReason, RenewItem, SessionWatch, Sessions,
};
use tokio_postgres::error::SqlState;

use super::PgBackend;

/// Why the server ended a session, from the error the connection ended with.
pub(super) fn why_ended(e: &tokio_postgres::Error) -> LostReason {
    match e.code() {
        Some(c) if *c == SqlState::IDLE_SESSION_TIMEOUT => LostReason::Expired,
        // pg_terminate_backend, or an operator's shutdown: somebody took the lock away.
        Some(c) if *c == SqlState::ADMIN_SHUTDOWN => LostReason::Stolen,
        _ => LostReason::Unreachable,
    }
}

impl PgBackend {
    async fn renew_batch(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        self.inner.pool.renew_many(items).await
    }
}

#[distlock_core::engine::async_trait]
impl BatchRenew for PgBackend {
    /// One statement per session (setting its idle timeout), however many of its locks are
    /// due: a session that answers still holds every lock it took and did not unlock.
    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        self.renew_batch(items).await
    }

    /// See [`RENEW_CHUNK`](distlock_core::recipes::pool::RENEW_CHUNK): a chunk costs a
    /// statement per session it touches, whatever its size.
    fn max_batch(&self) -> usize {
        distlock_core::recipes::pool::RENEW_CHUNK
    }
}

#[distlock_core::engine::async_trait]
impl Sessions for PgBackend {
    /// The end of the session the lock is on (the server closed it, an idle timeout, a
    /// termination): every lock on that session hears it.
    fn session_end(&self, lease: &LeaseRef<'_>) -> SessionWatch {
        self.inner.pool.session_end(lease.token.as_str())
    }

    /// Unless the client released it at its deadline meanwhile (nobody renewed it).
    fn still_on(&self, lease: &LeaseRef<'_>, session: u64) -> bool {
        self.inner.pool.still_on(lease.token.as_str(), session)
    }

    /// The client unlocks it when `ttl` has passed: an advisory lock cannot move to a session
    /// of its own, and the session lives on for its other locks.
    async fn detach(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<(), LockError> {
        self.inner
            .pool
            .detach(lease.name, lease.token.as_str(), ttl);
        Ok(())
    }
}
