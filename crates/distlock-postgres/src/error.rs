//! Turning tokio-postgres errors into distlock's `LockError`.

use distlock_core::{ErrorKind, LockError};
use tokio_postgres::error::SqlState;

pub(crate) fn map_err(e: tokio_postgres::Error, doing: &str) -> LockError {
    if e.code() == Some(&SqlState::OUT_OF_MEMORY) {
        // "out of shared memory": the shared lock table, which every session's advisory locks
        // fill together, is full. Say which setting bounds it.
        return LockError::caused_by(
            ErrorKind::Exhausted,
            format_args!(
                "{doing} (the server's lock table is full: it holds about \
                 max_locks_per_transaction × (max_connections + max_prepared_transactions) \
                 locks for all sessions together; raise max_locks_per_transaction)"
            ),
            e,
        );
    }
    let kind = match e.code() {
        Some(c) if *c == SqlState::INVALID_PASSWORD => ErrorKind::Auth,
        Some(c) if *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION => ErrorKind::Auth,
        Some(c) if *c == SqlState::INSUFFICIENT_PRIVILEGE => ErrorKind::Auth,
        Some(c) if *c == SqlState::INVALID_CATALOG_NAME => ErrorKind::Config,
        Some(c) if *c == SqlState::INVALID_SCHEMA_NAME => ErrorKind::Config,
        Some(c) if *c == SqlState::ADMIN_SHUTDOWN || *c == SqlState::CRASH_SHUTDOWN => {
            ErrorKind::Connection
        }
        Some(c) if *c == SqlState::IDLE_SESSION_TIMEOUT => ErrorKind::Lost,
        // The server's connection slots are all taken ("sorry, too many clients already"):
        // nothing was opened, so nothing is ambiguous; a wait tries again.
        Some(c) if *c == SqlState::TOO_MANY_CONNECTIONS => ErrorKind::Exhausted,
        Some(_) => ErrorKind::Protocol,
        // No server code. TLS asked for (require, verify-*) and the server has none: a
        // deployment that does not match its configuration, never a silent downgrade.
        None if distlock_core::error_chain(&e).contains("server does not support TLS") => {
            return LockError::new(
                ErrorKind::Config,
                format!(
                    "{doing}: the server does not offer TLS, and sslmode asks for it (use \
                     sslmode=prefer to allow clear text)"
                ),
            );
        }
        // A certificate refused (ours or the server's) is an authentication
        // failure; else the connection failed or closed.
        #[cfg(feature = "tls")]
        None if distlock_tls::classify(&e).is_some() => {
            let (kind, words) =
                distlock_tls::classify(&e).unwrap_or((ErrorKind::Connection, String::new()));
            return LockError::new(kind, format!("{doing}: {words}")).with_source(e);
        }
        None if e.is_closed() => ErrorKind::Connection,
        None => {
            if e.to_string().contains("timed out") {
                ErrorKind::Timeout
            } else {
                ErrorKind::Connection
            }
        }
    };
    LockError::caused_by(kind, doing, e)
}

/// The answer to a statement within `limit`: `Timeout` when none came, or its error mapped as
/// [`map_err`] does.
pub(crate) async fn within<T>(
    limit: std::time::Duration,
    doing: &str,
    statement: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, LockError> {
    tokio::time::timeout(limit, statement)
        .await
        .map_err(|_| LockError::new(ErrorKind::Timeout, format!("{doing}: no answer")))?
        .map_err(|e| map_err(e, doing))
}
