//! An acquire: its name recorded for `distlock list`, a resent request found held already, a
//! semaphore's permit (see `permits`), or `GET_LOCK` on a pooled session in one round trip
//! with the session's `wait_timeout`, the fence and the holder's label.

use distlock_core::engine::{AcquireRequest, Attempt, ErrorKind, LeaseKind, LockError};
use distlock_core::recipes::{HolderValue, MutexExt};
use mysql_async::Value;
use tokio::time::Instant;

use super::{MysqlBackend, Sql, int, lit, lock_name, name_lit, on_session};
use crate::config::FenceSource;

impl MysqlBackend {
    /// One attempt (`Backend::acquire`).
    pub(super) async fn acquire_inner(
        &self,
        req: &AcquireRequest<'_>,
    ) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a MySQL named lock";
        // For `distlock list` (the server shows its named locks only in performance_schema).
        self.record_name(req.name, req.kind);
        let pool = &self.inner.pool;
        let token = req.token.as_str();
        if pool.resent_and_held(req) {
            // The reply came after all: the lock is ours already (a recorded holder's fence is
            // known).
            return Ok(Attempt::Acquired {
                fence: self.recorded_fence(token),
            });
        }
        if let LeaseKind::Permit { permits } = req.kind {
            return self.acquire_permit(req, permits).await;
        }
        let key = lock_name(req.name);
        let name = name_lit(&key);
        let fences = pool.ops().fences;
        let mut tries = 0;
        loop {
            let placed = (req.name, key.as_str(), token);
            let Some(lease) = pool.place_try(&mut tries, placed, req.ttl, DOING).await? else {
                return Ok(Attempt::Busy { holder_ttl: None });
            };
            let session = lease.session();
            let my = session.conn();
            let sent = Instant::now();
            let build = || {
                let keep = pool.keep_for(session, req.ttl);
                let mut sql = String::with_capacity(96);
                if let Some(set) = my.keep_sql(keep, false) {
                    sql.push_str(&set);
                    sql.push_str("; ");
                }
                match fences {
                    FenceSource::Sequence => {
                        // The holder's label, once per connection (and owner): `status` finds it
                        // through IS_USED_LOCK's connection id.
                        let mut label = my.label.locked();
                        if label.as_deref() != Some(req.owner) {
                            let holder = lit(&HolderValue::now("-", req.owner).encode());
                            let ttl_ms = req.ttl.as_millis();
                            sql.push_str(&format!(
                                "REPLACE INTO distlock_sessions (id, holder, ttl_ms) \
                                 VALUES (CONNECTION_ID(), {holder}, {ttl_ms}); "
                            ));
                            *label = Some(req.owner.to_owned());
                        }
                        // NEXTVAL only once the lock is ours (IF evaluates its condition
                        // first): the fence, or NULL when busy.
                        if sql.is_empty() {
                            // The common case: one statement, prepared once per connection.
                            return Sql::Prepared(
                                "SELECT IF(GET_LOCK(?, 0) = 1, NEXTVAL(distlock_fence), NULL)",
                                vec![Value::from(key.as_str())],
                            );
                        }
                        sql.push_str("SELECT IF(GET_LOCK(");
                        sql.push_str(&name);
                        sql.push_str(", 0) = 1, NEXTVAL(distlock_fence), NULL)");
                    }
                    FenceSource::Counter => {
                        let holder = lit(&HolderValue::now(token, req.owner).encode());
                        let ttl_ms = req.ttl.as_millis();
                        sql.push_str(&format!(
                            "SELECT GET_LOCK({name}, 0) INTO @distlock_got; \
                             INSERT INTO distlock_locks (name, fence, holder, ttl_ms) \
                               SELECT {name}, LAST_INSERT_ID(1), {holder}, {ttl_ms} FROM DUAL \
                               WHERE @distlock_got = 1 \
                               ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(fence + 1), \
                                 holder = VALUES(holder), ttl_ms = VALUES(ttl_ms); \
                             SELECT @distlock_got, IF(@distlock_got = 1, LAST_INSERT_ID(), NULL)"
                        ));
                    }
                }
                Sql::Text(sql)
            };
            let row = match on_session(my, build, DOING).await {
                Ok(row) => row,
                // GET_LOCK may have succeeded before a later statement failed.
                Err(e) => {
                    pool.failed(&lease, e).await?;
                    continue;
                }
            };
            let Some(row) = row else {
                pool.withdraw_unknown(&lease).await;
                return Err(LockError::new(
                    ErrorKind::Protocol,
                    format!("{DOING}: no row came back"),
                ));
            };
            let (got, fence) = match fences {
                FenceSource::Sequence => (int(&row, 0).is_some(), int(&row, 0)),
                FenceSource::Counter => (int(&row, 0) == Some(1), int(&row, 1)),
            };
            if !got {
                pool.withdraw(&lease);
                return Ok(Attempt::Busy { holder_ttl: None });
            }
            if !pool.confirm(&lease, sent, req.ttl, req.renewed) {
                return Ok(Attempt::Busy { holder_ttl: None });
            }
            let fence = fence.and_then(|f| u64::try_from(f).ok());
            // With a sequence, a holder whose fence `status` must give writes it (see
            // `recorded`); with the counter table, every holder's is kept.
            if let (true, FenceSource::Sequence, Some(f)) = (req.recorded, fences, fence)
                && let Err(e) = self.record(req, f).await
            {
                let _ = pool.release(req.name, token).await;
                return Err(e);
            }
            return Ok(Attempt::Acquired { fence });
        }
    }
}
