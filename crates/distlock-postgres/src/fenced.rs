//! Fenced writes to a protected row: the half of fencing that runs in the resource.

use distlock_core::{ErrorKind, LockError};
use tokio_postgres::GenericClient;
use tokio_postgres::types::ToSql;

use crate::error::map_err;

/// An `UPDATE` that only a holder with a fence at least as new as the row's may make:
///
/// ```sql
/// UPDATE <table> SET <set>, <fence_column> = $1
///  WHERE <key_column> = $2 AND <fence_column> <= $1
/// ```
///
/// `$1` is the writer's fencing token and `$2` the row's key; `set` is your assignments, with
/// your own parameters from `$3` on. The row's fence column (`bigint NOT NULL DEFAULT 0`)
/// remembers the newest token that wrote it, so a holder that lost its lock (paused past its
/// TTL, say) and writes after a newer holder did is refused, in the same statement, whatever
/// the lock engine (the token may come from Redis, etcd, ZooKeeper or PostgreSQL). Works on a
/// plain client or inside a transaction.
///
/// ```
/// # use distlock_postgres::FencedUpdate;
/// let update = FencedUpdate::new("accounts", "id", "fence", "balance = $3").unwrap();
/// assert_eq!(
///     update.sql(),
///     "UPDATE accounts SET balance = $3, fence = $1 WHERE id = $2 AND fence <= $1"
/// );
/// ```
#[derive(Clone, Debug)]
pub struct FencedUpdate {
    sql: String,
}

/// A plain SQL identifier (optionally `schema.name`): letters, digits and `_`, not starting
/// with a digit. Anything else is refused rather than quoted, so no input becomes SQL.
fn identifier(what: &str, text: &str) -> Result<(), LockError> {
    let ok = !text.is_empty()
        && text.split('.').count() <= 2
        && text.split('.').all(|part| {
            !part.is_empty()
                && part.len() <= 63
                && !part.starts_with(|c: char| c.is_ascii_digit())
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
    if ok {
        Ok(())
    } else {
        Err(LockError::new(
            ErrorKind::Config,
            format!("{what} {text:?} is not a plain SQL identifier"),
        ))
    }
}

impl FencedUpdate {
    /// The update of `set` (SQL assignments, your parameters from `$3`) on the row of `table`
    /// whose `key_column` is `$2`, fenced by `fence_column`.
    ///
    /// # Errors
    /// `Config` when a name is not a plain identifier or `set` is empty.
    pub fn new(
        table: &str,
        key_column: &str,
        fence_column: &str,
        set: &str,
    ) -> Result<Self, LockError> {
        identifier("table", table)?;
        identifier("key column", key_column)?;
        identifier("fence column", fence_column)?;
        if set.trim().is_empty() {
            return Err(LockError::new(
                ErrorKind::Config,
                "a fenced update needs assignments",
            ));
        }
        Ok(FencedUpdate {
            sql: format!(
                "UPDATE {table} SET {set}, {fence_column} = $1 \
                 WHERE {key_column} = $2 AND {fence_column} <= $1"
            ),
        })
    }

    /// The statement.
    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// Runs it for `key` with the writer's `fence` and the parameters of `set`. `Ok(true)`: the
    /// row was written; `Ok(false)`: refused, because a newer fence wrote the row (the writer's
    /// lock is stale) or no row has that key.
    ///
    /// ```no_run
    /// # use distlock_postgres::{FencedUpdate, tokio_postgres::Client};
    /// # async fn demo(
    /// #     locks: distlock_core::LockClient,
    /// #     db: Client,
    /// # ) -> Result<(), distlock_core::LockError> {
    /// let pay = FencedUpdate::new("invoices", "id", "fence", "status = $3")?;
    /// let guard = locks.acquire("invoice:42").await?;
    /// let fence = guard.fence().expect("an engine with fences");
    /// // ... work that may outlive the lease (a pause, a slow call) ...
    /// if !pay.run(&db, &42_i64, fence, &[&"paid"]).await? {
    ///     // A newer holder wrote the row: this holder's lock is stale; stop.
    /// }
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The server's error, or `Config` for a fence beyond `i64::MAX`.
    pub async fn run(
        &self,
        client: &impl GenericClient,
        key: &(dyn ToSql + Sync),
        fence: u64,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<bool, LockError> {
        let fence = i64::try_from(fence).map_err(|_| {
            LockError::new(ErrorKind::Config, format!("fence {fence} exceeds a bigint"))
        })?;
        let mut all: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(params.len() + 2);
        all.push(&fence);
        all.push(key);
        all.extend_from_slice(params);
        let n = client
            .execute(&self.sql, &all)
            .await
            .map_err(|e| map_err(e, "writing a fenced row"))?;
        if n == 0 {
            distlock_core::metrics::fence_refused("postgres");
        }
        Ok(n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_identifiers() {
        assert!(FencedUpdate::new("app.accounts", "id", "fence", "x = $3").is_ok());
        for (t, k, f) in [
            ("accounts; DROP TABLE x", "id", "fence"),
            ("accounts", "id)", "fence"),
            ("accounts", "id", "1fence"),
            ("a.b.c", "id", "fence"),
            ("", "id", "fence"),
        ] {
            let e = FencedUpdate::new(t, k, f, "x = $3").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
        }
        assert!(FencedUpdate::new("t", "id", "fence", " ").is_err());
    }
}
