//! Readers of a read-write lock on Redis. The writer is the plain lock; readers hold the lock key
//! with a marker, each share a member of a sorted set scored with its deadline on the server's
//! clock; readers and writers wait in the one queue of the lock, served in arrival order (see
//! `scripts/read_acquire.lua` and `pass_on` in `scripts/queue.lua`).

use std::time::Duration;

use distlock_core::engine::{
    AcquireRequest, Attempt, Downgrade, ErrorKind, LeaseCheck, LeaseRef, LockError, Token,
};
use distlock_core::recipes::{HolderValue, MutexExt};

use super::RedisBackend;
use super::permits::PermitKeys;
use crate::handover::registration;
use crate::replies::ReadReply;
use crate::scripts::{ttl_ms, unix_ms};

/// The readers' sorted set of the lock whose key is `lock`.
pub(super) fn readers_key(lock: &str) -> String {
    format!("{lock}:readers")
}

impl RedisBackend {
    /// One attempt at a reader's share.
    pub(super) async fn acquire_shared(
        &self,
        req: &AcquireRequest<'_>,
    ) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a Redis read lock";
        let keys = self.layout.keys(req.name);
        let token = req.token.as_str();
        let wake = self.wake.for_lock(keys.lock());
        // Queue only while subscribed to wake-ups: a release lets queued readers in and tells
        // them.
        let mine = if req.mode.waits() && self.subscriber.is_watching(req.name) {
            let reg = registration(&wake, req.ttl, 0, token, &format!("~r {}", req.owner));
            self.reader_regs
                .locked()
                .insert(token.to_owned(), reg.clone());
            reg
        } else {
            self.reader_regs
                .locked()
                .get(token)
                .cloned()
                .unwrap_or_default()
        };
        let readers = readers_key(keys.lock());
        let permits = PermitKeys::new(keys.lock().to_owned());
        let mut ttl = itoa::Buffer::new();
        let mut now = itoa::Buffer::new();
        let holder = HolderValue::now(token, req.owner).encode();
        let (reply, acks) = self
            .conn
            .run_waited(
                &self.scripts.read_acquire,
                &[
                    keys.lock(),
                    keys.meta(),
                    keys.waiters(),
                    keys.fence(),
                    &readers,
                    permits.holders(),
                ],
                &[
                    token,
                    ttl.format(ttl_ms(req.ttl)),
                    &mine,
                    now.format(unix_ms()),
                    &wake,
                    &holder,
                ],
                DOING,
            )
            .await?;
        match reply {
            ReadReply::Acquired { fence } => {
                self.reader_regs.locked().remove(token);
                if let (Some(wait), Some(acks)) = (self.conn.wait, acks)
                    && let Err(e) = wait.check(acks)
                {
                    // Taken here, not known to be on the replicas: give it back.
                    let _ = self.release_shared(req.name, req.token).await;
                    return Err(e);
                }
                Ok(Attempt::Acquired { fence: Some(fence) })
            }
            ReadReply::Busy { holder_ttl } => Ok(Attempt::Busy { holder_ttl }),
            ReadReply::SemaphoreHeld => Err(LockError::new(
                ErrorKind::KindConflict,
                format!(
                    "{:?} is in use as a semaphore, and was asked for as a read-write lock",
                    req.name
                ),
            )),
        }
    }

    /// Renews our share of `name`, if it is still ours.
    pub(super) async fn renew_shared(
        &self,
        name: &str,
        token: &Token,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "renewing a Redis read lock";
        let lock = self.layout.lock_key(name);
        let readers = readers_key(&lock);
        self.renew_by(
            &self.scripts.read_extend,
            &[&lock, &readers],
            (token, None),
            ttl,
            DOING,
        )
        .await
    }

    /// Gives our share of `name` back (the last reader out hands the lock on), and takes our
    /// registration out of the queue if a wait of ours left one.
    pub(super) async fn release_shared(
        &self,
        name: &str,
        token: &Token,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "releasing a Redis read lock";
        let keys = self.layout.keys(name);
        let mine = self
            .reader_regs
            .locked()
            .remove(token.as_str())
            .unwrap_or_default();
        let readers = readers_key(keys.lock());
        let mut now = itoa::Buffer::new();
        self.conn
            .run(
                &self.scripts.read_release,
                &[
                    keys.lock(),
                    keys.meta(),
                    keys.waiters(),
                    keys.fence(),
                    &readers,
                ],
                &[token.as_str(), now.format(unix_ms()), &mine],
                DOING,
            )
            .await
    }
}

impl RedisBackend {
    /// Turns our writer's hold of `name` into a reader's share (`scripts/downgrade.lua`).
    async fn downgrade_inner(
        &self,
        name: &str,
        token: &Token,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "downgrading a Redis write lock to a read lock";
        let keys = self.layout.keys(name);
        let readers = readers_key(keys.lock());
        let mut ttl_ms_buf = itoa::Buffer::new();
        let mut now = itoa::Buffer::new();
        let (check, acks) = self
            .conn
            .run_waited(
                &self.scripts.downgrade,
                &[
                    keys.lock(),
                    keys.meta(),
                    keys.waiters(),
                    keys.fence(),
                    &readers,
                ],
                &[
                    token.as_str(),
                    ttl_ms_buf.format(ttl_ms(ttl)),
                    now.format(unix_ms()),
                ],
                DOING,
            )
            .await?;
        if let (LeaseCheck::Ours, Some(wait), Some(acks)) = (check, self.conn.wait, acks) {
            // Not known to be on the replicas: the guard stays a writer, whose renewals will
            // find the lock a reader's and report it lost if the downgrade stands.
            wait.check(acks)?;
        }
        Ok(check)
    }
}

#[distlock_core::engine::async_trait]
impl Downgrade for RedisBackend {
    async fn downgrade(
        &self,
        lease: &LeaseRef<'_>,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        self.downgrade_inner(lease.name, lease.token, ttl).await
    }
}
