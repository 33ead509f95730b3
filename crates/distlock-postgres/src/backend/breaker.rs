//! Breaking a lock (`Breaker`): the holding session terminated, which frees every lock on it.

use distlock_core::engine::{Backend, BreakOutcome, Breaker, ErrorKind, LockError};
use distlock_core::recipes::breakable;

use super::{IN_PG_LOCKS, PgBackend, lock_id};
use crate::error::map_err;

#[distlock_core::engine::async_trait]
impl Breaker for PgBackend {
    /// Ends the holding session (`pg_terminate_backend`, waiting up to 5 s for it to go),
    /// which frees the lock, and every other lock on that session: their holders see the
    /// session end at once (lost: `Stolen`). Needs the right to signal that session (the same
    /// role, `pg_signal_backend`, or superuser).
    async fn break_once(&self, key: &str) -> Result<BreakOutcome, LockError> {
        self.terminate_holder(key).await
    }
}

impl PgBackend {
    async fn terminate_holder(&self, key: &str) -> Result<BreakOutcome, LockError> {
        const DOING: &str = "breaking a PostgreSQL advisory lock";
        let st = self.inspect(key).await?;
        if !breakable(key, &st)? {
            return Ok(BreakOutcome::Free);
        }
        let id = lock_id(key);
        // A session of its own: the holder may be a session of this very pool.
        let conn = self.take().await?;
        let rows = conn
            .client
            .query(
                &format!(
                    "SELECT pg_terminate_backend(l.pid, 5000) FROM pg_locks l \
                     WHERE l.pid <> pg_backend_pid() AND {IN_PG_LOCKS}"
                ),
                &[&id],
            )
            .await
            .map_err(|e| map_err(e, DOING))?;
        self.put_back(conn);
        match rows.first().map(|r| r.get::<_, bool>(0)) {
            None => Ok(BreakOutcome::Free),
            Some(true) => Ok(BreakOutcome::Broken(st)),
            Some(false) => Err(LockError::new(
                ErrorKind::Timeout,
                format!("{DOING}: the holding session was signalled but had not ended after 5 s"),
            )),
        }
    }
}
