//! Release events: `LISTEN` on a session of its own, `NOTIFY` from the release statements.
//!
//! A release (`pg_advisory_unlock`, a reader's or a permit's, a downgrade's) sends
//! `pg_notify('distlock:<lock id>', '')` in its own statement when somebody may wait for the
//! lock: when a waiter's marker is held (see `marker`), which a waiter takes with its ticket in
//! `distlock_waiters` (see `order`). Only a waiter that tried once and found the lock busy
//! takes a ticket, so an uncontended cycle sends no notification, and its check is one probe of
//! the lock table. PostgreSQL delivers a notification when its transaction commits, so a
//! waiter that hears it finds the lock free.
//!
//! Each client listens on one session that it opens when its first waiter subscribes, with one
//! channel per lock id that has waiters here ([`WakeHub`] multiplexes them). The session is
//! opened again when it ends, and every waiter is woken then, since events may have been missed.
//!
//! What no statement sends: a holder's session that ends (killed, timed out, cut off) frees its
//! locks without a notification. [`WakeSource::hears_every_release`] says so, and waiters keep
//! their back-off between attempts; an event only cuts a pause short.
//!
//! [`WakeSource::hears_every_release`]: distlock_core::engine::WakeSource::hears_every_release

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use distlock_core::engine::{LeaseKind, LockError, Subscription};
use distlock_core::engine::{Listener as Who, WakeSource};
use distlock_core::recipes::{MutexExt, WakeHub};
use tokio::sync::{mpsc, oneshot};

use super::{PgBackend, PgConn, PgOps, PgShared, connect, lock_id, marker, order, permits};
use crate::error::map_err;

/// The prefix of a lock's notification channel; the lock id follows, in decimal.
pub(super) const CHANNEL: &str = "distlock:";

/// The part of a release statement that notifies the channel `{channel}` when the marker
/// `({k1}, {k2})` is held (somebody may wait: see `marker`), and `freed` where given (what it
/// released frees the lock for somebody). The channel is a parameter, so that the statement
/// has no expression to set up for it.
pub(super) fn notify_sql(freed: Option<&str>, k1: &str, k2: &str, channel: &str) -> String {
    let freed = freed.map(|f| format!("{f} AND ")).unwrap_or_default();
    format!(
        "CASE WHEN {freed}{} THEN pg_notify({channel}::text, '') END",
        marker::waiting_sql(k1, k2)
    )
}

impl PgOps {
    /// Runs a release statement for the lock id `id` (`$1`, then its marker and channel, see
    /// [`notify_sql`]).
    ///
    /// # Errors
    /// The server's, or `Timeout`.
    pub(super) async fn unlock_notifying(
        &self,
        conn: &PgConn,
        statement: &tokio_postgres::Statement,
        id: i64,
        doing: &str,
    ) -> Result<tokio_postgres::Row, LockError> {
        let (k1, k2) = marker::key(id);
        let channel = format!("{CHANNEL}{id}");
        let limit = self.config.response_timeout;
        tokio::time::timeout(
            limit,
            conn.client.query_one(statement, &[&id, &k1, &k2, &channel]),
        )
        .await
        .map_err(|_| marker::timeout(doing, limit))?
        .map_err(|e| map_err(e, doing))
    }
}

/// What the listening task is asked to do, in the order the hub asked.
enum Cmd {
    Listen(String),
    Unlisten(String),
}

/// The listening task's inputs: the hub's requests, and the engine's end.
type Start = (mpsc::UnboundedReceiver<Cmd>, oneshot::Receiver<()>);

/// This client's listening session, started by the first subscription.
pub(super) struct Listener {
    hub: WakeHub,
    /// The task's inputs until it starts.
    start: Mutex<Option<Start>>,
    /// Dropped with the engine, which stops the task.
    _stop: oneshot::Sender<()>,
}

impl Listener {
    pub(super) fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let on_last = tx.clone();
        let (stop, stopped) = oneshot::channel();
        Listener {
            // Called under the hub's lock, in order: the task sees them in that order.
            hub: WakeHub::new(
                move |key| {
                    let _ = tx.send(Cmd::Listen(key.to_owned()));
                },
                move |key| {
                    let _ = on_last.send(Cmd::Unlisten(key.to_owned()));
                },
            ),
            start: Mutex::new(Some((rx, stopped))),
            _stop: stop,
        }
    }
}

/// The hub's key of a lock id.
fn key_of(id: i64) -> String {
    id.to_string()
}

/// The `LISTEN` or `UNLISTEN` of a hub key (a lock id).
fn statement(verb: &str, key: &str) -> String {
    // A decimal id: nothing to escape inside the quotes.
    format!("{verb} \"{CHANNEL}{key}\"")
}

/// The pause before opening the listening session again: 100 ms doubling to 5 s.
fn reconnect_delay(failures: u32) -> Duration {
    Duration::from_millis(100)
        .saturating_mul(1u32 << failures.min(6))
        .min(Duration::from_secs(5))
}

