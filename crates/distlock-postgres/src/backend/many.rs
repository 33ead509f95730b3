//! Several names at once (`MultiLock`): every name's advisory lock on one session of the
//! lease's own, taken in one statement that lets go of what it took when a name is busy.
//!
//! Each name is the same lock as a single-name lease of it: its advisory lock [`lock_id`], and
//! its fence from the sequence `distlock_fence`, taken once the lock is granted as the single
//! acquire takes it, so a name's fences rise across single-name and multi-name holders alike.
//!
//! Why a session of the lease's own, not the pool's: a session's advisory locks count their
//! acquisitions, so a session never finds its own lock busy. The pool keeps two leases of one
//! name off one session by placing each lease by its one name; a multi-name lease would need a
//! session that neither holds nor is taking any of its names, and the pool's per-name records
//! are not made for that. A session of its own holds nothing else, so the server decides every
//! name, against this client's pooled sessions as against anybody's. The price is a connection
//! per multi-name lease held (opened at its attempt, reused from the engine's idle ones when
//! there are some) and one keep-alive per lease: multi-name locks are the rare kind.
//!
//! - **acquire** is one statement, sent in one round trip (`query_typed`, no prepare): a
//!   recursive walk that tries the names in the given, sorted order and stops at the first busy
//!   one, then lets go of the ones it took when it stopped early (see [`ACQUIRE_SQL`]). On a
//!   busy name the session holds nothing and goes back to the idle ones. A statement that fails
//!   or is dropped half-way ends its session, which frees anything it may have taken (session
//!   advisory locks are not rolled back with a failed transaction).
//! - **the lease** is its session's: the statement that took it set the session's
//!   `idle_session_timeout` to the TTL and its label (`application_name`, which `status`
//!   reads); a renewal sets the timeout again and counts the names the session still holds in
//!   `pg_locks`: `Ours` only when it holds every one. The session's end (terminated, timed
//!   out, the server gone) shows as `Missing` at the next renewal: the core gives a multi-name
//!   lease no session watch.
//! - **release** unlocks every name, telling the waiters of each (see `listen`), and closes
//!   the session.
//!
//! A multi-name attempt does not queue behind single-name waiters' tickets (see `order`): the
//! core's multi-name waiter is not queued on the engine. The ticket its token gets as it
//! subscribes to a busy name is dropped at its next attempt, whatever that finds, so it never
//! holds single-name writers back; its marker outlives the ticket by `marker::LINGER`, and
//! the name's releases notify the waiter that long (after that it backs off as without
//! events).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::engine::{
    AcquireMany, ErrorKind, LeaseCheck, LeaseKind, LockError, ManyAttempt, MultiLock, Token,
};
use distlock_core::recipes::MutexExt;
use tokio_postgres::types::Type;

use super::listen::CHANNEL;
use super::{APP_TAG, Conn, PgBackend, lock_id, marker, names, ttl_ms};
use crate::error::map_err;

/// The multi-name leases this client holds, by token, each with its session.
#[derive(Default)]
pub(super) struct ManyLeases {
    held: Mutex<HashMap<String, Arc<Held>>>,
}

/// A multi-name lease: its session, its names' lock ids and their fences.
struct Held {
    conn: Conn,
    ids: Vec<i64>,
    fences: Vec<Option<u64>>,
}

impl Drop for Held {
    /// The lease forgotten ends its session: nothing is left holding a name.
    fn drop(&mut self) {
        self.conn.close();
    }
}

/// A session taken for an attempt, closed if the attempt does not hand it on (a failure, or
/// the future dropped half-way, leaves the session's holds unknown).
struct Trying(Option<Conn>);

impl Trying {
    fn conn(&self) -> Option<&Conn> {
        self.0.as_ref()
    }
}

impl Drop for Trying {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.close();
        }
    }
}

