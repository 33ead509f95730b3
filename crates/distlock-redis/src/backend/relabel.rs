//! A new label for a holder, the lock kept (`scripts/relabel.lua`): an election's leader
//! publishing a new value.

use distlock_core::engine::{LeaseCheck, LeaseRef, LockError, Relabel};

use super::RedisBackend;

#[distlock_core::engine::async_trait]
impl Relabel for RedisBackend {
    async fn relabel(&self, lease: &LeaseRef<'_>, owner: &str) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "writing a new label for a Redis lock's holder";
        let (check, acks) = self
            .conn
            .run_waited(
                &self.scripts.relabel,
                &[&self.layout.lock_key(lease.name)],
                &[lease.token.as_str(), owner],
                DOING,
            )
            .await?;
        if let (LeaseCheck::Ours, Some(wait), Some(acks)) = (check, self.conn.wait, acks) {
            wait.check(acks)?;
        }
        Ok(check)
    }
}
