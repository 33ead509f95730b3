//! The watchdog's renewals as a pipeline: memcached has no command that renews many items, but
//! it answers the requests of one connection in order, so a chunk of renewals goes out in one
//! write and comes back in a few reads, where one request each costs a round trip (100,000
//! locks at a 3 s TTL are 100,000 round trips a second).

use distlock_core::engine::{BatchRenew, LeaseCheck, LockError, RenewItem};

use super::MemcachedBackend;
use crate::meta::Request;

/// Renewals one pipeline carries: about 100 bytes a request each way, so a chunk is about
/// 100 KB on the wire, and the replies of a chunk are read before the next is sent.
pub(super) const PIPELINE: usize = 1024;

#[distlock_core::engine::async_trait]
impl BatchRenew for MemcachedBackend {
    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        self.renew_pipelined(items).await
    }

    fn max_batch(&self) -> usize {
        PIPELINE
    }
}

impl MemcachedBackend {
    /// Renews every item in one pipeline: one result per item, in order.
    async fn renew_pipelined(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        let mut out: Vec<Option<Result<LeaseCheck, LockError>>> =
            (0..items.len()).map(|_| None).collect();
        // Renewals given up earlier (a pipeline with no answer in time) are read first, so that
        // each record has the CAS its item has now.
        if self.inner.pool.has_orphans() {
            let orphaned = self.inner.pool.orphaned_tags();
            for (i, item) in items.iter().enumerate() {
                let token = item.lease.token.as_str();
                if orphaned.contains(token)
                    && let Err(e) = self.settle(token).await
                {
                    out[i] = Some(Err(e));
                }
            }
        }
        // The leases we hold (the others are gone: released, or lost).
        let mut sent = Vec::with_capacity(items.len());
        let mut renewals = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            if out[i].is_some() {
                continue;
            }
            match self.renewal(item.lease.name, item.lease.token.as_str()) {
                Some(r) => {
                    sent.push(i);
                    renewals.push(r);
                }
                None => out[i] = Some(Ok(LeaseCheck::Missing)),
            }
        }
        let requests: Vec<Request<'_>> = sent
            .iter()
            .zip(&renewals)
            .map(|(&i, r)| Request {
                args: r.line(items[i].ttl),
                data: Some(r.value.as_bytes()),
                tag: items[i].lease.token.as_str(),
            })
            .collect();
        let replies = self.inner.pool.call_many(&requests).await;
        drop(requests);
        for (&i, reply) in sent.iter().zip(replies) {
            let lease = &items[i].lease;
            let token = lease.token.as_str();
            out[i] = Some(match reply {
                // Refused for its CAS: read the item, it may still be ours (see `renew_again`).
                Ok(r) if r.code == "EX" => self.renew_again(lease.name, token, items[i].ttl).await,
                Ok(r) => self.renewed(token, &r),
                Err(e) => Err(e),
            });
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Ok(LeaseCheck::Missing)))
            .collect()
    }
}
