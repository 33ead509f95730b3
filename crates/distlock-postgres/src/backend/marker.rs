//! Whether anybody waits for a lock, for the price of one probe of the lock table: markers.
//!
//! The arrival-order check on `distlock_waiters` (see `order`) cost an uncontended acquire more
//! than the lock itself: PostgreSQL sets up the table's scan at every execution of a statement
//! that names it, whether or not the scan runs or finds a ticket (and the release's check for
//! waiters to notify cost as much again). So a client that holds a live ticket for a lock id
//! also holds a *marker*: a shared session-level advisory lock on two int4 keys made from the id
//! ([`key`]), on a session of its own, its queue session, which writes the client's tickets and
//! never runs an acquire. An attempt without a ticket probes the marker with
//! `pg_try_advisory_xact_lock` (exclusive, until its transaction ends) in the statement that
//! tries the lock: granted, nobody waits and the lock is tried; refused, somebody may wait, and
//! the ordered statement, which reads the tickets, decides. A release notifies the lock's
//! channel when the same probe is refused.
//!
//! Why nobody is passed: a waiter takes its marker before it writes its ticket, and gives it
//! back only once its ticket is deleted or has lapsed for [`LINGER`]. An attempt that got the
//! marker holds it until its transaction commits, so a marker asked for meanwhile is granted
//! after that commit: that waiter's ticket comes after the attempt, which arrived first. A
//! session's own locks never conflict with each other, hence a session of its own for the
//! markers. The int4 pair space keeps markers apart from the locks' bigint ids; the first key
//! has its top bit set, which a semaphore's size lock never has (see `permits::size_key`). Two ids
//! that differ only in that bit share a marker: an attempt then reads the tickets for nothing.
//!
//! The queue session's end (the server restarted it, a reset connection) ends its markers: each
//! waiter takes its marker again at its next attempt, and until then an attempt without a ticket
//! can pass it. A waiter whose process died holds nobody back from then on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use distlock_core::engine::{ErrorKind, LockError};
use distlock_core::recipes::MutexExt;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_postgres::Statement;

use super::{Conn, PgBackend, PgShared};
use crate::error::map_err;

/// How long a marker outlives its ticket's lapse (as its client reckons it) when its waiter
/// neither deletes the ticket nor tries again: a release still notifies that long, as the
/// release statement did when it read the tickets (a waiter's pause may outgrow its ticket).
pub(super) const LINGER: Duration = Duration::from_secs(60);

/// The queue session's `idle_session_timeout`: a client that sends nothing on it for this long
/// (paused while it waits) loses its markers.
const QUEUE_IDLE: Duration = Duration::from_secs(600);

/// The marker of the lock id `id`: its high half with the top bit set, and its low half.
pub(super) fn key(id: i64) -> (i32, i32) {
    let [a, b, c, d, e, f, g, h] = id.to_be_bytes();
    (
        i32::from_be_bytes([a | 0x80, b, c, d]),
        i32::from_be_bytes([e, f, g, h]),
    )
}

/// The probe of the marker `($k1, $k2)` in a statement: true when somebody may wait.
pub(super) fn waiting_sql(k1: &str, k2: &str) -> String {
    format!("NOT pg_try_advisory_xact_lock({k1}::int, {k2}::int)")
}

/// The ticket statements, prepared on the queue session.
pub(super) struct QueueSql {
    /// Takes the marker `($1, $2)` (waits for an attempt probing it to commit).
    pub(super) mark: Statement,
    /// Gives back the marker `($1, $2)`.
    pub(super) unmark: Statement,
    /// A new ticket for `$1` of kind `$2` living `$3` ms; returns its number.
    pub(super) insert: Statement,
    /// Ticket `($1, $2)` lives `$3` ms from now.
    pub(super) keep: Statement,
    /// Deletes ticket `($1, $2)`.
    pub(super) delete: Statement,
    /// Deletes ticket `($1, $2)` and gives back the marker `($3, $4)`.
    pub(super) leave: Statement,
}

