//! Lock names for `distlock list`: the table `distlock_names`.
//!
//! The server knows a named lock by its server-side name ([`lock_name`]: the lock's name
//! itself when it is short and plain, else a digest), and shows the names held only in
//! `performance_schema.metadata_locks`, which MariaDB leaves off by default. A client
//! therefore records the lock's name behind its server name the first time it tries it, in
//! the background (an acquire never waits for it), and the listing asks the server which of
//! the recorded names are in use: `IS_USED_LOCK` for a lock; a semaphore's name is listed while
//! its row in `distlock_semaphores` exists, and its status read says whether a permit is held.

use std::sync::Arc;

use distlock_core::engine::{LeaseKind, LockError, Names};
use distlock_core::recipes::names::{Record, write_batches};

use super::{
    MysqlBackend, MysqlShared, Sql, lit, lock_name, on_session_all, permits::semaphore_name,
};

/// The table of names.
pub(super) const TABLE: &str = "CREATE TABLE IF NOT EXISTS distlock_names (\
       server_name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY, \
       kind TINYINT NOT NULL, \
       name VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL) ENGINE=InnoDB";

/// A name's key: its server name and kind code.
type Key = (String, u8);

/// The server names this client recorded a name for, and its writer (see
/// `distlock_core::recipes::names`).
pub(super) type NameRecorder = distlock_core::recipes::names::NameRecorder<Key>;

fn recorder(engine: &MysqlShared) -> &NameRecorder {
    &engine.names
}

impl MysqlBackend {
    /// Records `name` in the background, the first time this client uses it.
    pub(super) fn record_name(&self, name: &str, kind: LeaseKind) {
        let key = match kind {
            LeaseKind::Permit { .. } => (semaphore_name(name), 1),
            _ => (lock_name(name), 0),
        };
        if !self.inner.names.first_use(&key) {
            return;
        }
        let engine = Arc::downgrade(&self.inner);
        self.inner.names.send(key, name.to_owned(), |rx| {
            write_batches(engine, rx, recorder, write_names)
        });
    }
}

/// Records one batch of names in one statement.
async fn write_names(inner: Arc<MysqlShared>, batch: Vec<Record<Key>>) -> Result<(), LockError> {
    const DOING: &str = "recording the locks' names";
    let me = MysqlBackend { inner };
    let rows: Vec<String> = batch
        .iter()
        .map(|((server, code), name)| format!("({}, {code}, {})", lit(server), lit(name)))
        .collect();
    let sql = format!(
        "INSERT INTO distlock_names (server_name, kind, name) VALUES {} \
         ON DUPLICATE KEY UPDATE name = VALUES(name), kind = VALUES(kind)",
        rows.join(", ")
    );
    let session = me.inner.pool.any_session().await?;
    on_session_all(session.conn(), || Sql::Text(sql), DOING)
        .await
        .map(|_| ())
}

/// The recorded names whose lock is in use, and the semaphores with a size on record.
#[distlock_core::engine::async_trait]
impl distlock_core::engine::Lister for MysqlBackend {
    async fn names(&self, prefix: &str, budget: usize) -> Result<Names, LockError> {
        const DOING: &str = "listing the locks (distlock_names)";
        let limit = budget.saturating_add(1);
        let p = lit(prefix);
        let sql = format!(
            "SELECT n.name FROM distlock_names n \
             LEFT JOIN distlock_semaphores s ON s.name = n.server_name \
             WHERE LEFT(n.name, CHAR_LENGTH({p})) = {p} \
               AND ((n.kind = 0 AND IS_USED_LOCK(n.server_name) IS NOT NULL) \
                    OR (n.kind = 1 AND s.name IS NOT NULL)) \
             LIMIT {limit}"
        );
        let session = self.inner.pool.any_session().await?;
        let rows = on_session_all(session.conn(), || Sql::Text(sql), DOING).await?;
        let mut names: Vec<String> = rows
            .into_iter()
            .filter_map(|r| r.get::<Option<String>, _>(0).flatten())
            .collect();
        let more = names.len() > budget;
        names.truncate(budget);
        Ok(Names::new(names, more))
    }
}
