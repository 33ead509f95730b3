//! Lock names for `distlock list`: the table `distlock_names`.
//!
//! The server knows a named lock by its server-side name ([`lock_name`]: the lock's name
//! itself when it is short and plain, else a digest), and shows the names held only in
//! `performance_schema.metadata_locks`, which MariaDB leaves off by default. A client
//! therefore records the lock's name behind its server name the first time it tries it, in
//! the background (an acquire never waits for it), and the listing asks the server which of
//! the recorded names are in use: `IS_USED_LOCK` for a lock; a semaphore's name is listed while
//! its row in `distlock_semaphores` exists, and its status read says whether a permit is held.

use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::{Arc, Weak};

use distlock_core::engine::{BoxFuture, LeaseKind, LockError, Names};
use distlock_core::recipes::MutexExt;

use tokio::sync::mpsc;

use super::{
    MysqlBackend, MysqlShared, Sql, lit, lock_name, on_session_all, permits::semaphore_name,
};

/// How many names a client remembers having recorded before it starts over.
const REMEMBERED: usize = 65_536;

/// The table of names.
pub(super) const TABLE: &str = "CREATE TABLE IF NOT EXISTS distlock_names (\
       server_name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY, \
       kind TINYINT NOT NULL, \
       name VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL) ENGINE=InnoDB";

/// A name to record: its server name, kind code and name.
type Name = (String, u8, String);

/// The most names one statement records.
const BATCH: usize = 500;

/// The server names this client recorded a name for, and its writer: one task, one statement
/// per batch, so that a burst of new names costs a few statements, not one each.
#[derive(Debug, Default)]
pub(super) struct NameRecorder {
    /// The server names recorded, by a 64-bit hash of each (seeded per client): a copy of
    /// each name cost a client holding 100,000 locks about 40 bytes a lock. Two names of one
    /// hash (about one chance in 2^64 a pair) would leave the second unrecorded until the set
    /// starts over: `distlock list` would miss it meanwhile; no lock depends on this set.
    seen: std::sync::Mutex<HashSet<u64, foldhash::fast::RandomState>>,
    /// The hash of [`seen`](Self::seen).
    hasher: foldhash::fast::RandomState,
    writer: std::sync::Mutex<Option<mpsc::UnboundedSender<Name>>>,
}

impl MysqlBackend {
    /// Records `name` in the background, the first time this client uses it.
    pub(super) fn record_name(&self, name: &str, kind: LeaseKind) {
        let (server, code) = match kind {
            LeaseKind::Permit { .. } => (semaphore_name(name), 1),
            _ => (lock_name(name), 0),
        };
        {
            let mut seen = self.inner.names.seen.locked();
            if seen.len() >= REMEMBERED {
                seen.clear();
            }
            if !seen.insert(self.inner.names.hasher.hash_one(server.as_str())) {
                return;
            }
        }
        let mut writer = self.inner.names.writer.locked();
        let tx = writer.get_or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(write_names(Arc::downgrade(&self.inner), rx));
            tx
        });
        let _ = tx.send((server, code, name.to_owned()));
    }
}

/// Writes the names sent, a batch at a time, until the engine is dropped.
async fn write_names(engine: Weak<MysqlShared>, mut rx: mpsc::UnboundedReceiver<Name>) {
    const DOING: &str = "recording the locks' names";
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(n) => batch.push(n),
                Err(_) => break,
            }
        }
        let Some(inner) = engine.upgrade() else {
            return;
        };
        let me = MysqlBackend { inner };
        let rows: Vec<String> = batch
            .iter()
            .map(|(server, code, name)| format!("({}, {code}, {})", lit(server), lit(name)))
            .collect();
        let sql = format!(
            "INSERT INTO distlock_names (server_name, kind, name) VALUES {} \
             ON DUPLICATE KEY UPDATE name = VALUES(name), kind = VALUES(kind)",
            rows.join(", ")
        );
        let written = async {
            let session = me.inner.pool.any_session().await?;
            on_session_all(session.conn(), || Sql::Text(sql), DOING).await
        };
        if let Err(e) = written.await {
            // Tried again at the next use of each name.
            let mut seen = me.inner.names.seen.locked();
            for (server, _, _) in &batch {
                seen.remove(&me.inner.names.hasher.hash_one(server.as_str()));
            }
            tracing::debug!(target: "distlock", error = %e, "cannot record the locks' names");
        }
    }
}

/// The recorded names whose lock is in use, and the semaphores with a size on record.
impl distlock_core::engine::Lister for MysqlBackend {
    fn names<'a>(
        &'a self,
        prefix: &'a str,
        budget: usize,
    ) -> BoxFuture<'a, Result<Names, LockError>> {
        Box::pin(async move {
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
        })
    }
}
