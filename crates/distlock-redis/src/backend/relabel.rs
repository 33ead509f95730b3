//! A new label for a holder, the lock kept (`scripts/relabel.lua`): an election's leader
//! publishing a new value.

use distlock_core::engine::{BoxFuture, LeaseCheck, LeaseRef, LockError, Relabel};

use super::RedisBackend;

impl Relabel for RedisBackend {
    fn relabel<'a>(
        &'a self,
        lease: &'a LeaseRef<'a>,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>> {
        Box::pin(async move {
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
        })
    }
}
