//! What `status` and `distlock list` read: a lock's holders (the writer, readers or a
//! semaphore's permits), its fences and its waiters, in one script (`scripts/status.lua`); and
//! the names in use (`Lister`, by `SCAN`: see `list`).

use distlock_core::engine::{HolderStatus, LeaseKind, Lister, LockError, LockStatus, Names};
use distlock_core::recipes::HolderValue;

use super::{RedisBackend, permits, readers};
use crate::replies::StatusReply;

impl RedisBackend {
    /// The lock's status and its holder's token (the first word of the lock key's value).
    pub(super) async fn holder(
        &self,
        key: &str,
    ) -> Result<(LockStatus, Option<String>), LockError> {
        const DOING: &str = "reading a Redis lock's status";
        let keys = self.layout.keys(key);
        let readers = readers::readers_key(keys.lock());
        let permits = permits::PermitKeys::new(keys.lock().to_owned());
        let reply = self
            .conn
            .run(
                &self.scripts.status,
                &[
                    keys.lock(),
                    keys.meta(),
                    keys.fence(),
                    keys.waiters(),
                    &readers,
                    permits.holders(),
                    permits.meta(),
                    permits.queue(),
                ],
                &[],
                DOING,
            )
            .await?;
        Ok(match reply {
            StatusReply::Free {
                last_fence,
                waiters,
            } => (
                LockStatus::free()
                    .with_last_fence(last_fence)
                    .with_waiters(Some(waiters)),
                None,
            ),
            StatusReply::Held {
                ttl,
                value,
                meta_token,
                holder_fence,
                last_fence,
                waiters,
            } => {
                let (owner, fence) = describe_holder(&value, &meta_token, holder_fence);
                let token =
                    Some(HolderValue::parse(&value).token.to_owned()).filter(|t| !t.is_empty());
                (
                    LockStatus::held(Some(owner), fence, ttl)
                        .with_holder(LeaseKind::Exclusive, token.clone())
                        .with_last_fence(last_fence)
                        .with_waiters(Some(waiters)),
                    token,
                )
            }
            StatusReply::Shared {
                permits,
                holders,
                last_fence,
                waiters,
            } => {
                let kind = match permits {
                    Some(permits) => LeaseKind::Permit { permits },
                    None => LeaseKind::Shared,
                };
                let holders = holders
                    .into_iter()
                    .map(|h| {
                        let label =
                            (!h.value.is_empty()).then(|| HolderValue::parse(&h.value).label());
                        HolderStatus::new(kind)
                            .token(Some(h.token))
                            .owner(label)
                            .fence(h.fence)
                            .ttl(h.ttl)
                    })
                    .collect();
                (
                    LockStatus::held_by(holders)
                        .with_last_fence(last_fence)
                        .with_waiters(Some(waiters)),
                    None,
                )
            }
        })
    }
}

/// The holder's label and fence, from the lock key's value and what the meta hash recorded.
fn describe_holder(
    value: &str,
    meta_token: &str,
    meta_fence: Option<u64>,
) -> (String, Option<u64>) {
    let holder = HolderValue::parse(value);
    let fence = meta_fence.filter(|_| !holder.token.is_empty() && holder.token == meta_token);
    (holder.label(), fence)
}

/// `SCAN` over the server, or over every master of a Cluster (see `list`).
#[distlock_core::engine::async_trait]
impl Lister for RedisBackend {
    async fn names(&self, prefix: &str, budget: usize) -> Result<Names, LockError> {
        crate::list::names(&self.conn, &self.layout, prefix, budget).await
    }
}
