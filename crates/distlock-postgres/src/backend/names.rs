//! Lock names for `distlock list`: the table `distlock_names`.
//!
//! The server knows an advisory lock by its 64-bit id only (`pg_locks`). A client therefore
//! records the name behind each id the first time it tries a lock of that name, in a row
//! `(lock_id, kind, name)` written in the background (an acquire never waits for it), and the
//! listing joins the names with `pg_locks` and the waiters' tickets: a name is in use while its
//! lock is granted to some session (for a semaphore: its size hold), or a live ticket waits
//! for it. The table is `UNLOGGED`; after a crash the names come back as clients use them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

use distlock_core::engine::{BoxFuture, LeaseKind, LockError, Names};
use distlock_core::recipes::MutexExt;

use tokio::sync::mpsc;

use super::{PgBackend, PgShared, kinds, lock_id};
use crate::error::map_err;

/// How many names a client remembers having recorded before it starts over (a client that
/// uses ever new names records each once per so many).
const REMEMBERED: usize = 65_536;

/// The code of a name's kind in the table: a lock (mutex, readers and writers, elections), or
/// a semaphore (its base id).
fn kind_code(kind: LeaseKind) -> i16 {
    match kind {
        LeaseKind::Permit { .. } => 2,
        _ => 0,
    }
}

/// The table's definition.
pub(super) fn names_ddl(schema: &str) -> String {
    format!(
        "CREATE UNLOGGED TABLE IF NOT EXISTS {schema}.distlock_names ( \
           lock_id bigint NOT NULL, \
           kind smallint NOT NULL, \
           name text NOT NULL, \
           PRIMARY KEY (lock_id, kind))"
    )
}

/// A name to record: its lock id, kind code and name.
type Name = (i64, i16, String);

/// The most names one statement records.
const BATCH: usize = 500;

/// The ids of the names this client has recorded, and its writer: one task, on a session
/// of its own, one statement per batch, so that a burst of new names (a thousand locks
/// taken at once) costs a few statements on one connection, not a connection each.
#[derive(Debug, Default)]
pub(super) struct NameRecorder {
    /// By kind: the ids recorded (a lock's, or a semaphore's base id). Ids, not names: a
    /// client holding 100,000 locks kept a copy of each name here besides its id (about 60
    /// bytes a lock); the id is computed again at each acquire instead (a SHA-256 of a short
    /// name, well under a microsecond against the round trip's tens), and two names of one
    /// id are one lock on the server anyway.
    seen: std::sync::Mutex<[Ids; 2]>,
    writer: std::sync::Mutex<Option<mpsc::UnboundedSender<Name>>>,
}

/// Ids recorded (foldhash: looked up at every acquire).
type Ids = HashSet<i64, foldhash::fast::RandomState>;

/// The index of a kind's set in [`NameRecorder::seen`].
fn slot(code: i16) -> usize {
    usize::from(code == kind_code(LeaseKind::Permit { permits: 1 }))
}

impl PgBackend {
    /// The id of `name` for `kind` (a lock's, or a semaphore's base id), and whether this
    /// client has yet to record it: then a [`NameToSend`] for the attempt, which sends it
    /// once the attempt is over (or given up).
    pub(super) fn name_id(&self, name: &str, kind: LeaseKind) -> (i64, bool) {
        let code = kind_code(kind);
        let id = match kind {
            LeaseKind::Permit { .. } => kinds::permit_base(name),
            _ => lock_id(name),
        };
        let mut seen = self.inner.names.seen.locked();
        if seen[slot(code)].contains(&id) {
            return (id, false);
        }
        if seen.iter().map(HashSet::len).sum::<usize>() >= REMEMBERED {
            seen.iter_mut().for_each(HashSet::clear);
        }
        // false: another task of this client records it.
        let new = seen[slot(code)].insert(id);
        (id, new)
    }

    /// Records `name` (with its id from [`name_id`](Self::name_id)) in the background.
    fn send_name(&self, name: &str, kind: LeaseKind, id: i64) {
        let code = kind_code(kind);
        let mut writer = self.inner.names.writer.locked();
        if writer.is_none() {
            // Dropped outside a runtime (an attempt given up there): recorded at the next use.
            let Ok(rt) = tokio::runtime::Handle::try_current() else {
                drop(writer);
                self.inner.names.seen.locked()[slot(code)].remove(&id);
                return;
            };
            let (tx, rx) = mpsc::unbounded_channel();
            rt.spawn(write_names(Arc::downgrade(&self.inner), rx));
            *writer = Some(tx);
        }
        if let Some(tx) = writer.as_ref() {
            let _ = tx.send((id, code, name.to_owned()));
        }
    }
}

/// A name this client has yet to record: sent to the writer when dropped (the attempt that
/// uses it ended, or was given up half-way: either way the name is sent, once).
///
/// A guard, not a call after the attempt: an attempt given up after the server took the lock
/// (its future dropped) still holds it until its clean-up, and `distlock list` must be able to
/// name it meanwhile. Not a call before the attempt either: the writer would open its session
/// beside the attempt's, one connect more on the first acquire's path.
pub(super) struct NameToSend<'a> {
    pub(super) backend: &'a PgBackend,
    pub(super) name: &'a str,
    pub(super) kind: LeaseKind,
    pub(super) id: i64,
}

