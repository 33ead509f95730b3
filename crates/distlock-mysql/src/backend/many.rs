//! Several names at once (`MultiLock`): every name's `GET_LOCK` on one connection of the
//! lease's own, in one round trip that lets go of what it took when a name is busy.
//!
//! Each name is the same lock as a single-name lease of it: the `GET_LOCK` name [`lock_name`],
//! and its fence as the single acquire takes it (`NEXTVAL(distlock_fence)`, or the name's row
//! of `distlock_locks` with `fence=counter`), taken only once every name is ours, so a name's
//! fences rise across single-name and multi-name holders alike. MySQL 5.7 and later, and
//! MariaDB, hold several named locks on one connection.
//!
//! Why a connection of the lease's own, not the pool's: a connection's `GET_LOCK` counts its
//! acquisitions, so a session never finds its own lock busy. The pool keeps two leases of one
//! name off one session by placing each lease by its one name; a multi-name lease would need a
//! session that neither holds nor is taking any of its names, and the pool's per-name records
//! are not made for that. A connection of its own holds nothing else, so the server decides
//! every name, against this client's pooled sessions as against anybody's. The price is a
//! connection per multi-name lease held and one keep-alive per lease: multi-name locks are the
//! rare kind.
//!
//! - **acquire** is one round trip of several statements (see [`acquire_sql`]): `GET_LOCK(name,
//!   0)` of each name in the given, sorted order, none tried after the first busy one, then the
//!   ones taken released when one was busy, then the fences and the holder's label when all
//!   were taken. On a busy name the connection, holding nothing, is closed. A round trip that
//!   fails or is cut off ends the connection, which frees whatever it took.
//! - **the lease** is its connection's: its `wait_timeout` is the TTL, set again at each
//!   renewal, which also checks with `IS_USED_LOCK` that the connection still holds every
//!   name: `Ours` only then. The connection's end (killed, timed out, the server gone) shows
//!   as `Missing` at the next renewal: the core gives a multi-name lease no session watch.
//! - **release** is `RELEASE_LOCK` of every name, then the connection is closed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::engine::{
    AcquireMany, ErrorKind, LeaseCheck, LeaseKind, LockError, ManyAttempt, MultiLock, Token,
};
use distlock_core::recipes::{HolderValue, MutexExt};
use mysql_async::Row;

use super::{MySession, MysqlBackend, Sql, dedicated, int, lit, lock_name, name_lit, on_session};
use crate::config::FenceSource;

/// How many names one statement's sum covers: a sum of thousands of terms would nest the
/// server's parser too deep.
const CHUNK: usize = 64;

/// The multi-name leases this client holds, by token, each with its connection.
#[derive(Default)]
pub(super) struct ManyLeases {
    held: Mutex<HashMap<String, Arc<Held>>>,
}

/// A multi-name lease: its connection, its names' server names and their fences.
struct Held {
    session: Arc<MySession>,
    keys: Vec<String>,
    fences: Vec<Option<u64>>,
}

/// Whether the session's connection is gone (a statement found it broken, or cut it off).
async fn ended(session: &MySession) -> bool {
    session.conn.lock().await.is_none()
}

/// `SET @var = @var + term(name) + …` for every name, in chunks: a sum over the names.
fn sum_sql(sql: &mut String, var: &str, names: &[String], term: impl Fn(&str) -> String) {
    sql.push_str(&format!("SET {var} = 0; "));
    for chunk in names.chunks(CHUNK) {
        sql.push_str(&format!("SET {var} = {var}"));
        for n in chunk {
            sql.push_str(" + ");
            sql.push_str(&term(n));
        }
        sql.push_str("; ");
    }
}

/// The attempt's statements, for the quoted server names `names` (`k` of them): `IF` evaluates
/// its condition first and then only the branch it chose (the single acquire's `NEXTVAL`
/// relies on it too), so each `GET_LOCK` runs only when every name before it was taken, and
/// each `RELEASE_LOCK`, or fence, only when the tries came to that. The statements of a round
/// trip run one after the other on the connection, and a failed one stops the rest.
/// `fence` writes the statements that append the fence of one name to `@distlock_f`.
fn acquire_sql(
    keep: &str,
    names: &[String],
    label: &str,
    fence: impl Fn(&mut String, &str),
) -> String {
    let k = names.len();
    let mut sql = String::with_capacity(k * 200 + 200);
    sql.push_str(keep);
    sql.push_str("; SET @distlock_n = 0, @distlock_f = NULL; ");
    for (i, n) in names.iter().enumerate() {
        sql.push_str(&format!(
            "SET @distlock_n = IF(@distlock_n = {i}, IF(GET_LOCK({n}, 0) = 1, {}, {i}), \
             @distlock_n); ",
            i + 1
        ));
    }
    // The names taken before a busy one: `@distlock_n` of them, released.
    let mut undo = names.to_vec();
    for (i, n) in undo.iter_mut().enumerate() {
        *n = format!(
            "IF(@distlock_n < {k}, IF(@distlock_n > {i}, IFNULL(RELEASE_LOCK({n}), 0), 0), 0)"
        );
    }
    sum_sql(&mut sql, "@distlock_u", &undo, str::to_owned);
    for n in names {
        fence(&mut sql, n);
    }
    sql.push_str(label);
    sql.push_str("SELECT @distlock_n, @distlock_u, @distlock_f");
    sql
}