/// The attempt: `$1` the lock ids in the names' order, `$2` the timeout in ms (text), `$3` the
/// owner. Why the order holds:
///
/// - `walk` is a recursive CTE: each iteration reads only the row the previous one made, and
///   makes a row only while the previous try got its lock (`w.fence IS NOT NULL`), so the
///   names are tried one by one, in order, and none after the first busy one. The try is in
///   the target list, which is computed only for a row that passed the `WHERE`; it reads its
///   id from the array by position (no join: each step costs the same however many names).
///   A granted lock then takes its fence (`CASE` evaluates `THEN` only when its condition is
///   true), as the single acquire does. A recursive CTE is evaluated once, however often it
///   is read.
/// - `tally` counts the locks taken: an aggregate over the whole of `walk`, so every try is
///   done before it has a row.
/// - `undo` unlocks the names taken when not all were; its rows depend on `tally`'s, so no
///   unlock runs before the last try. It is read by the outer query (a CTE that nothing reads
///   is not run), and `MATERIALIZED` with a volatile target list: every row is computed.
/// - The settings are set only when every name was taken; set in a statement that fails, they
///   roll back with it. `synchronous_commit` is on at this statement's commit, so a fence is
///   reported only once a crash can no longer give it again (as the pool's sessions do).
const ACQUIRE_SQL: &str = "\
WITH RECURSIVE
  want AS MATERIALIZED (
    SELECT u.id, u.ord FROM unnest($1::bigint[]) WITH ORDINALITY AS u(id, ord)),
  walk(ord, fence) AS (
      SELECT 0::bigint, 0::bigint
    UNION ALL
      SELECT w.ord + 1,
             CASE WHEN pg_try_advisory_lock(($1::bigint[])[w.ord + 1])
                  THEN nextval('{s}.distlock_fence') END
      FROM walk w
      WHERE w.fence IS NOT NULL AND w.ord < cardinality($1::bigint[])),
  tally AS MATERIALIZED (SELECT count(fence) - 1 AS taken FROM walk),
  undo AS MATERIALIZED (
    SELECT pg_advisory_unlock(n.id) AS freed FROM want n, tally t
    WHERE t.taken < cardinality($1::bigint[]) AND n.ord <= t.taken)
SELECT t.taken,
       (SELECT count(*) FILTER (WHERE u.freed) FROM undo u),
       CASE WHEN t.taken = cardinality($1::bigint[])
            THEN (SELECT array_agg(w.fence ORDER BY w.ord) FROM walk w WHERE w.ord > 0) END,
       CASE WHEN t.taken = cardinality($1::bigint[])
            THEN set_config('idle_session_timeout', $2::text, false)
              || set_config('application_name', left('{tag} - ' || $2::text || ' ' || $3::text, 63), false)
              || set_config('synchronous_commit', 'on', false) END
FROM tally t";

/// The renewal: the timeout set again (`$2`, ms as text); beside it the number of ids of `$1`,
/// twice, as the held and the asked. The session holds every name for as long as it lives: only
/// it can unlock them, and it runs nothing but this lease's statements, so a statement that
/// runs on it is the proof. (Reading `pg_locks` to count them again would copy the server's
/// whole lock table at every renewal: a cost of every lock on the server, not of this lease.)
/// A killed session fails the statement (`Outcome::Ended`).
const RENEW_SQL: &str = "\
SELECT set_config('idle_session_timeout', $2::text, false),
       (SELECT count(*) FROM unnest($1::bigint[])),
       (SELECT count(*) FROM unnest($1::bigint[]))";

/// The release: each id of `$1` unlocked, and its channel (`$4`) notified when its marker
/// (`$2`, `$3`) says somebody may wait (see `marker`, `listen`). The inner query's columns are
/// volatile, so PostgreSQL computes both for every row though only one is read.
const RELEASE_SQL: &str = "\
SELECT count(*) FILTER (WHERE x.freed), count(*) FROM (
  SELECT pg_advisory_unlock(u.id) AS freed,
         CASE WHEN NOT pg_try_advisory_xact_lock(u.k1, u.k2) THEN pg_notify(u.channel, '') END
           AS told
  FROM unnest($1::bigint[], $2::int[], $3::int[], $4::text[]) AS u(id, k1, k2, channel)) x";

impl PgBackend {
    fn many(&self) -> &ManyLeases {
        &self.inner.many
    }

    /// The lease of `token`, taken out of the map.
    fn forget_many(&self, token: &Token) -> Option<Arc<Held>> {
        self.many().held.locked().remove(token.as_str())
    }

