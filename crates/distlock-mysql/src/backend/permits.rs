//! The semaphore on named locks: N slot locks `<base>#<i>`, one per permit, and the number of
//! permits in the table `distlock_semaphores`, read and changed only under the semaphore's own
//! lock `<base>#m`.
//!
//! `GET_LOCK` has no shared mode, so the holders of a semaphore cannot all hold a record of its
//! size (as PostgreSQL's shared size lock does). The size is a row instead, and the row is
//! authoritative only while one of its slots is held: under `<base>#m`, a request with another
//! number of permits is refused while any slot of the recorded number is held, and otherwise
//! rewrites the row before it takes a slot. Every holder took its slot under `<base>#m` with the
//! row at its own number, so the holders of a name always agree on its number.

use std::time::Duration;

use distlock_core::engine::{
    AcquireRequest, Attempt, ErrorKind, HolderStatus, LeaseKind, LockError, LockStatus,
};
use distlock_core::recipes::pool::SHARED_PREFIX;
use distlock_core::recipes::{HolderValue, MutexExt, kind_conflict};
use mysql_async::Value;
use tokio::time::Instant;

use super::{FenceSource, MyOps, MySession, MysqlBackend, Sql, int, lit, on_session, server_name};

/// The table of the semaphores' sizes.
pub(super) const TABLE: &str = "CREATE TABLE IF NOT EXISTS distlock_semaphores (\
       name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY, \
       permits INT UNSIGNED NOT NULL) ENGINE=InnoDB";

/// How long an acquire waits in the server for the semaphore's own lock, which others hold
/// only while one statement of theirs runs: long enough to ride out a busy moment, short next
/// to the session's other statements (they queue behind it) and to `response_timeout`.
const META_WAIT: &str = "0.5";

/// A permit held (or being taken) on a session.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PermitHold {
    /// The semaphore's number of permits.
    permits: u32,
    /// The slot taken, once known.
    slot: Option<u32>,
}

/// The server-side base name of the semaphore `name`: `dp:<name>` when that is at most 58
/// characters of letters, digits and `_ . : / -`, otherwise `dp:sha256:` and 48 hex digits of
/// its SHA-256; room is left for a slot's `#<i>` (up to `#9999`) within MySQL's 64 characters.
pub fn semaphore_name(name: &str) -> String {
    server_name("dp:", name, 55)
}

/// The statement that lets recursive CTEs run `n` steps, when the server's default (1,000)
/// may be too few.
fn recursion(server: super::Server, n: u32) -> Option<String> {
    (n >= 1000).then(|| {
        let var = if server.mariadb {
            "max_recursive_iterations"
        } else {
            "cte_max_recursion_depth"
        };
        format!("SET SESSION {var} = {}", n + 1)
    })
}

/// The numbers 0 to `count - 1` (an SQL expression) as the rows of `s(i)`.
fn numbers(count: &str) -> String {
    format!("WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i + 1 < {count})")
}

impl MyOps {
    /// Gives back the permit this session holds (or may have taken) of the semaphore `base`.
    pub(super) async fn unlock_permit(
        &self,
        session: &std::sync::Arc<MySession>,
        base: &str,
    ) -> Result<bool, LockError> {
        const DOING: &str = "releasing a MySQL semaphore permit";
        let hold = session.permits.locked().get(base).copied();
        let Some(hold) = hold else {
            // Nothing of it was ever sent on this session.
            return Ok(false);
        };
        let sql = match hold.slot {
            Some(slot) => Sql::Prepared(
                "SELECT RELEASE_LOCK(?)",
                vec![Value::from(format!("{base}#{slot}"))],
            ),
            None => {
                // The acquire's outcome is unknown: give back the semaphore's own lock and any
                // slot of it this session holds (RELEASE_LOCK frees only the caller's own).
                let mut sql = recursion(self.server, hold.permits)
                    .map(|s| s + "; ")
                    .unwrap_or_default();
                sql.push_str(&format!(
                    "DO RELEASE_LOCK('{base}#m'); \
                     {} SELECT COUNT(*) FROM s WHERE RELEASE_LOCK(CONCAT('{base}#', i)) = 1",
                    numbers(&hold.permits.to_string())
                ));
                Sql::Text(sql)
            }
        };
        let row = on_session(session, || sql, DOING).await?;
        session.permits.locked().remove(base);
        Ok(row.and_then(|r| int(&r, 0)).unwrap_or(0) >= 1)
    }
}

