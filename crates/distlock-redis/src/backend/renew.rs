//! Renewing leases: one lease (`scripts/extend.lua`; a reader's or a permit's in their
//! modules), the watchdog's batch of every kind in one pipeline (`BatchRenew`), and a lease
//! left to run out (`Linger`), which is a renewal to the time left.

use std::time::Duration;

use distlock_core::engine::{
    Backend, BatchRenew, LeaseCheck, LeaseKind, LeaseRef, Linger, LockError, RenewItem,
};

use super::{RedisBackend, permits, readers};
use crate::connection::RenewCall;
use crate::scripts::ttl_ms;

impl RedisBackend {
    /// One lease's renewal (`Backend::renew`).
    pub(super) async fn renew_inner(
        &self,
        lease: &LeaseRef<'_>,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "extending a Redis lock";
        match lease.kind {
            LeaseKind::Permit { .. } => {
                return self.renew_permit(lease.name, lease.token, ttl).await;
            }
            LeaseKind::Shared => return self.renew_shared(lease.name, lease.token, ttl).await,
            _ => {}
        }
        let (key, token) = (lease.name, lease.token);
        let lock_key = self.layout.lock_key(key);
        let ms = ttl_ms(ttl).to_string();
        let (check, acks) = self
            .conn
            .run_waited(
                &self.scripts.extend,
                &[&lock_key],
                &[token.as_str(), &ms],
                DOING,
            )
            .await?;
        if let (Some(wait), Some(acks), LeaseCheck::Ours) = (self.conn.wait, acks, check) {
            // Renewed here, not known to be on the replicas: not a renewal to count on.
            wait.check(acks)?;
        }
        Ok(check)
    }
}

/// A lease of every kind lives in keys whose own expiry (and, for readers and permits, their
/// members' deadlines) ends it: leaving one is renewing it, compare-and-set, to the time left.
#[distlock_core::engine::async_trait]
impl Linger for RedisBackend {
    async fn linger(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        self.renew(lease, ttl).await
    }
}

#[distlock_core::engine::async_trait]
impl BatchRenew for RedisBackend {
    /// All renewals in one pipeline, locks, readers and permits alike: one round trip however
    /// many leases are held (on a Cluster, one per slot, sent together).
    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        const DOING: &str = "renewing Redis locks";
        if items.is_empty() {
            return Vec::new();
        }
        let calls: Vec<RenewCall<'_>> = items
            .iter()
            .map(|i| {
                let lock = self.layout.lock_key(i.lease.name);
                match i.lease.kind {
                    LeaseKind::Shared => {
                        let readers = readers::readers_key(&lock);
                        RenewCall {
                            script: &self.scripts.read_extend,
                            keys: vec![lock, readers],
                            extra: None,
                        }
                    }
                    LeaseKind::Permit { .. } => RenewCall {
                        script: &self.scripts.permit_extend,
                        keys: permits::PermitKeys::new(lock).four_owned(),
                        extra: Some(self.permit_member(i.lease.token)),
                    },
                    _ => RenewCall {
                        script: &self.scripts.extend,
                        keys: vec![lock],
                        extra: None,
                    },
                }
            })
            .collect();
        self.conn.renew_batch(&calls, items, DOING).await
    }
}