    /// Runs `sql` on `conn` in one round trip, within the response timeout.
    async fn one_trip(
        &self,
        conn: &Conn,
        sql: &str,
        params: &[(&(dyn tokio_postgres::types::ToSql + Sync), Type)],
        doing: &str,
    ) -> Result<tokio_postgres::Row, Outcome> {
        let limit = self.config().response_timeout;
        let rows = tokio::time::timeout(limit, conn.client.query_typed(sql, params))
            .await
            .map_err(|_| {
                Outcome::Failed(LockError::new(
                    ErrorKind::Timeout,
                    format!("{doing}: no answer within {limit:?}"),
                ))
            })?
            .map_err(|e| {
                // The session ended under the statement (terminated, timed out, gone): what it
                // held is free, and the lease is not ours any more.
                let fatal = e
                    .as_db_error()
                    .is_some_and(|d| matches!(d.severity(), "FATAL" | "PANIC"));
                if e.is_closed() || fatal || conn.is_closed() {
                    Outcome::Ended
                } else {
                    Outcome::Failed(map_err(e, doing))
                }
            })?;
        rows.into_iter().next().ok_or_else(|| {
            Outcome::Failed(LockError::new(
                ErrorKind::Protocol,
                format!("{doing}: no row"),
            ))
        })
    }
}

/// How a statement on a lease's session went wrong.
enum Outcome {
    /// The session ended: its locks are free.
    Ended,
    /// An error; the session may still hold what it held.
    Failed(LockError),
}

impl Outcome {
    fn into_error(self, doing: &str) -> LockError {
        match self {
            Outcome::Failed(e) => e,
            Outcome::Ended => {
                LockError::new(ErrorKind::Connection, format!("{doing}: the session ended"))
            }
        }
    }
}

fn ids_of(names: &[&str]) -> Vec<i64> {
    names.iter().map(|n| lock_id(n)).collect()
}

#[distlock_core::engine::async_trait]
impl MultiLock for PgBackend {
    async fn acquire_all(&self, req: &AcquireMany<'_>) -> Result<ManyAttempt, LockError> {
        const DOING: &str = "taking several PostgreSQL advisory locks";
        let token = req.token.as_str();
        let resent = self.many().held.locked().get(token).cloned();
        if let Some(held) = resent {
            if !held.conn.is_closed() {
                // The reply came after all: the names are ours already.
                return Ok(ManyAttempt::Acquired {
                    fences: held.fences.clone(),
                });
            }
            // Its session ended: the names are free, and tried again below.
            self.forget_many(req.token);
        }
        // Each name recorded for `distlock list` as a single acquire records it, when this
        // call ends (the server knows the locks by their ids only).
        let _names: Vec<names::NameToSend<'_>> = req
            .names
            .iter()
            .filter_map(|name| {
                let (id, new_name) = self.name_id(name, LeaseKind::Exclusive);
                // Made only for a new name: dropped, it sends its name.
                new_name.then(|| names::NameToSend {
                    backend: self,
                    name,
                    kind: LeaseKind::Exclusive,
                    id,
                })
            })
            .collect();
        let ids = ids_of(req.names);
        let sql = ACQUIRE_SQL
            .replace("{s}", self.schema())
            .replace("{tag}", APP_TAG);
        let keep = ttl_ms(req.ttl).to_string();
        let owner = req.owner.to_owned();
        let mut trying = Trying(Some(self.take().await?));
        let Some(conn) = trying.conn() else {
            return Err(LockError::new(ErrorKind::Protocol, DOING));
        };
        let row = self
            .one_trip(
                conn,
                &sql,
                &[
                    (&ids, Type::INT8_ARRAY),
                    (&keep, Type::TEXT),
                    (&owner, Type::TEXT),
                ],
                DOING,
            )
            .await
            .map_err(|o| o.into_error(DOING))?;
        let taken: i64 = row.try_get(0).map_err(|e| map_err(e, DOING))?;
        let undone: i64 = row.try_get(1).map_err(|e| map_err(e, DOING))?;
        let fences: Option<Vec<i64>> = row.try_get(2).map_err(|e| map_err(e, DOING))?;
        let n = ids.len();
        let taken = usize::try_from(taken).unwrap_or(usize::MAX);
        match fences {
            Some(fences) if taken == n && fences.len() == n => {
                let fences: Vec<Option<u64>> =
                    fences.into_iter().map(|f| u64::try_from(f).ok()).collect();
                let conn = trying.0.take().ok_or_else(|| {
                    LockError::new(ErrorKind::Protocol, format!("{DOING}: no session"))
                })?;
                let held = Arc::new(Held {
                    conn,
                    ids,
                    fences: fences.clone(),
                });
                self.many().held.locked().insert(token.to_owned(), held);
                self.drop_ticket(token).await;
                Ok(ManyAttempt::Acquired { fences })
            }
            None if taken < n && usize::try_from(undone).ok() == Some(taken) => {
                // Everything taken was let go: the session holds nothing and serves again.
                if let Some(conn) = trying.0.take() {
                    self.put_back(conn);
                }
                self.drop_ticket(token).await;
                Ok(ManyAttempt::Busy {
                    name: taken,
                    holder_ttl: None,
                })
            }
            // Not what the statement gives: the session's holds are not known, and it is
            // closed when `trying` drops.
            _ => Err(LockError::new(
                ErrorKind::Protocol,
                format!("{DOING}: took {taken} of {n} names and let go of {undone}"),
            )),
        }
    }

