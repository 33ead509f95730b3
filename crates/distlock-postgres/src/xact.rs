//! The transaction-scoped variant: `pg_advisory_xact_lock`, held until the transaction ends.

use std::time::Duration;

use distlock_core::{ErrorKind, LockError, validate_key};
use tokio_postgres::error::SqlState;

use crate::backend::{Conn, PgBackend, lock_id};
use crate::error::map_err;

/// A transaction that holds a transaction-scoped advisory lock (see [`PgBackend::xact_lock`]).
///
/// Run the protected work with [`client`](Self::client): its statements are part of the
/// transaction, so they commit or roll back together with the lock's release. There is no
/// lease and no watchdog: the lock lasts exactly as long as the transaction.
///
/// Dropping it without [`commit`](Self::commit) closes its session, which rolls the
/// transaction back and releases the lock.
pub struct XactLock {
    conn: Option<Conn>,
    backend: PgBackend,
    fence: u64,
}

impl std::fmt::Debug for XactLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XactLock")
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

impl XactLock {
    /// The session, inside the transaction: run the protected statements here.
    pub fn client(&self) -> &tokio_postgres::Client {
        &self
            .conn
            .as_ref()
            .expect("open until commit or rollback")
            .client
    }

    /// The fencing token, from the same sequence as the session locks.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Commits the work and releases the lock.
    ///
    /// # Errors
    /// The server's error when the commit fails (the work is rolled back and the lock released
    /// all the same).
    pub async fn commit(mut self) -> Result<(), LockError> {
        self.end("COMMIT").await
    }

    /// Rolls the work back and releases the lock.
    ///
    /// # Errors
    /// A connection error (the server rolls back on its own then).
    pub async fn rollback(mut self) -> Result<(), LockError> {
        self.end("ROLLBACK").await
    }

    async fn end(&mut self, how: &str) -> Result<(), LockError> {
        let conn = self.conn.take().expect("ended once");
        conn.client
            .batch_execute(how)
            .await
            .map_err(|e| map_err(e, "ending a locked transaction"))?;
        self.backend.put_back(conn);
        Ok(())
    }
}

impl PgBackend {
    /// Begins a transaction holding the transaction-scoped advisory lock of `name` (the same
    /// lock id as the session locks, so the two kinds exclude each other).
    ///
    /// `wait`: `None` does not wait (`Ok(None)` when the lock is taken); `Some(limit)` waits in
    /// the server, up to `limit` (its `lock_timeout` for this transaction).
    ///
    /// # Errors
    /// `InvalidKey` for a bad name; `Timeout` when `limit` passes; connection errors.
    pub async fn xact_lock(
        &self,
        name: &str,
        wait: Option<Duration>,
    ) -> Result<Option<XactLock>, LockError> {
        const DOING: &str = "taking a transaction-scoped advisory lock";
        validate_key(name)?;
        let id = lock_id(name);
        let conn = self.take().await?;
        let s = self.schema();
        let begin = match wait {
            None => "BEGIN".to_owned(),
            Some(limit) => {
                // lock_timeout 0 would mean forever.
                let ms = limit.as_millis().clamp(1, i32::MAX as u128);
                format!("BEGIN; SET LOCAL lock_timeout = {ms}")
            }
        };
        conn.client
            .batch_execute(&begin)
            .await
            .map_err(|e| map_err(e, DOING))?;
        let sql = match wait {
            None => format!(
                "SELECT CASE WHEN pg_try_advisory_xact_lock($1::bigint) \
                        THEN nextval('{s}.distlock_fence') END"
            ),
            Some(_) => format!(
                "SELECT nextval('{s}.distlock_fence') FROM (SELECT pg_advisory_xact_lock($1::bigint)) l"
            ),
        };
        let fence: Option<i64> = match conn.client.query_one(&sql, &[&id]).await {
            Ok(row) => row.get(0),
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                return Err(LockError::new(
                    ErrorKind::Timeout,
                    format!("{DOING}: {name:?} still taken after {wait:?}"),
                ));
            }
            Err(e) => return Err(map_err(e, DOING)),
        };
        let Some(fence) = fence else {
            conn.client
                .batch_execute("ROLLBACK")
                .await
                .map_err(|e| map_err(e, DOING))?;
            self.put_back(conn);
            return Ok(None);
        };
        Ok(Some(XactLock {
            conn: Some(conn),
            backend: self.clone(),
            fence: u64::try_from(fence).unwrap_or(0),
        }))
    }
}