impl MysqlBackend {
    fn many(&self) -> &ManyLeases {
        &self.inner.many
    }

    fn forget_many(&self, token: &Token) -> Option<Arc<Held>> {
        self.many().held.locked().remove(token.as_str())
    }

    /// Runs `sql` on the lease's connection: the last row, or whether the connection ended.
    async fn on_own(
        &self,
        session: &Arc<MySession>,
        sql: String,
        doing: &'static str,
    ) -> Result<Option<Row>, Outcome> {
        match on_session(session, || Sql::Text(sql), doing).await {
            Ok(row) => Ok(row),
            Err(_) if ended(session).await => Err(Outcome::Ended),
            Err(e) => Err(Outcome::Failed(e)),
        }
    }
}

/// How a round trip on a lease's connection went wrong.
enum Outcome {
    /// The connection ended: its locks are free.
    Ended,
    /// An error; the connection may still hold what it held.
    Failed(LockError),
}

#[distlock_core::engine::async_trait]
impl MultiLock for MysqlBackend {
    async fn acquire_all(&self, req: &AcquireMany<'_>) -> Result<ManyAttempt, LockError> {
        const DOING: &str = "taking several MySQL named locks";
        let token = req.token.as_str();
        let resent = self.many().held.locked().get(token).cloned();
        if let Some(held) = resent {
            if !ended(&held.session).await {
                // The reply came after all: the names are ours already.
                return Ok(ManyAttempt::Acquired {
                    fences: held.fences.clone(),
                });
            }
            // Its connection ended: the names are free, and tried again below.
            self.forget_many(req.token);
        }
        for name in req.names {
            // For `distlock list`, as a single acquire records it.
            self.record_name(name, LeaseKind::Exclusive);
        }
        let keys: Vec<String> = req.names.iter().map(|n| lock_name(n)).collect();
        let quoted: Vec<String> = keys.iter().map(|k| name_lit(k)).collect();
        let k = keys.len();
        let ttl_ms = req.ttl.as_millis();
        let session = Arc::new(dedicated(&self.inner.pool.ops().config).await?);
        let keep = session.keep_sql(req.ttl, true).unwrap_or_default();
        let sql = match self.inner.pool.ops().fences {
            FenceSource::Sequence => {
                // The holder's label for `status`, by the connection's id, as a pooled
                // session's.
                let holder = lit(&HolderValue::now("-", req.owner).encode());
                let label = format!(
                    "REPLACE INTO distlock_sessions (id, holder, ttl_ms) \
                     SELECT CONNECTION_ID(), {holder}, {ttl_ms} FROM DUAL \
                     WHERE @distlock_n = {k}; "
                );
                acquire_sql(&keep, &quoted, &label, |sql, _| {
                    sql.push_str(&format!(
                        "SET @distlock_f = IF(@distlock_n = {k}, \
                         CONCAT_WS(',', @distlock_f, NEXTVAL(distlock_fence)), NULL); "
                    ));
                })
            }
            FenceSource::Counter => {
                // The holder written once, for every name's row (a round trip of thousands
                // of names must fit the server's max_allowed_packet).
                let holder = lit(&HolderValue::now(token, req.owner).encode());
                let keep = format!("{keep}; SET @distlock_holder = {holder}");
                acquire_sql(&keep, &quoted, "", |sql, name| {
                    // Each name's row, as the single acquire writes it.
                    sql.push_str(&format!(
                        "INSERT INTO distlock_locks (name, fence, holder, ttl_ms) \
                           SELECT {name}, LAST_INSERT_ID(1), @distlock_holder, {ttl_ms} FROM DUAL \
                           WHERE @distlock_n = {k} \
                           ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(fence + 1), \
                             holder = VALUES(holder), ttl_ms = VALUES(ttl_ms); \
                         SET @distlock_f = IF(@distlock_n = {k}, \
                           CONCAT_WS(',', @distlock_f, LAST_INSERT_ID()), NULL); "
                    ));
                })
            }
        };
        // A failure leaves the connection's holds unknown: it is dropped (closed, which frees
        // them) with `session`.
        let row = match self.on_own(&session, sql, DOING).await {
            Ok(Some(row)) => row,
            Ok(None) => {
                return Err(LockError::new(
                    ErrorKind::Protocol,
                    format!("{DOING}: no row came back"),
                ));
            }
            Err(Outcome::Failed(e)) => return Err(e),
            Err(Outcome::Ended) => {
                return Err(LockError::new(
                    ErrorKind::Connection,
                    format!("{DOING}: the connection ended"),
                ));
            }
        };
        let taken = int(&row, 0).and_then(|n| usize::try_from(n).ok());
        let undone = int(&row, 1).and_then(|n| usize::try_from(n).ok());
        let fences: Option<String> = row.get::<Option<String>, _>(2).flatten();
        let fences: Option<Vec<Option<u64>>> =
            fences.map(|f| f.split(',').map(|x| x.trim().parse::<u64>().ok()).collect());
        match (taken, undone, fences) {
            (Some(t), _, Some(fences)) if t == k && fences.len() == k => {
                let held = Arc::new(Held {
                    session,
                    keys,
                    fences: fences.clone(),
                });
                self.many().held.locked().insert(token.to_owned(), held);
                Ok(ManyAttempt::Acquired { fences })
            }
            // Everything taken was let go; the connection closes with `session`.
            (Some(t), Some(u), None) if t < k && u == t => Ok(ManyAttempt::Busy {
                name: t,
                holder_ttl: None,
            }),
            (t, u, _) => Err(LockError::new(
                ErrorKind::Protocol,
                format!("{DOING}: took {t:?} of {k} names and let go of {u:?}"),
            )),
        }
    }