/// A client's queue session, with its statements.
pub(super) struct QueueSession {
    pub(super) conn: Conn,
    /// Which session of the client this is (markers held on an earlier one are gone).
    pub(super) generation: u64,
    pub(super) sql: QueueSql,
}

/// A client's queue session, opened with its first ticket and again after it ends, and the
/// task that gives back the markers of lapsed tickets.
pub(super) struct Queue {
    session: tokio::sync::Mutex<Option<Arc<QueueSession>>>,
    opened: AtomicU64,
    /// A ticket's deadline moved (wakes the sweeper).
    changed: Arc<Notify>,
    /// The sweeper's end, until it starts.
    stopped: Mutex<Option<oneshot::Receiver<()>>>,
    /// Dropped with the engine, which stops the sweeper.
    _stop: oneshot::Sender<()>,
}

impl Queue {
    pub(super) fn new() -> Self {
        let (stop, stopped) = oneshot::channel();
        Queue {
            session: tokio::sync::Mutex::new(None),
            opened: AtomicU64::new(0),
            changed: Arc::new(Notify::new()),
            stopped: Mutex::new(Some(stopped)),
            _stop: stop,
        }
    }

    /// Wakes the sweeper: a marked ticket's deadline moved.
    pub(super) fn changed(&self) {
        self.changed.notify_one();
    }
}

impl PgBackend {
    /// The queue session, opened (and the sweeper started) if there is none alive.
    ///
    /// # Errors
    /// The server's, opening it.
    pub(super) async fn queue_session(&self) -> Result<Arc<QueueSession>, LockError> {
        const DOING: &str = "opening PostgreSQL's queue session";
        let queue = &self.inner.queue;
        let mut session = queue.session.lock().await;
        if let Some(s) = session.as_ref().filter(|s| !s.conn.is_closed()) {
            return Ok(s.clone());
        }
        *session = None;
        // An idle session of the client's own (its first checks' one, say) saves a connect:
        // the first waiter of a client waits for this session before it has a place.
        let conn = self.take().await?;
        let s = &self.config().schema;
        let insert = format!(
            "WITH gone AS (DELETE FROM {s}.distlock_waiters \
                           WHERE lock_id = $1 AND until < now() - interval '1 minute') \
             INSERT INTO {s}.distlock_waiters (lock_id, kind, until) \
             VALUES ($1, $2, now() + $3::bigint * interval '1 millisecond') \
             RETURNING seq"
        );
        let keep = format!(
            "UPDATE {s}.distlock_waiters \
             SET until = now() + $3::bigint * interval '1 millisecond' \
             WHERE lock_id = $1 AND seq = $2"
        );
        let delete = format!("DELETE FROM {s}.distlock_waiters WHERE lock_id = $1 AND seq = $2");
        let leave = format!(
            "WITH gone AS (DELETE FROM {s}.distlock_waiters WHERE lock_id = $1 AND seq = $2) \
             SELECT pg_advisory_unlock_shared($3::int, $4::int)"
        );
        let idle = format!("SET idle_session_timeout = {}", super::ttl_ms(QUEUE_IDLE));
        let client = &conn.client;
        let prepared = async {
            client.batch_execute(&idle).await?;
            // In one round trip.
            let (mark, unmark, insert, keep, delete, leave) = tokio::try_join!(
                client.prepare("SELECT pg_advisory_lock_shared($1::int, $2::int)"),
                client.prepare("SELECT pg_advisory_unlock_shared($1::int, $2::int)"),
                client.prepare(&insert),
                client.prepare(&keep),
                client.prepare(&delete),
                client.prepare(&leave),
            )?;
            Ok::<_, tokio_postgres::Error>(QueueSql {
                mark,
                unmark,
                insert,
                keep,
                delete,
                leave,
            })
        };
        let sql = prepared.await.map_err(|e| map_err(e, DOING))?;
        let generation = queue.opened.fetch_add(1, Ordering::Relaxed) + 1;
        let opened = Arc::new(QueueSession {
            conn,
            generation,
            sql,
        });
        *session = Some(opened.clone());
        drop(session);
        let stopped = queue.stopped.locked().take();
        if let Some(stopped) = stopped {
            let sweeper = sweep(Arc::downgrade(&self.inner), queue.changed.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = sweeper => {}
                    _ = stopped => {}
                }
            });
        }
        Ok(opened)
    }

    /// The queue session if it is open (nothing is opened).
    pub(super) async fn queue_if_open(&self) -> Option<Arc<QueueSession>> {
        let session = self.inner.queue.session.lock().await;
        session.as_ref().filter(|s| !s.conn.is_closed()).cloned()
    }

    /// Gives back markers held on `q` (a session that does not answer is closed, which ends
    /// all its markers).
    pub(super) async fn unmark(&self, q: &Arc<QueueSession>, keys: &[(i32, i32)]) {
        let limit = self.config().response_timeout;
        for (k1, k2) in keys {
            let unsure = Unsure::new(q);
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [k1, k2];
            let given = q.conn.client.execute(&q.sql.unmark, &params);
            if !matches!(tokio::time::timeout(limit, given).await, Ok(Ok(_))) {
                return;
            }
            unsure.answered();
        }
    }
}

