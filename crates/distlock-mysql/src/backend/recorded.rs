//! Holders that `status` must name exactly, with their own fence, where the fence comes from a
//! sequence (MariaDB): an election's leader, whose fence is its epoch. With a sequence, a
//! holder's label is its session's (`distlock_sessions`, shared by every lock on the session)
//! and its fence is not kept; such a holder also writes a row of `distlock_holders`, `(name,
//! conn_id, fence, holder)`, from its own session once the lock is ours. A row names the
//! holder only while that very connection holds the lock (`IS_USED_LOCK`), and the holder's
//! release deletes it, so a row left by a holder that is gone never describes the next one.
//! (With the counter table, every holder's label and fence are in `distlock_locks` already.)

use distlock_core::engine::{AcquireRequest, ErrorKind, LeaseCheck, LeaseRef, LockError, Relabel};
use distlock_core::recipes::HolderValue;

use super::{MysqlBackend, Sql, int, lit, lock_name, name_lit, on_session};
use crate::config::FenceSource;

/// The table's definition.
pub(super) const TABLE: &str = "CREATE TABLE IF NOT EXISTS distlock_holders (\
       name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY, \
       conn_id BIGINT UNSIGNED NOT NULL, fence BIGINT UNSIGNED NOT NULL, \
       holder VARCHAR(2048) NOT NULL) ENGINE=InnoDB";

/// The recorded holders of this client, by token: the lock name and fence their row has.
pub(super) type LeaderRows = distlock_core::recipes::holders::HolderRows<(String, u64)>;

impl MysqlBackend {
    /// Writes the row of the holder `req` just acquired with `fence`, on its own session.
    ///
    /// # Errors
    /// The server's: the caller gives the lock back then.
    pub(super) async fn record(
        &self,
        req: &AcquireRequest<'_>,
        fence: u64,
    ) -> Result<(), LockError> {
        const DOING: &str = "recording a MySQL lock's holder";
        let Some(lease) = self.inner.pool.held(req.name, req.token.as_str()) else {
            return Err(LockError::new(
                ErrorKind::Lost,
                format!("{DOING}: the lock's session ended"),
            ));
        };
        let name = lock_name(req.name);
        let holder = lit(&HolderValue::now(req.token.as_str(), req.owner).encode());
        let sql = format!(
            "REPLACE INTO distlock_holders (name, conn_id, fence, holder) \
             VALUES ({}, CONNECTION_ID(), {fence}, {holder})",
            name_lit(&name)
        );
        on_session(lease.session().conn(), || Sql::Text(sql), DOING).await?;
        self.inner
            .recorded
            .insert(req.token.as_str(), (name, fence));
        Ok(())
    }

    /// The fence recorded for the holder `token`, if it wrote a row.
    pub(super) fn recorded_fence(&self, token: &str) -> Option<u64> {
        self.inner.recorded.get(token).map(|(_, f)| f)
    }

    /// Deletes the row of the holder `token`, if it wrote one (its lease was released). A
    /// delete that fails leaves a row that describes no later holder (see the module's doc).
    pub(super) async fn unrecord(&self, token: &str) {
        const DOING: &str = "deleting a MySQL lock's holder record";
        let Some((name, fence)) = self.inner.recorded.remove(token) else {
            return;
        };
        let Ok(session) = self.inner.pool.any_session().await else {
            return;
        };
        let sql = format!(
            "DELETE FROM distlock_holders WHERE name = {} AND fence = {fence}",
            name_lit(&name)
        );
        let _ = on_session(session.conn(), || Sql::Text(sql), DOING).await;
    }
}

#[distlock_core::engine::async_trait]
impl Relabel for MysqlBackend {
    /// The row that names the holder takes the new label, from the lock's own connection and
    /// only while that connection holds the lock: the counter table's row (where every holder
    /// is written), or with a sequence the recorded holder's own row. Its token and start stay.
    async fn relabel(&self, lease: &LeaseRef<'_>, owner: &str) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "writing a new label for a MySQL lock's holder";
        let token = lease.token.as_str();
        let Some(held) = self
            .inner
            .pool
            .held(lease.name, token)
            .filter(|l| !l.session().is_over())
        else {
            return Ok(LeaseCheck::Missing);
        };
        let name = name_lit(&lock_name(lease.name));
        let label = format!(
            "CONCAT(SUBSTRING_INDEX(holder, ' ', 2), ' ', {})",
            lit(owner)
        );
        let update = match self.inner.pool.ops().fences {
            FenceSource::Counter => format!(
                "UPDATE distlock_locks SET holder = {label} WHERE name = {name} \
                 AND SUBSTRING_INDEX(holder, ' ', 1) = {} \
                 AND IS_USED_LOCK({name}) = CONNECTION_ID()",
                lit(token)
            ),
            FenceSource::Sequence => {
                let Some((_, fence)) = self.inner.recorded.get(token) else {
                    return Err(LockError::new(
                        ErrorKind::Unsupported,
                        format!(
                            "{DOING}: only a recorded holder (an election's leader) has a \
                             label of its own; the others share their session's"
                        ),
                    ));
                };
                format!(
                    "UPDATE distlock_holders SET holder = {label} WHERE name = {name} \
                     AND fence = {fence} AND conn_id = CONNECTION_ID() \
                     AND IS_USED_LOCK({name}) = CONNECTION_ID()"
                )
            }
        };
        let row = match on_session(
            held.session().conn(),
            || Sql::Text(format!("{update}; SELECT ROW_COUNT()")),
            DOING,
        )
        .await
        {
            Ok(row) => row,
            // The lock's connection ended (killed, say): so did the lock.
            Err(_) if held.session().is_over() => return Ok(LeaseCheck::Missing),
            Err(e) => return Err(e),
        };
        Ok(if row.as_ref().and_then(|r| int(r, 0)) == Some(1) {
            LeaseCheck::Ours
        } else {
            LeaseCheck::Missing
        })
    }
}
