//! A lease is its session's: the session pool renews it and hears the session's end (the
//! pool is the engine's `BatchRenew` and `Sessions`); here, why the server ended a session.

use distlock_core::engine::LostReason;
use tokio_postgres::error::SqlState;

/// Why the server ended a session, from the error the connection ended with.
pub(super) fn why_ended(e: &tokio_postgres::Error) -> LostReason {
    match e.code() {
        Some(c) if *c == SqlState::IDLE_SESSION_TIMEOUT => LostReason::Expired,
        // pg_terminate_backend, or an operator's shutdown: somebody took the lock away.
        Some(c) if *c == SqlState::ADMIN_SHUTDOWN => LostReason::Stolen,
        _ => LostReason::Unreachable,
    }
}
