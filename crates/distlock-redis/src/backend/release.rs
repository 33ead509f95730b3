//! Releasing a lock: compare-and-delete, or the hand-over to the next queued client, in one
//! script (`scripts/release.lua`); with `Handover`, this client stays in the queue for its
//! next waiter. And undoing a lock taken in vain (unreplicated with `WAIT`, or half taken).

use distlock_core::engine::{Handover, LeaseCheck, LeaseRef, LockError, NextWaiter, Token};

use super::RedisBackend;
use crate::config::WaitReplicas;
use crate::connection::{Acks, ScriptCall};
use crate::error::unexpected;
use crate::handover::registration;
use crate::scripts::unix_ms;

impl RedisBackend {
    /// Releases a lock this client has just taken and must not keep (if that fails, it expires
    /// with its TTL).
    pub(super) async fn undo(&self, key: &str, token: &Token) {
        if let Err(e) = self.release_inner(key, token, None).await {
            tracing::warn!(target: "distlock", key, error = %e,
                "could not undo a lock taken in vain; it expires with its TTL");
        }
    }

    /// With `WAIT`: releases a lock just taken or renewed (and errs) unless enough replicas
    /// acknowledged it. A lock whose copy may be missing on the replicas is not reported held.
    pub(super) async fn undo_unreplicated(
        &self,
        key: &str,
        token: &Token,
        wait: WaitReplicas,
        acks: Acks,
    ) -> Result<(), LockError> {
        let Err(e) = wait.check(acks) else {
            return Ok(());
        };
        self.undo(key, token).await;
        Err(e)
    }

    /// Compare-and-delete, or hand-over to the next queued client; with `next`, this client
    /// stays in the queue (or joins its back) in the same script, registered for `next` (its
    /// tasks still wait).
    pub(super) async fn release_inner(
        &self,
        key: &str,
        token: &Token,
        next: Option<&NextWaiter<'_>>,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "releasing a Redis lock";
        let next = next.filter(|_| self.subscriber.is_watching(key));
        let plan = self
            .handovers
            .plan_release(key, token.as_str(), next.map(|n| n.ttl));
        let (call, mine) = self.layout.with_keys(key, |keys| {
            let wake = self.wake.for_lock(keys.lock());
            let mine = next.map_or_else(String::new, |n| {
                registration(&wake, n.ttl, plan.seq, n.token.as_str(), n.owner)
            });
            // Nothing but the token and the clock in the common case: the script needs no
            // more.
            let mut now = itoa::Buffer::new();
            let full = [
                token.as_str(),
                now.format(unix_ms()),
                mine.as_str(),
                plan.believed.as_str(),
                &wake,
            ];
            let args = if mine.is_empty() && plan.believed.is_empty() {
                &full[..2]
            } else {
                &full[..]
            };
            let keys = [keys.lock(), keys.meta(), keys.waiters(), keys.fence()];
            let call = ScriptCall::new(&self.scripts.release, &keys, args, plan.lead);
            (call, mine)
        });
        let reply = self
            .conn
            .run_call(&self.scripts.release, &call, DOING)
            .await?;
        self.handovers
            .released(key, &reply, plan, mine, next.map(|n| n.token.as_str()))
            .ok_or_else(|| unexpected(DOING, reply))
    }
}

#[distlock_core::engine::async_trait]
impl Handover for RedisBackend {
    async fn release_requeue(
        &self,
        lease: &LeaseRef<'_>,
        next: &NextWaiter<'_>,
    ) -> Result<LeaseCheck, LockError> {
        self.release_inner(lease.name, lease.token, Some(next))
            .await
    }
}
