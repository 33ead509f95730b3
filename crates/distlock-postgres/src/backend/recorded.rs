//! Holders that `status` must name exactly, with their own fence: an election's leader, whose
//! fence is its epoch. A session's label in `application_name` is the session's, shared by
//! every lock on it and cut to 63 bytes; such a holder also writes a row of the `UNLOGGED`
//! table `distlock_holders`, `(lock_id, pid, backend_start, fence, holder)`, from its own
//! session once the lock is ours. A row names the holder only while that very session (its
//! pid and start time) holds the lock, and the holder's release deletes it, so a row left by a
//! holder that is gone never describes the next one.

use distlock_core::engine::{AcquireRequest, ErrorKind, LeaseCheck, LeaseRef, LockError, Relabel};
use distlock_core::recipes::HolderValue;

use super::{PgBackend, lock_id};
use crate::error::{map_err, within};

/// The table's definition.
pub(super) fn holders_ddl(schema: &str) -> String {
    format!(
        "CREATE UNLOGGED TABLE IF NOT EXISTS {schema}.distlock_holders ( \
           lock_id bigint PRIMARY KEY, \
           pid integer NOT NULL, \
           backend_start timestamptz NOT NULL, \
           fence bigint NOT NULL, \
           holder text NOT NULL)"
    )
}

/// The columns the status statement reads for the holding session `l` (pg_locks) and `a`
/// (pg_stat_activity) of the lock `$1`: the recorded fence and holder value, when that session
/// wrote them.
pub(super) fn status_join(schema: &str) -> String {
    format!(
        "LEFT JOIN {schema}.distlock_holders h ON h.lock_id = $1::bigint AND h.pid = l.pid \
           AND h.backend_start = a.backend_start"
    )
}

/// The recorded holders of this client, by token: the lock id and fence their row has.
pub(super) type LeaderRows = distlock_core::recipes::holders::HolderRows<(i64, i64)>;

impl PgBackend {
    /// Writes the row of the holder `req` just acquired with `fence`, on its own session.
    ///
    /// # Errors
    /// The server's: the caller gives the lock back then.
    pub(super) async fn record(
        &self,
        req: &AcquireRequest<'_>,
        fence: u64,
    ) -> Result<(), LockError> {
        const DOING: &str = "recording a PostgreSQL lock's holder";
        let Some(lease) = self.inner.pool.held(req.name, req.token.as_str()) else {
            return Err(LockError::new(
                ErrorKind::Lost,
                format!("{DOING}: the lock's session ended"),
            ));
        };
        let (id, fence) = (lock_id(req.name), i64::try_from(fence).unwrap_or(i64::MAX));
        let holder = HolderValue::now(req.token.as_str(), req.owner).encode();
        let s = &self.config().schema;
        let sql = format!(
            "INSERT INTO {s}.distlock_holders (lock_id, pid, backend_start, fence, holder) \
             SELECT $1, pid, backend_start, $2, $3 FROM pg_stat_activity \
             WHERE pid = pg_backend_pid() \
             ON CONFLICT (lock_id) DO UPDATE SET pid = EXCLUDED.pid, \
               backend_start = EXCLUDED.backend_start, fence = EXCLUDED.fence, \
               holder = EXCLUDED.holder"
        );
        let limit = self.config().response_timeout;
        let client = &lease.session().conn().client;
        within(limit, DOING, client.execute(&sql, &[&id, &fence, &holder])).await?;
        self.inner.recorded.insert(req.token.as_str(), (id, fence));
        Ok(())
    }

    /// The fence recorded for the holder `token`, if it wrote a row.
    pub(super) fn recorded_fence(&self, token: &str) -> Option<u64> {
        self.inner
            .recorded
            .get(token)
            .and_then(|(_, f)| u64::try_from(f).ok())
    }

    /// Deletes the row of the holder `token`, if it wrote one (its lease was released). A
    /// delete that fails leaves a row that describes no later holder (see the module's doc).
    pub(super) async fn unrecord(&self, token: &str) {
        let Some((id, fence)) = self.inner.recorded.remove(token) else {
            return;
        };
        let Ok(session) = self.inner.pool.any_session().await else {
            return;
        };
        let s = &self.config().schema;
        let sql = format!("DELETE FROM {s}.distlock_holders WHERE lock_id = $1 AND fence = $2");
        let _ = tokio::time::timeout(
            self.config().response_timeout,
            session.conn().client.execute(&sql, &[&id, &fence]),
        )
        .await;
    }
}

#[distlock_core::engine::async_trait]
impl Relabel for PgBackend {
    /// The holder's row names the new label, from the lock's own session (the row still has
    /// our fence and that session's pid only while the lock is ours); its token and start stay.
    async fn relabel(&self, lease: &LeaseRef<'_>, owner: &str) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "writing a new label for a PostgreSQL lock's holder";
        let token = lease.token.as_str();
        let held = self
            .inner
            .pool
            .held(lease.name, token)
            .filter(|l| !l.session().is_over());
        let row = self.inner.recorded.get(token);
        let (Some(held), Some((id, fence))) = (held, row) else {
            if row.is_none() && self.inner.pool.held(lease.name, token).is_some() {
                return Err(LockError::new(
                    ErrorKind::Unsupported,
                    format!(
                        "{DOING}: only a recorded holder (an election's leader) has a \
                         label of its own; a session's label is its application_name"
                    ),
                ));
            }
            return Ok(LeaseCheck::Missing);
        };
        let s = &self.config().schema;
        let sql = format!(
            "UPDATE {s}.distlock_holders SET holder = split_part(holder, ' ', 1) || ' ' || \
               split_part(holder, ' ', 2) || ' ' || $3 \
             WHERE lock_id = $1 AND fence = $2 AND pid = pg_backend_pid()"
        );
        let limit = self.config().response_timeout;
        let client = &held.session().conn().client;
        let updated =
            match tokio::time::timeout(limit, client.execute(&sql, &[&id, &fence, &owner]))
                .await
                .map_err(|_| LockError::new(ErrorKind::Timeout, format!("{DOING}: no answer")))?
            {
                Ok(n) => n,
                // The lock's session ended (terminated, say): so did the lock.
                Err(_) if client.is_closed() || held.session().is_over() => {
                    return Ok(LeaseCheck::Missing);
                }
                Err(e) => return Err(map_err(e, DOING)),
            };
        Ok(if updated == 1 {
            LeaseCheck::Ours
        } else {
            LeaseCheck::Missing
        })
    }
}