/// What one acquire statement found.
struct Taken {
    /// The semaphore's own lock was ours for the statement.
    meta: bool,
    /// The number of permits recorded before it, if any.
    recorded: Option<u32>,
    /// Slots of the recorded number held (counted only when it differs from ours).
    live: i64,
    slot: Option<u32>,
    fence: Option<u64>,
}

impl MysqlBackend {
    /// One of `permits` permits of the semaphore `req.name`, on a pooled session that holds no
    /// other permit of it, in one round trip: under the semaphore's own lock, the recorded
    /// number of permits checked (and written where nobody holds a slot of another number),
    /// then the first free slot taken; the lock given back; the fence.
    pub(super) async fn acquire_permit(
        &self,
        req: &AcquireRequest<'_>,
        permits: u32,
    ) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a MySQL semaphore permit";
        let pool = &self.inner.pool;
        let ops = pool.ops();
        if !ops.server.ctes {
            return Err(LockError::new(ErrorKind::Unsupported, super::NO_CTES));
        }
        let token = req.token.as_str();
        let base = semaphore_name(req.name);
        let key = format!("{SHARED_PREFIX}{base}");
        let mut tries = 0;
        loop {
            let placed = (req.name, key.as_str(), token);
            let Some(lease) = pool.place_try(&mut tries, placed, req.ttl, DOING).await? else {
                return Ok(Attempt::Busy { holder_ttl: None });
            };
            let session = lease.session();
            let my = session.conn();
            // Recorded before anything is sent: a release of the key gives back whatever of
            // the semaphore the session took.
            my.permits.locked().insert(
                base.clone(),
                PermitHold {
                    permits,
                    slot: None,
                },
            );
            let sent = Instant::now();
            let build = || {
                let keep = pool.keep_for(session, req.ttl);
                Sql::Text(self.permit_sql(my, req, &base, permits, keep))
            };
            let row = match on_session(my, build, DOING).await {
                Ok(row) => row,
                // A slot, or the semaphore's own lock, may have been taken before a later
                // statement failed: the release gives back both.
                Err(e) => {
                    if session.is_over() {
                        my.permits.locked().remove(&base);
                    }
                    pool.failed(&lease, e).await?;
                    continue;
                }
            };
            let taken = row.map(|r| Taken {
                meta: int(&r, 0) == Some(1),
                recorded: int(&r, 1).and_then(|n| u32::try_from(n).ok()),
                live: int(&r, 2).unwrap_or(0),
                slot: int(&r, 3).and_then(|n| u32::try_from(n).ok()),
                fence: int(&r, 4).and_then(|f| u64::try_from(f).ok()),
            });
            let Some(taken) = taken else {
                pool.withdraw_unknown(&lease).await;
                return Err(LockError::new(
                    ErrorKind::Protocol,
                    format!("{DOING}: no row came back"),
                ));
            };
            let Some(slot) = taken.slot.filter(|_| taken.meta && taken.live == 0) else {
                my.permits.locked().remove(&base);
                pool.withdraw(&lease);
                if taken.meta && taken.live > 0 {
                    let theirs = taken.recorded.unwrap_or(0);
                    return Err(kind_conflict(
                        req.name,
                        req.kind,
                        LeaseKind::Permit { permits: theirs },
                    ));
                }
                return Ok(Attempt::Busy { holder_ttl: None });
            };
            if let Some(h) = my.permits.locked().get_mut(&base) {
                h.slot = Some(slot);
            }
            if !pool.confirm(&lease, sent, req.ttl, req.renewed) {
                return Ok(Attempt::Busy { holder_ttl: None });
            }
            return Ok(Attempt::Acquired { fence: taken.fence });
        }
    }

    /// The acquire statements (see [`acquire_permit`](Self::acquire_permit)); the last one
    /// answers the semaphore's lock (1 when it was ours), the recorded number of permits, the
    /// slots of another number held, the slot taken and its fence.
    fn permit_sql(
        &self,
        my: &MySession,
        req: &AcquireRequest<'_>,
        base: &str,
        n: u32,
        keep: Duration,
    ) -> String {
        let ops = self.inner.pool.ops();
        let mut sql = String::with_capacity(1024);
        let mut add = |s: &str| {
            sql.push_str(s);
            sql.push_str("; ");
        };
        if let Some(set) = my.keep_sql(keep, false) {
            add(&set);
        }
        if let Some(set) = recursion(ops.server, n) {
            add(&set);
        }
        let ttl_ms = req.ttl.as_millis();
        if ops.fences == FenceSource::Sequence {
            let mut label = my.label.locked();
            if label.as_deref() != Some(req.owner) {
                let holder = lit(&HolderValue::now("-", req.owner).encode());
                add(&format!(
                    "REPLACE INTO distlock_sessions (id, holder, ttl_ms) \
                     VALUES (CONNECTION_ID(), {holder}, {ttl_ms})"
                ));
                *label = Some(req.owner.to_owned());
            }
        }
        add(&format!(
            "SET @dl_slot = NULL, @dl_live = 0, @dl_m = GET_LOCK('{base}#m', {META_WAIT})"
        ));
        add(&format!(
            "SET @dl_cap = (SELECT permits FROM distlock_semaphores WHERE name = '{base}')"
        ));
        // Only where the recorded number differs: how many of its slots are held.
        add(&format!(
            "SET @dl_live = IF(@dl_m = 1 AND @dl_cap <> {n}, \
               ({} SELECT COUNT(*) FROM s WHERE IS_USED_LOCK(CONCAT('{base}#', i)) IS NOT NULL), \
               0)",
            numbers("@dl_cap")
        ));
        add(&format!(
            "INSERT INTO distlock_semaphores (name, permits) \
             SELECT '{base}', {n} FROM DUAL \
             WHERE @dl_m = 1 AND @dl_live = 0 AND NOT (@dl_cap <=> {n}) \
             ON DUPLICATE KEY UPDATE permits = VALUES(permits)"
        ));
        // One slot at a time, the next only while none was free: no slot is locked beyond the
        // one it answers (a LIMIT would not promise that).
        add(&format!(
            "SET @dl_slot = (WITH RECURSIVE t(i, got) AS ( \
               SELECT 0, IF(@dl_m = 1 AND @dl_live = 0, GET_LOCK('{base}#0', 0), NULL) \
               UNION ALL \
               SELECT i + 1, GET_LOCK(CONCAT('{base}#', i + 1), 0) FROM t \
               WHERE got = 0 AND i + 1 < {n}) \
             SELECT i FROM t WHERE got = 1)"
        ));
        add(&format!("DO RELEASE_LOCK('{base}#m')"));
        let answer = "SELECT @dl_m, @dl_cap, @dl_live, @dl_slot";
        match ops.fences {
            FenceSource::Sequence => {
                sql.push_str(answer);
                sql.push_str(", IF(@dl_slot IS NULL, NULL, NEXTVAL(distlock_fence))");
            }
            FenceSource::Counter => {
                // The semaphore's counter in its own row; the holder (for `status`) in its
                // slot's row.
                let holder = lit(&HolderValue::now(req.token.as_str(), req.owner).encode());
                sql.push_str(&format!(
                    "INSERT INTO distlock_locks (name, fence, holder, ttl_ms) \
                       SELECT '{base}', LAST_INSERT_ID(1), '', 0 FROM DUAL \
                       WHERE @dl_slot IS NOT NULL \
                       ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(fence + 1); \
                     REPLACE INTO distlock_locks (name, fence, holder, ttl_ms) \
                       SELECT CONCAT('{base}#', @dl_slot), LAST_INSERT_ID(), {holder}, {ttl_ms} \
                       FROM DUAL WHERE @dl_slot IS NOT NULL; \
                     {answer}, IF(@dl_slot IS NULL, NULL, LAST_INSERT_ID())"
                ));
            }
        }
        sql
    }

    /// The holders of the semaphore `name`: each held slot of its recorded number, with the
    /// label and TTL its session (MariaDB's sequence) or its slot's row (the counter) records.
    pub(super) async fn semaphore_status(&self, name: &str) -> Result<LockStatus, LockError> {
        const DOING: &str = "reading a MySQL semaphore's status";
        let ops = self.inner.pool.ops();
        let base = semaphore_name(name);
        let session = self.inner.pool.any_session().await?;
        let my = session.conn();
        // The recorded size, and the highest fence issued (for a cached sequence, the end of
        // the block handed out so far: an upper bound; for the counter, the semaphore's row).
        let last = match ops.fences {
            FenceSource::Sequence => {
                "(SELECT next_not_cached_value - 1 FROM distlock_fence)".to_owned()
            }
            FenceSource::Counter => {
                format!("(SELECT fence FROM distlock_locks WHERE name = '{base}')")
            }
        };
        let row = on_session(
            my,
            || {
                Sql::Text(format!(
                    "SELECT (SELECT permits FROM distlock_semaphores WHERE name = '{base}'), \
                            {last}"
                ))
            },
            DOING,
        )
        .await?;
        let last_fence = row
            .as_ref()
            .and_then(|r| int(r, 1))
            .and_then(|f| u64::try_from(f).ok());
        let recorded = row
            .as_ref()
            .and_then(|r| int(r, 0))
            .and_then(|n| u32::try_from(n).ok());
        let Some(permits) = recorded else {
            return Ok(LockStatus::free().with_last_fence(last_fence));
        };
        let (label, fence, join) = match ops.fences {
            FenceSource::Sequence => (
                "d.holder",
                "NULL",
                "LEFT JOIN distlock_sessions d ON d.id = u.id",
            ),
            FenceSource::Counter => (
                "d.holder",
                "d.fence",
                "LEFT JOIN distlock_locks d ON d.name = u.slot",
            ),
        };
        let mut sql = recursion(ops.server, permits)
            .map(|s| s + "; ")
            .unwrap_or_default();
        sql.push_str(&format!(
            "SELECT {label}, {fence}, d.ttl_ms, p.TIME \
             FROM ({} SELECT CONCAT('{base}#', i) AS slot, \
                         IS_USED_LOCK(CONCAT('{base}#', i)) AS id FROM s) u \
             {join} \
             LEFT JOIN information_schema.PROCESSLIST p ON p.ID = u.id \
             WHERE u.id IS NOT NULL",
            numbers(&permits.to_string())
        ));
        let rows = on_session_rows(my, sql, DOING).await?;
        let kind = LeaseKind::Permit { permits };
        let holders = rows
            .iter()
            .map(|r| {
                let holder: Option<String> = r.get::<Option<String>, _>(0).flatten();
                let parsed = holder.as_deref().map(HolderValue::parse);
                let fence = int(r, 1).and_then(|f| u64::try_from(f).ok());
                let ttl = int(r, 2).map(|t| {
                    let idle_ms = int(r, 3).unwrap_or(0).saturating_mul(1000);
                    Duration::from_millis(u64::try_from(t - idle_ms).unwrap_or(0))
                });
                let token = parsed
                    .map(|h| h.token.to_owned())
                    .filter(|t| !t.is_empty() && t != "-");
                HolderStatus::new(kind)
                    .token(token)
                    .owner(parsed.map(|h| h.label()))
                    .fence(fence)
                    .ttl(ttl)
            })
            .collect();
        Ok(LockStatus::held_by(holders).with_last_fence(last_fence))
    }
}

/// Every row of the last result set of `sql` on the session.
async fn on_session_rows(
    session: &std::sync::Arc<MySession>,
    sql: String,
    doing: &'static str,
) -> Result<Vec<mysql_async::Row>, LockError> {
    super::on_session_all(session, || Sql::Text(sql), doing).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semaphore_names_leave_room_for_slots() {
        assert_eq!(semaphore_name("jobs"), "dp:jobs");
        let long = semaphore_name(&"k".repeat(55));
        assert_eq!(long.len(), 58);
        for odd in ["with space", &"k".repeat(56), "é"] {
            let n = semaphore_name(odd);
            assert!(n.starts_with("dp:sha256:") && n.len() == 58, "{n}");
        }
        // The longest slot name fits MySQL's 64 characters.
        assert!(format!("{long}#9999").len() <= 64);
    }
}