impl Drop for NameToSend<'_> {
    fn drop(&mut self) {
        self.backend.send_name(self.name, self.kind, self.id);
    }
}

/// Writes the names sent, a batch at a time, until the engine is dropped.
async fn write_names(engine: Weak<PgShared>, mut rx: mpsc::UnboundedReceiver<Name>) {
    const DOING: &str = "recording the locks' names";
    while let Some(first) = rx.recv().await {
        let mut batch: HashMap<(i64, i16), String> = HashMap::new();
        batch.insert((first.0, first.1), first.2);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok((id, code, name)) => {
                    batch.insert((id, code), name);
                }
                Err(_) => break,
            }
        }
        let Some(inner) = engine.upgrade() else {
            return;
        };
        let me = PgBackend { inner };
        // In key order: two clients writing overlapping names lock their rows in the same
        // order, so they cannot deadlock (an upsert locks the row even when it changes nothing).
        let mut rows: Vec<(&(i64, i16), &String)> = batch.iter().collect();
        rows.sort_unstable_by_key(|(k, _)| **k);
        let (mut ids, mut codes, mut names) = (Vec::new(), Vec::new(), Vec::new());
        for ((id, code), name) in rows {
            ids.push(*id);
            codes.push(*code);
            names.push(name.as_str());
        }
        // On a session of its own, never one of the pool: a statement in flight on a session
        // that holds locks when the server ends it takes the server's word for why (the lost
        // reason) with it.
        let written = async {
            let conn = me.take().await?;
            let s = &me.config().schema;
            let sql = format!(
                "INSERT INTO {s}.distlock_names (lock_id, kind, name) \
                 SELECT * FROM unnest($1::bigint[], $2::smallint[], $3::text[]) \
                 ON CONFLICT (lock_id, kind) DO UPDATE SET name = EXCLUDED.name \
                 WHERE {s}.distlock_names.name <> EXCLUDED.name"
            );
            tokio::time::timeout(
                me.config().response_timeout,
                conn.client.execute(&sql, &[&ids, &codes, &names]),
            )
            .await
            .map_err(|_| {
                LockError::new(
                    distlock_core::engine::ErrorKind::Timeout,
                    format!("{DOING}: no answer"),
                )
            })?
            .map_err(|e| map_err(e, DOING))?;
            me.put_back(conn);
            Ok::<_, LockError>(())
        };
        if let Err(e) = written.await {
            // Tried again at the next use of each name.
            let mut seen = me.inner.names.seen.locked();
            for (id, code) in batch.keys() {
                seen[slot(*code)].remove(id);
            }
            tracing::debug!(target: "distlock", error = %e, "cannot record the locks' names");
        }
    }
}

/// The names whose lock some session holds, or a live ticket waits for.
impl distlock_core::engine::Lister for PgBackend {
    fn names<'a>(
        &'a self,
        prefix: &'a str,
        budget: usize,
    ) -> BoxFuture<'a, Result<Names, LockError>> {
        Box::pin(async move {
            const DOING: &str = "listing the locks (pg_locks and distlock_names)";
            let s = &self.config().schema;
            // pg_locks is read once (a CTE is computed once); a bigint lock is classid (high
            // half) and objid (low half) with objsubid 1, a semaphore's size hold is (the base
            // id's high 31 bits, N) with objsubid 2.
            let sql = format!(
                "WITH held AS MATERIALIZED ( \
                   SELECT l.classid::bigint AS hi, l.objid::bigint AS lo, l.objsubid AS sub \
                   FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted) \
                 SELECT n.name FROM {s}.distlock_names n \
                 WHERE left(n.name, length($1)) = $1 AND ( \
                   (n.kind = 0 AND EXISTS (SELECT 1 FROM held h WHERE h.sub = 1 \
                      AND h.hi = ((n.lock_id >> 32) & 4294967295) \
                      AND h.lo = (n.lock_id & 4294967295))) \
                   OR (n.kind = 2 AND EXISTS (SELECT 1 FROM held h WHERE h.sub = 2 \
                      AND h.hi = ((n.lock_id >> 32) & 2147483647))) \
                   OR EXISTS (SELECT 1 FROM {s}.distlock_waiters w \
                      WHERE w.lock_id = n.lock_id AND w.until > now())) \
                 LIMIT $2"
            );
            let session = self.inner.pool.any_session().await?;
            let limit = i64::try_from(budget).unwrap_or(i64::MAX).saturating_add(1);
            let rows = tokio::time::timeout(
                self.config().response_timeout,
                session.conn().client.query(&sql, &[&prefix, &limit]),
            )
            .await
            .map_err(|_| {
                LockError::new(
                    distlock_core::engine::ErrorKind::Timeout,
                    format!("{DOING}: no answer"),
                )
            })?
            .map_err(|e| map_err(e, DOING))?;
            let mut names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            let more = names.len() > budget;
            names.truncate(budget);
            Ok(Names::new(names, more))
        })
    }
}
