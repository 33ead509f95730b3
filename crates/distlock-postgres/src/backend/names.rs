//! Lock names for `distlock list`: the table `distlock_names`.
//!
//! The server knows an advisory lock by its 64-bit id only (`pg_locks`). A client therefore
//! records the name behind each id the first time it tries a lock of that name, in a row
//! `(lock_id, kind, name)` written in the background (an acquire never waits for it), and the
//! listing joins the names with `pg_locks` and the waiters' tickets: a name is in use while its
//! lock is granted to some session (for a semaphore: its size hold), or a live ticket waits
//! for it. The table is `UNLOGGED`; after a crash the names come back as clients use them.

use std::collections::HashMap;
use std::sync::Arc;

use distlock_core::engine::{LeaseKind, LockError, Names};
use distlock_core::recipes::names::{Record, write_batches};

use super::{PgBackend, PgShared, lock_id, permits};
use crate::error::within;

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

/// A name's key: its lock id (a lock's, or a semaphore's base id) and kind code. Ids, not
/// names: the id is computed again at each acquire (a SHA-256 of a short name, well under a
/// microsecond against the round trip's tens), and two names of one id are one lock on the
/// server anyway.
type Key = (i64, i16);

/// The ids this client recorded a name for, and its writer (see
/// `distlock_core::recipes::names`).
pub(super) type NameRecorder = distlock_core::recipes::names::NameRecorder<Key>;

fn recorder(engine: &PgShared) -> &NameRecorder {
    &engine.names
}

impl PgBackend {
    /// The id of `name` for `kind` (a lock's, or a semaphore's base id), and whether this
    /// client has yet to record it: then a [`NameToSend`] for the attempt, which sends it
    /// once the attempt is over (or given up).
    pub(super) fn name_id(&self, name: &str, kind: LeaseKind) -> (i64, bool) {
        let id = match kind {
            LeaseKind::Permit { .. } => permits::permit_base(name),
            _ => lock_id(name),
        };
        // false: this client recorded it, or another of its tasks records it.
        (id, self.inner.names.first_use(&(id, kind_code(kind))))
    }

    /// Records `name` (with its id from [`name_id`](Self::name_id)) in the background.
    fn send_name(&self, name: &str, kind: LeaseKind, id: i64) {
        let engine = Arc::downgrade(&self.inner);
        self.inner
            .names
            .send((id, kind_code(kind)), name.to_owned(), |rx| {
                write_batches(engine, rx, recorder, write_names)
            });
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

/// Records one batch of names in one statement.
async fn write_names(inner: Arc<PgShared>, batch: Vec<Record<Key>>) -> Result<(), LockError> {
    const DOING: &str = "recording the locks' names";
    let me = PgBackend { inner };
    let batch: HashMap<Key, String> = batch.into_iter().collect();
    // In key order: two clients writing overlapping names lock their rows in the same order,
    // so they cannot deadlock (an upsert locks the row even when it changes nothing).
    let mut rows: Vec<(&Key, &String)> = batch.iter().collect();
    rows.sort_unstable_by_key(|(k, _)| **k);
    let (mut ids, mut codes, mut names) = (Vec::new(), Vec::new(), Vec::new());
    for ((id, code), name) in rows {
        ids.push(*id);
        codes.push(*code);
        names.push(name.as_str());
    }
    // On a session of its own, never one of the pool: a statement in flight on a session that
    // holds locks when the server ends it takes the server's word for why (the lost reason)
    // with it.
    let conn = me.take().await?;
    let s = &me.config().schema;
    let sql = format!(
        "INSERT INTO {s}.distlock_names (lock_id, kind, name) \
         SELECT * FROM unnest($1::bigint[], $2::smallint[], $3::text[]) \
         ON CONFLICT (lock_id, kind) DO UPDATE SET name = EXCLUDED.name \
         WHERE {s}.distlock_names.name <> EXCLUDED.name"
    );
    within(
        me.config().response_timeout,
        DOING,
        conn.client.execute(&sql, &[&ids, &codes, &names]),
    )
    .await?;
    me.put_back(conn);
    Ok(())
}

/// The names whose lock some session holds, or a live ticket waits for.
#[distlock_core::engine::async_trait]
impl distlock_core::engine::Lister for PgBackend {
    async fn names(&self, prefix: &str, budget: usize) -> Result<Names, LockError> {
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
        let rows = within(
            self.config().response_timeout,
            DOING,
            session.conn().client.query(&sql, &[&prefix, &limit]),
        )
        .await?;
        let mut names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        let more = names.len() > budget;
        names.truncate(budget);
        Ok(Names::new(names, more))
    }
}