/// Listens for the hub's keys while the engine lives.
async fn run(engine: Weak<PgShared>, hub: WakeHub, mut cmds: mpsc::UnboundedReceiver<Cmd>) {
    let mut failures = 0u32;
    loop {
        let Some(inner) = engine.upgrade() else {
            return;
        };
        let backend = PgBackend { inner };
        let heard_hub = hub.clone();
        let (ended_tx, mut ended) = oneshot::channel();
        let opened = connect(
            backend.config(),
            backend.tls(),
            move |why| {
                let _ = ended_tx.send(why);
            },
            Some(Box::new(move |channel: &str| {
                if let Some(key) = channel.strip_prefix(CHANNEL) {
                    heard_hub.notify(key);
                }
            })),
        )
        .await;
        let response_timeout = backend.config().response_timeout;
        drop(backend);
        let (client, task) = match opened {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(target: "distlock", error = %e,
                    "cannot open PostgreSQL's listening session; waiters back off");
                tokio::time::sleep(reconnect_delay(failures)).await;
                failures = failures.saturating_add(1);
                continue;
            }
        };
        failures = 0;
        let send = |sql: String| {
            let client = &client;
            async move {
                tokio::time::timeout(response_timeout, client.batch_execute(&sql))
                    .await
                    .map_err(|_| ())?
                    .map_err(|_| ())
            }
        };
        // Whatever was asked before, the keys that have subscribers now.
        while cmds.try_recv().is_ok() {}
        let mut broken = false;
        for key in hub.keys() {
            if send(statement("LISTEN", &key)).await.is_err() {
                broken = true;
                break;
            }
            hub.set_confirmed(&key, true);
        }
        // Releases while nobody listened went unheard.
        hub.notify_all();
        while !broken {
            tokio::select! {
                cmd = cmds.recv() => match cmd {
                    None => {
                        task.abort();
                        return;
                    }
                    Some(Cmd::Listen(key)) => {
                        if send(statement("LISTEN", &key)).await.is_ok() {
                            hub.set_confirmed(&key, true);
                        } else {
                            broken = true;
                        }
                    }
                    Some(Cmd::Unlisten(key)) => {
                        broken = send(statement("UNLISTEN", &key)).await.is_err();
                    }
                },
                _ = &mut ended => broken = true,
            }
        }
        // A statement that failed or went unanswered: the session cannot be trusted.
        task.abort();
        hub.unconfirm_all();
        hub.notify_all();
        tokio::time::sleep(reconnect_delay(failures)).await;
        failures = failures.saturating_add(1);
        if engine.strong_count() == 0 {
            return;
        }
    }
}

impl PgBackend {
    /// A subscription to the lock id `id`'s release events, once the server listens; for the
    /// waiter `waiter` (its token and kind), with its ticket taken meanwhile.
    async fn subscribe_id(&self, id: i64, waiter: Option<(&str, LeaseKind)>) -> Subscription {
        let listener = &self.inner.listener;
        let start = listener.start.locked().take();
        if let Some((cmds, stopped)) = start {
            let task = run(Arc::downgrade(&self.inner), listener.hub.clone(), cmds);
            tokio::spawn(async move {
                tokio::select! {
                    () = task => {}
                    _ = stopped => {}
                }
            });
        }
        let mut sub = listener.hub.subscribe(&key_of(id));
        // A waiter subscribes after a busy attempt, and takes its place in the queue while the
        // server sets up the LISTEN, not after it: a fresh client's first waiter otherwise paid
        // two connects in a row (the listening session's, then the queue session's) before it
        // had a place, and a waiter that came later, on a client with both open, went ahead.
        // No release is missed meanwhile: the waiter tries again once this returns. A failure
        // is met again, and reported, by the ticket's call at that attempt.
        let place = async {
            if let Some((token, kind)) = waiter
                && self.ticket_seq(token).is_none()
                && let Err(e) = self.ticket(token, kind, order::GRACE_MIN, id).await
            {
                tracing::debug!(target: "distlock", id, error = %e,
                    "no ticket for a PostgreSQL waiter as it subscribed: its next attempt tries");
            }
        };
        let (confirmed, ()) = tokio::join!(sub.confirmed(self.config().response_timeout), place);
        if !confirmed {
            tracing::debug!(target: "distlock", id,
                "LISTEN not confirmed in time; the wait backs off as without events");
        }
        sub
    }
}

/// The id a waiter of `kind` on `name` listens on and takes its ticket for: a permit's, its
/// semaphore's base id.
fn waited_id(name: &str, kind: LeaseKind) -> i64 {
    match kind {
        LeaseKind::Permit { .. } => permits::permit_base(name),
        _ => lock_id(name),
    }
}

#[distlock_core::engine::async_trait]
impl WakeSource for PgBackend {
    /// A permit's waiter listens on its semaphore's base id, which its ticket names; a waiter
    /// takes its ticket while the server sets up the LISTEN (see `subscribe_id`).
    async fn subscribe(&self, name: &str, who: Who<'_>) -> Result<Option<Subscription>, LockError> {
        let (id, ticket) = match who {
            Who::Waiter { kind, token } => (waited_id(name, kind), Some((token, kind))),
            _ => (lock_id(name), None),
        };
        Ok(Some(self.subscribe_id(id, ticket).await))
    }

    fn watching(&self, name: &str) -> bool {
        self.inner.listener.hub.is_confirmed(&key_of(lock_id(name)))
    }

    /// A holder's session that ends frees its locks without a notification.
    fn hears_every_release(&self) -> bool {
        false
    }
}
