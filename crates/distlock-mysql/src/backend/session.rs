//! A session of the pool: one connection, the `wait_timeout` that keeps it, and the statements
//! run on it one at a time, in the order they were built (a statement whose caller went away
//! finishes in a task of its own).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::engine::{ErrorKind, LockError, LostReason};
use distlock_core::recipes::MutexExt;
use distlock_core::recipes::pool::SessionEnd;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};
use tokio::time::Instant;

use super::error::{breaks_connection, map_err, why_ended};
use super::permits;

/// The session's `wait_timeout` for a TTL: whole seconds, rounded up (the server keeps an idle
/// session at least that long), at least 1.
fn wait_secs(ttl: Duration) -> u64 {
    (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1)
}

/// A session of the pool: one connection, used by one statement at a time.
pub(crate) struct MySession {
    pub(super) conn: Arc<tokio::sync::Mutex<Option<Conn>>>,
    end: SessionEnd,
    /// When the server may end it for silence (after the last `wait_timeout` set).
    until: Mutex<Option<Instant>>,
    /// The `wait_timeout` in effect once the statements built so far have run (0: the
    /// server's default).
    secs: Mutex<u64>,
    /// The owner written in `distlock_sessions` for this connection (MariaDB's sequence
    /// fences).
    pub(super) label: Mutex<Option<String>>,
    /// The semaphore permits held (or being taken) on this connection, by the semaphore's
    /// server name ([`permits::semaphore_name`]): one per semaphore on a session.
    pub(super) permits: Mutex<HashMap<String, permits::PermitHold>>,
    limit: Duration,
}

impl MySession {
    pub(super) fn new(conn: Conn, end: SessionEnd, limit: Duration) -> Self {
        MySession {
            conn: Arc::new(tokio::sync::Mutex::new(Some(conn))),
            end,
            until: Mutex::new(None),
            secs: Mutex::new(0),
            label: Mutex::new(None),
            permits: Mutex::new(HashMap::new()),
            limit,
        }
    }

    /// The statement setting `wait_timeout` to cover `keep` from now: always, or only when the
    /// value changes. Built under the connection's lock, in the order statements run.
    pub(super) fn keep_sql(&self, keep: Duration, always: bool) -> Option<String> {
        let secs = wait_secs(keep);
        let until = Instant::now() + Duration::from_secs(secs);
        {
            let mut u = self.until.locked();
            *u = Some(u.map_or(until, |x| x.max(until)));
        }
        let mut current = self.secs.locked();
        if !always && *current == secs {
            return None;
        }
        *current = secs;
        Some(format!("SET SESSION wait_timeout = {secs}"))
    }

    /// Runs `sql` on the connection in `slot` and returns the last row any of its statements
    /// returned. A statement that fails the connection, or does not answer in time, ends the
    /// session.
    async fn run_in(
        &self,
        slot: &mut Option<Conn>,
        sql: &Sql,
        doing: &str,
    ) -> Result<Vec<Row>, LockError> {
        let Some(conn) = slot.as_mut() else {
            return Err(LockError::new(
                ErrorKind::Connection,
                format!("{doing}: the session has ended"),
            ));
        };
        let work = async {
            match sql {
                Sql::Text(text) => last_rows(conn.query_iter(text.as_str()).await?).await,
                Sql::Prepared(text, params) => {
                    last_rows(conn.exec_iter(*text, params.clone()).await?).await
                }
            }
        };
        match tokio::time::timeout(self.limit, work).await {
            Ok(Ok(row)) => Ok(row),
            Ok(Err(e)) => {
                if breaks_connection(&e) {
                    slot.take();
                    self.end.end(why_ended(&e, *self.until.locked()));
                }
                Err(map_err(e, doing))
            }
            Err(_) => {
                // Cut off half-way: the connection's state is unknown, so it is not used
                // again. It stays open, though, until the longest lease on it has run out:
                // closing it would free its locks on the server at once, before their holders'
                // deadlines (the fault harness caught it: a paused server, a renewal timed out,
                // and the next holder took the lock 0.6 s before the first one's deadline).
                if let Some(conn) = slot.take() {
                    let until = *self.until.locked();
                    tokio::spawn(async move {
                        if let Some(until) = until {
                            tokio::time::sleep_until(until).await;
                        }
                        drop(conn);
                    });
                }
                self.end.end(LostReason::Unreachable);
                Err(LockError::new(
                    ErrorKind::Timeout,
                    format!("{doing}: no answer within {:?}", self.limit),
                ))
            }
        }
    }

    /// Runs `sql` (one or more statements) once the connection is free.
    pub(super) async fn run(&self, sql: &str, doing: &str) -> Result<Option<Row>, LockError> {
        let mut slot = self.conn.lock().await;
        self.run_in(&mut slot, &Sql::Text(sql.to_owned()), doing)
            .await
            .map(|mut rows| rows.pop())
    }
}

/// What a session runs: SQL text (one or more statements), or one statement prepared once per
/// connection (mysql_async's statement cache) with its parameters: no parsing on the server.
pub(crate) enum Sql {
    Text(String),
    Prepared(&'static str, Vec<Value>),
}

/// The rows of the last result set of `result` that has any.
async fn last_rows<P: mysql_async::prelude::Protocol>(
    mut result: mysql_async::QueryResult<'_, 'static, P>,
) -> Result<Vec<Row>, mysql_async::Error> {
    let mut last = Vec::new();
    while !result.is_empty() {
        let rows: Vec<Row> = result.collect().await?;
        if !rows.is_empty() {
            last = rows;
        }
    }
    Ok(last)
}

/// A statement on a session: `build` writes it once the connection is free (so statements run
/// in the order they were built, which the idle timeouts they set rely on).
///
/// It runs in the caller's task; if the caller is dropped half-way, the rest of it goes on in a
/// task of its own, since a statement cut off half-way would leave the connection's state
/// unknown (and end the session, with every lock on it).
pub(super) async fn on_session(
    session: &Arc<MySession>,
    build: impl FnOnce() -> Sql,
    doing: &'static str,
) -> Result<Option<Row>, LockError> {
    on_session_all(session, build, doing)
        .await
        .map(|mut rows| rows.pop())
}

/// As [`on_session`], with every row of the last result set that has any.
pub(super) async fn on_session_all(
    session: &Arc<MySession>,
    build: impl FnOnce() -> Sql,
    doing: &'static str,
) -> Result<Vec<Row>, LockError> {
    let mut slot = session.conn.clone().lock_owned().await;
    let sql = build();
    let session = session.clone();
    let mut statement = Detached(Some(Box::pin(async move {
        session.run_in(&mut slot, &sql, doing).await
    })));
    let out = std::future::poll_fn(|cx| match statement.0.as_mut() {
        Some(f) => f.as_mut().poll(cx),
        None => std::task::Poll::Pending,
    })
    .await;
    statement.0 = None;
    out
}

type Statement = std::pin::Pin<Box<dyn Future<Output = Result<Vec<Row>, LockError>> + Send>>;

/// A statement in flight: finished in a task of its own if dropped before it completes.
struct Detached(Option<Statement>);

impl Drop for Detached {
    fn drop(&mut self) {
        if let Some(rest) = self.0.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(rest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_timeouts_round_up() {
        assert_eq!(wait_secs(Duration::from_millis(300)), 1);
        assert_eq!(wait_secs(Duration::from_millis(1500)), 2);
        assert_eq!(wait_secs(Duration::from_secs(30)), 30);
    }
}
