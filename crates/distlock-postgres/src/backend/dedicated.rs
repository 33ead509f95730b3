//! Sessions of their own, beside the pool's: opened when needed, a few kept idle between uses.

use distlock_core::engine::{LockError, LostReason};
use distlock_core::recipes::MutexExt;
use tokio::sync::watch;
use tokio_postgres::Client;

use super::{PgBackend, connect};

/// How many dedicated sessions (transaction-scoped locks, breaking) are kept open between uses.
const DEDICATED_IDLE: usize = 2;

/// A session of its own (a transaction-scoped lock, breaking a lock, the first checks, the
/// waiters' queue).
pub(crate) struct Conn {
    pub(crate) client: Client,
    /// Set when the session ends.
    ended: watch::Receiver<Option<LostReason>>,
    task: tokio::task::AbortHandle,
}

impl Conn {
    pub(super) fn is_closed(&self) -> bool {
        self.client.is_closed() || self.ended.borrow().is_some()
    }

    /// Ends the session.
    pub(super) fn close(&self) {
        self.task.abort();
    }
}

impl PgBackend {
    /// Opens a session of its own.
    pub(super) async fn open(&self) -> Result<Conn, LockError> {
        let (tx, rx) = watch::channel(None);
        let (client, task) = connect(
            self.config(),
            self.tls(),
            move |why| {
                let _ = tx.send(Some(why));
            },
            None,
        )
        .await?;
        Ok(Conn {
            client,
            ended: rx,
            task,
        })
    }

    /// An idle session of its own, or a new one.
    pub(crate) async fn take(&self) -> Result<Conn, LockError> {
        loop {
            let next = self.inner.dedicated.locked().pop();
            match next {
                Some(c) if c.is_closed() => continue,
                Some(c) => return Ok(c),
                None => return self.open().await,
            }
        }
    }

    /// Returns a session of its own, holding no lock, for the next use (or closes it).
    pub(crate) fn put_back(&self, conn: Conn) {
        if conn.is_closed() {
            return;
        }
        let mut idle = self.inner.dedicated.locked();
        if idle.len() < DEDICATED_IDLE {
            idle.push(conn);
        }
    }
}
