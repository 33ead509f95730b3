//! A lock's status: who holds the mutex of a name (`IS_USED_LOCK`, with the holder's label
//! and fence from the engine's tables), or else the holders of its semaphore (see `permits`).

use std::time::Duration;

use distlock_core::engine::{LockError, LockStatus};
use distlock_core::recipes::HolderValue;

use super::{MysqlBackend, Sql, int, lock_name, name_lit, on_session};
use crate::config::FenceSource;

impl MysqlBackend {
    /// The mutex of the name, or if nobody holds it, the holders of the semaphore of the name.
    pub(super) async fn status(&self, key: &str) -> Result<LockStatus, LockError> {
        let status = self.lock_status(key).await?;
        if status.held || !self.inner.pool.ops().server.ctes {
            return Ok(status);
        }
        let permits = self.semaphore_status(key).await?;
        Ok(if permits.held { permits } else { status })
    }

    /// Who holds the mutex of `key`.
    pub(super) async fn lock_status(&self, key: &str) -> Result<LockStatus, LockError> {
        const DOING: &str = "reading a MySQL lock's status";
        let name = name_lit(&lock_name(key));
        let idle = format!(
            "(SELECT p.TIME FROM information_schema.PROCESSLIST p \
              WHERE p.ID = IS_USED_LOCK({name}))"
        );
        // The holder's label, its fence where it was recorded, its TTL, how long its session
        // has been idle, and the highest fence issued (for a cached sequence, the end of the
        // cache handed out so far: an upper bound).
        let sql = match self.inner.pool.ops().fences {
            FenceSource::Counter => format!(
                "SELECT IS_USED_LOCK({name}), l.holder, l.fence, l.ttl_ms, {idle}, l.fence \
                 FROM (SELECT 1) AS one LEFT JOIN distlock_locks l ON l.name = {name}"
            ),
            // A holder that recorded itself (see `recorded`) is named by its own row.
            FenceSource::Sequence => format!(
                "SELECT IS_USED_LOCK({name}), COALESCE(h.holder, s.holder), h.fence, s.ttl_ms, \
                        {idle}, (SELECT next_not_cached_value - 1 FROM distlock_fence) \
                 FROM (SELECT 1) AS one \
                 LEFT JOIN distlock_sessions s ON s.id = IS_USED_LOCK({name}) \
                 LEFT JOIN distlock_holders h ON h.name = {name} \
                   AND h.conn_id = IS_USED_LOCK({name})"
            ),
        };
        let session = self.inner.pool.any_session().await?;
        let Some(row) = on_session(session.conn(), || Sql::Text(sql), DOING).await? else {
            return Ok(LockStatus::free());
        };
        let fence = int(&row, 2).and_then(|f| u64::try_from(f).ok());
        let last_fence = int(&row, 5).and_then(|f| u64::try_from(f).ok());
        if int(&row, 0).is_none() {
            return Ok(LockStatus::free().with_last_fence(last_fence));
        }
        let holder: Option<String> = row.get::<Option<String>, _>(1).flatten();
        let owner = holder.map(|h| HolderValue::parse(&h).label());
        let ttl = int(&row, 3).map(|t| {
            let idle_ms = int(&row, 4).unwrap_or(0).saturating_mul(1000);
            Duration::from_millis(u64::try_from(t - idle_ms).unwrap_or(0))
        });
        Ok(LockStatus::held(owner, fence, ttl).with_last_fence(last_fence))
    }
}