    async fn renew_all(
        &self,
        _names: &[&str],
        token: &Token,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "renewing several MySQL named locks";
        let held = self.many().held.locked().get(token.as_str()).cloned();
        let Some(held) = held else {
            return Ok(LeaseCheck::Missing);
        };
        let mut sql = held.session.keep_sql(ttl, true).unwrap_or_default();
        sql.push_str("; ");
        let quoted: Vec<String> = held.keys.iter().map(|k| name_lit(k)).collect();
        sum_sql(&mut sql, "@distlock_h", &quoted, |n| {
            format!("IF(IS_USED_LOCK({n}) <=> CONNECTION_ID(), 1, 0)")
        });
        sql.push_str("SELECT @distlock_h");
        match self.on_own(&held.session, sql, DOING).await {
            Ok(row) => {
                let holds = row.and_then(|r| int(&r, 0));
                if holds.and_then(|h| usize::try_from(h).ok()) == Some(held.keys.len()) {
                    Ok(LeaseCheck::Ours)
                } else {
                    // A name let go behind the lease's back: what is left goes with the
                    // connection, which nobody can use as this lease any more.
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

    /// The names are the lease's own, kept with its connection.
    async fn release_all(&self, _names: &[&str], token: &Token) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "releasing several MySQL named locks";
        // Taken out first: whatever happens below, the connection closes when `held` drops.
        let Some(held) = self.forget_many(token) else {
            return Ok(LeaseCheck::Missing);
        };
        let quoted: Vec<String> = held.keys.iter().map(|k| name_lit(k)).collect();
        let mut sql = String::new();
        sum_sql(&mut sql, "@distlock_u", &quoted, |n| {
            format!("IFNULL(RELEASE_LOCK({n}), 0)")
        });
        sql.push_str("SELECT @distlock_u");
        match self.on_own(&held.session, sql, DOING).await {
            Ok(row) => {
                let freed = row.and_then(|r| int(&r, 0));
                Ok(
                    if freed.and_then(|f| usize::try_from(f).ok()) == Some(held.keys.len()) {
                        LeaseCheck::Ours
                    } else {
                        LeaseCheck::Missing
                    },
                )
            }
            Err(Outcome::Ended) => Ok(LeaseCheck::Missing),
            Err(Outcome::Failed(e)) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_come_in_chunks() {
        let names: Vec<String> = (0..130).map(|i| format!("'n{i}'")).collect();
        let mut sql = String::new();
        sum_sql(&mut sql, "@s", &names, |n| format!("f({n})"));
        assert_eq!(sql.matches("SET @s = @s").count(), 3);
        assert_eq!(sql.matches("f(").count(), 130);
    }
}
