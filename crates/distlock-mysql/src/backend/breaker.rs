//! Breaking a lock (`Breaker`): the holding connection killed, which frees every lock on it.

use std::time::Duration;

use distlock_core::engine::{BreakOutcome, Breaker, ErrorKind, LockError};
use distlock_core::recipes::shares_unbreakable;

use super::{MysqlBackend, dedicated, int, lock_name, name_lit};

#[distlock_core::engine::async_trait]
impl Breaker for MysqlBackend {
    /// Kills the holding connection (`KILL CONNECTION`), which frees the lock and every other
    /// lock on that connection, and waits (up to 5 s) until the server has let it go. Needs the
    /// right to kill that connection (the same user, or `CONNECTION ADMIN`/`SUPER`).
    async fn break_once(&self, key: &str) -> Result<BreakOutcome, LockError> {
        self.kill_holder(key).await
    }
}

impl MysqlBackend {
    async fn kill_holder(&self, key: &str) -> Result<BreakOutcome, LockError> {
        const DOING: &str = "breaking a MySQL lock";
        let st = self.lock_status(key).await?;
        if !st.held {
            if self.inner.pool.ops().server.ctes && self.semaphore_status(key).await?.held {
                return Err(shares_unbreakable(key, "a semaphore's permits"));
            }
            return Ok(BreakOutcome::Free);
        }
        let who = format!("SELECT IS_USED_LOCK({})", name_lit(&lock_name(key)));
        // A connection of its own: the holder may be a session of this very pool.
        let session = dedicated(&self.inner.pool.ops().config).await?;
        let row = session.run(&who, DOING).await?;
        let Some(id) = row.as_ref().and_then(|r| int(r, 0)) else {
            return Ok(BreakOutcome::Free);
        };
        if let Err(e) = session.run(&format!("KILL CONNECTION {id}"), DOING).await
            && e.kind() != ErrorKind::Protocol
        {
            // Refused (`Auth`), or our connection failed. (`Protocol`: most likely the
            // holder's connection ended meanwhile; the check below tells.)
            return Err(e);
        }
        for _ in 0..50 {
            let now = session.run(&who, DOING).await?;
            if now.as_ref().and_then(|r| int(r, 0)) != Some(id) {
                return Ok(BreakOutcome::Broken(st));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(LockError::new(
            ErrorKind::Timeout,
            format!("{DOING}: connection {id} was killed but still held the lock after 5 s"),
        ))
    }
}