/// Closes a queue session, ending its markers, unless disarmed: for a ticket statement that
/// failed or was dropped half-way after it took or gave back a marker, whose count of marker
/// holds is then not known. (Giving one back blindly could end another waiter's hold of the
/// same marker: holds stack within a session.) Each waiter takes its marker again at its next
/// attempt, on the next queue session.
pub(super) struct Unsure {
    q: Arc<QueueSession>,
    armed: bool,
}

impl Unsure {
    pub(super) fn new(q: &Arc<QueueSession>) -> Self {
        Unsure {
            q: q.clone(),
            armed: true,
        }
    }

    /// The statement answered: the holds are known.
    pub(super) fn answered(mut self) {
        self.armed = false;
    }
}

impl Drop for Unsure {
    fn drop(&mut self) {
        if self.armed {
            self.q.conn.close();
        }
    }
}

/// Gives back the markers of tickets that lapsed [`LINGER`] ago, while the engine lives.
async fn sweep(engine: Weak<PgShared>, changed: Arc<Notify>) {
    loop {
        let next = {
            let Some(inner) = engine.upgrade() else {
                return;
            };
            let backend = PgBackend { inner };
            let due = backend.lapsed_markers(Instant::now());
            if !due.is_empty()
                && let Some(q) = backend.queue_if_open().await
            {
                let keys: Vec<_> = due
                    .iter()
                    .filter(|(generation, _)| *generation == q.generation)
                    .map(|(_, key)| *key)
                    .collect();
                backend.unmark(&q, &keys).await;
            }
            backend.next_lapse()
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at + LINGER) => {}
                    () = changed.notified() => {}
                }
            }
            None => changed.notified().await,
        }
    }
}

/// The error of a ticket statement that got no answer in time.
pub(super) fn timeout(doing: &str, limit: Duration) -> LockError {
    LockError::new(
        ErrorKind::Timeout,
        format!("{doing}: no answer within {limit:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_keeps_both_halves_and_sets_the_top_bit() {
        assert_eq!(key(0), (i32::MIN, 0));
        assert_eq!(key(1), (i32::MIN, 1));
        assert_eq!(key(-1), (-1, -1));
        let id = 0x1234_5678_9abc_def0_u64 as i64;
        assert_eq!(key(id), (0x9234_5678_u32 as i32, 0x9abc_def0_u32 as i32));
        // Never a semaphore's size key (whose first key is 31 bits).
        assert!(key(i64::MAX).0 < 0);
    }
}
