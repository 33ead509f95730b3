//! Several names at once (`MultiLock`): one script takes them all or none
//! (`scripts/acquire_many.lua`), one renews them all (`extend_many.lua`), one releases them
//! (`release_many.lua`, which hands each name to the client queued for it, as a single
//! release does). On a Cluster the names must share a hash slot (one hash tag), since a script
//! runs on one node; names of several slots are refused with the way to tag them.

use std::time::Duration;

use distlock_core::engine::{
    AcquireMany, ErrorKind, LeaseCheck, LockError, ManyAttempt, MultiLock, Token,
};
use distlock_core::recipes::HolderValue;

use super::RedisBackend;
use crate::keys::{LockKeys, hashed_part};
use crate::replies::ManyReply;
use crate::scripts::{ttl_ms, unix_ms};

impl RedisBackend {
    /// Every name's keys; on a Cluster, refused unless they share a slot.
    fn many_keys(&self, names: &[&str]) -> Result<Vec<LockKeys>, LockError> {
        let keys: Vec<LockKeys> = names.iter().map(|n| self.layout.keys(n)).collect();
        if self.wake.is_sharded() {
            let part = |k: &LockKeys| hashed_part(k.lock()).to_owned();
            if let Some(first) = keys.first()
                && let Some(other) = keys.iter().position(|k| part(k) != part(first))
            {
                return Err(LockError::new(
                    ErrorKind::Unsupported,
                    format!(
                        "a Redis Cluster takes several names at once only when they share a hash \
                         slot, and {:?} and {:?} hash {:?} and {:?}: give the names one hash \
                         tag, such as \"order:{{42}}:a\" and \"order:{{42}}:b\"",
                        names[0],
                        names[other],
                        part(first),
                        part(&keys[other])
                    ),
                ));
            }
        }
        Ok(keys)
    }
}

/// The lock key and fence counter of each name, in order, as `acquire_many.lua` takes them.
fn lock_and_fence(keys: &[LockKeys]) -> Vec<&str> {
    keys.iter().flat_map(|k| [k.lock(), k.fence()]).collect()
}

/// The four keys of each name, in order, as `release_many.lua` takes them.
fn all_four(keys: &[LockKeys]) -> Vec<&str> {
    keys.iter()
        .flat_map(|k| [k.lock(), k.meta(), k.waiters(), k.fence()])
        .collect()
}

#[distlock_core::engine::async_trait]
impl MultiLock for RedisBackend {
    async fn acquire_all(&self, req: &AcquireMany<'_>) -> Result<ManyAttempt, LockError> {
        const DOING: &str = "taking several Redis locks";
        let keys = self.many_keys(req.names)?;
        let value = HolderValue::now(req.token.as_str(), req.owner).encode();
        let ttl = ttl_ms(req.ttl).to_string();
        let floors: Vec<String> = req
            .names
            .iter()
            .map(|n| self.seen.floor(n).to_string())
            .collect();
        let mut args = vec![req.token.as_str(), value.as_str(), ttl.as_str()];
        args.extend(floors.iter().map(String::as_str));
        let (reply, acks) = self
            .conn
            .run_waited(
                &self.scripts.acquire_many,
                &lock_and_fence(&keys),
                &args,
                DOING,
            )
            .await?;
        match reply {
            ManyReply::Acquired { fences } if fences.len() == req.names.len() => {
                if let (Some(wait), Some(acks)) = (self.conn.wait, acks) {
                    // Taken here, not known to be on the replicas: not a lock to count on (the
                    // core undoes it).
                    wait.check(acks)?;
                }
                for (name, fence) in req.names.iter().zip(&fences) {
                    self.seen.record(name, *fence);
                }
                Ok(ManyAttempt::Acquired {
                    fences: fences.into_iter().map(Some).collect(),
                })
            }
            ManyReply::Busy { name, holder_ttl } if name < req.names.len() => {
                Ok(ManyAttempt::Busy { name, holder_ttl })
            }
            other => Err(crate::error::unexpected(DOING, other)),
        }
    }

    async fn renew_all(
        &self,
        names: &[&str],
        token: &Token,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "renewing several Redis locks";
        let keys = self.many_keys(names)?;
        let locks: Vec<&str> = keys.iter().map(LockKeys::lock).collect();
        let ms = ttl_ms(ttl).to_string();
        let (check, acks) = self
            .conn
            .run_waited(
                &self.scripts.extend_many,
                &locks,
                &[token.as_str(), &ms],
                DOING,
            )
            .await?;
        if let (Some(wait), Some(acks), LeaseCheck::Ours) = (self.conn.wait, acks, check) {
            wait.check(acks)?;
        }
        Ok(check)
    }

    async fn release_all(&self, names: &[&str], token: &Token) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "releasing several Redis locks";
        let keys = self.many_keys(names)?;
        let now = unix_ms().to_string();
        self.conn
            .run(
                &self.scripts.release_many,
                &all_four(&keys),
                &[token.as_str(), &now],
                DOING,
            )
            .await
    }
}