    async fn renew_all(
        &self,
        names: &[&str],
        token: &Token,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "renewing several PostgreSQL advisory locks";
        let held = self.many().held.locked().get(token.as_str()).cloned();
        let Some(held) = held else {
            return Ok(LeaseCheck::Missing);
        };
        if held.conn.is_closed() || held.ids != ids_of(names) {
            self.forget_many(token);
            return Ok(LeaseCheck::Missing);
        }
        let keep = ttl_ms(ttl).to_string();
        let answer = self
            .one_trip(
                &held.conn,
                RENEW_SQL,
                &[(&held.ids, Type::INT8_ARRAY), (&keep, Type::TEXT)],
                DOING,
            )
            .await;
        match answer {
            Ok(row) => {
                let holds: i64 = row.try_get(1).map_err(|e| map_err(e, DOING))?;
                let all: i64 = row.try_get(2).map_err(|e| map_err(e, DOING))?;
                if holds == all {
                    Ok(LeaseCheck::Ours)
                } else {
                    // A name let go behind the lease's back: what is left goes with the
                    // session, which nobody can use as this lease any more.
                    self.forget_many(token);
                    Ok(LeaseCheck::Missing)
                }
            }
            Err(Outcome::Ended) => {
                self.forget_many(token);
                Ok(LeaseCheck::Missing)
            }
            Err(Outcome::Failed(e)) => Err(e),
        }
    }

    /// The names are the lease's own, kept with its session.
    async fn release_all(&self, _names: &[&str], token: &Token) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "releasing several PostgreSQL advisory locks";
        // A waiter that gave up leaves the queue.
        self.drop_ticket(token.as_str()).await;
        // Taken out first: whatever happens below, the session is closed when `held` drops.
        let Some(held) = self.forget_many(token) else {
            return Ok(LeaseCheck::Missing);
        };
        if held.conn.is_closed() {
            return Ok(LeaseCheck::Missing);
        }
        let (k1, k2): (Vec<i32>, Vec<i32>) = held.ids.iter().map(|id| marker::key(*id)).unzip();
        let channels: Vec<String> = held.ids.iter().map(|id| format!("{CHANNEL}{id}")).collect();
        let answer = self
            .one_trip(
                &held.conn,
                RELEASE_SQL,
                &[
                    (&held.ids, Type::INT8_ARRAY),
                    (&k1, Type::INT4_ARRAY),
                    (&k2, Type::INT4_ARRAY),
                    (&channels, Type::TEXT_ARRAY),
                ],
                DOING,
            )
            .await;
        match answer {
            Ok(row) => {
                let freed: i64 = row.try_get(0).map_err(|e| map_err(e, DOING))?;
                let all: i64 = row.try_get(1).map_err(|e| map_err(e, DOING))?;
                Ok(if freed == all {
                    LeaseCheck::Ours
                } else {
                    LeaseCheck::Missing
                })
            }
            Err(Outcome::Ended) => Ok(LeaseCheck::Missing),
            // The session is closed all the same (`held` drops), which frees every name.
            Err(Outcome::Failed(e)) => Err(e),
        }
    }
}
