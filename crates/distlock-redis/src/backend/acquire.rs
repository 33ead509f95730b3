//! An exclusive lock's acquire: a lock a release handed to this wait (a grant, renewed and
//! replicated first with `WAIT`), the first attempt's fast path (see `fast`), or the acquire
//! script, which also queues a waiter for the server-side hand-over. Readers and permits are
//! in `readers` and `permits`.

use distlock_core::engine::{
    AcquireMode, AcquireRequest, Attempt, Backend, LeaseCheck, LeaseKind, LockError,
};
use distlock_core::recipes::HolderValue;

use super::RedisBackend;
use crate::handover::{Grant, registration};
use crate::replies::AcquireReply;
use crate::scripts::ttl_ms;

impl RedisBackend {
    /// One attempt (`Backend::acquire`).
    pub(super) async fn acquire_inner(
        &self,
        req: &AcquireRequest<'_>,
    ) -> Result<Attempt, LockError> {
        // Every path but the first attempt's fast one runs behind a box of its own: the
        // engine's future is boxed for each call (`Backend` is object-safe), and a small one
        // comes from the allocator's per-thread cache.
        match req.kind {
            LeaseKind::Permit { permits } => {
                return Box::pin(self.acquire_permit(req, permits)).await;
            }
            LeaseKind::Shared => return Box::pin(self.acquire_shared(req)).await,
            _ => {}
        }
        // A lock handed to this wait needs no request at all: look first.
        let other = match self.handovers.take_grant(req.name, req.token.as_str()) {
            Some(Ok(granted)) => {
                distlock_core::metrics::handoff(self.name(), "server");
                if let Attempt::AcquiredEarlier {
                    fence: Some(fence), ..
                } = granted
                {
                    self.seen.record(req.name, fence);
                }
                return Box::pin(self.replicate_grant(req, granted)).await;
            }
            Some(Err(other)) => Some(other),
            None => None,
        };
        // The first attempt's pipeline records no holder in the meta hash: a request whose
        // fence `status` must give (an election's epoch) takes the script.
        if req.mode == AcquireMode::Try && !req.recorded && taken_over(other.as_ref()).is_empty() {
            drop(other);
            return self.acquire_fast(req).await;
        }
        let mut ttl = itoa::Buffer::new();
        let ttl = ttl.format(ttl_ms(req.ttl));
        let value = HolderValue::now(req.token.as_str(), req.owner).encode();
        Box::pin(self.acquire_scripted(req, other, &value, ttl)).await
    }

    /// An attempt by the acquire script (every one but a first attempt's fast path): it can
    /// queue this client for the server-side hand-over, and take over a grant `other` that
    /// this client was handed and did not use.
    async fn acquire_scripted(
        &self,
        req: &AcquireRequest<'_>,
        other: Option<Grant>,
        value: &str,
        ttl: &str,
    ) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a Redis lock";
        let token = req.token.as_str();
        let convert = taken_over(other.as_ref());
        let keys = self.layout.keys(req.name);
        if !req.mode.is_resend()
            && convert.is_empty()
            && let Some(left) = self.handovers.elsewhere_left(req.name)
        {
            return Ok(Attempt::Busy {
                holder_ttl: Some(left),
            });
        }
        // Queue up for a grant only while subscribed to wake-ups (they bring it).
        let watching = self.subscriber.is_watching(req.name);
        let (seq, elem, believed) = if watching {
            let (seq, believed) = self.handovers.queue_for(req.name, req.ttl);
            let wake = self.wake.for_lock(keys.lock());
            let elem = registration(&wake, req.ttl, seq, token, req.owner);
            (seq, elem, believed)
        } else {
            (0, String::new(), String::new())
        };
        let mut floor = itoa::Buffer::new();
        let floor = floor.format(self.seen.floor(req.name));
        let reply = self
            .conn
            .run_waited(
                &self.scripts.acquire,
                &[keys.lock(), keys.meta(), keys.waiters(), keys.fence()],
                &[token, value, ttl, &elem, convert, &believed, floor],
                DOING,
            )
            .await;
        let (reply, acks) = match reply {
            Ok(r) => r,
            Err(e) => {
                if let Some(g) = other {
                    // Not taken over (or not known to be): leave it for the next attempt or
                    // for `leave`.
                    self.handovers.restore_grant(req.name, g);
                }
                return Err(e);
            }
        };
        match reply {
            AcquireReply::Acquired { fence } => {
                self.seen.record(req.name, fence);
                // Taken after a wait: others may wait too, and its release may hand over.
                self.handovers
                    .acquired(req.name, token, fence, req.mode.waits(), watching);
                if let (Some(wait), Some(acks)) = (self.conn.wait, acks) {
                    self.undo_unreplicated(req.name, req.token, wait, acks)
                        .await?;
                }
                Ok(Attempt::Acquired { fence: Some(fence) })
            }
            AcquireReply::Busy { holder_ttl, queued } => {
                if watching {
                    // Unless queued, our earlier registration stays: this one was not used.
                    self.handovers.busy(req.name, seq, queued, elem);
                }
                // No TTL: a foreign lock without one, or the key vanished in between.
                Ok(Attempt::Busy { holder_ttl })
            }
        }
    }

    /// A lock a release handed to us, as the attempt reports it. With `WAIT`, it is renewed
    /// first, by us, and the renewal waited for: the hand-over was written by the releasing
    /// client, whose writes our `WAIT` does not cover, and replication keeps order, so the
    /// renewal's acknowledgement covers the hand-over too.
    async fn replicate_grant(
        &self,
        req: &AcquireRequest<'_>,
        granted: Attempt,
    ) -> Result<Attempt, LockError> {
        let (Some(wait), Attempt::AcquiredEarlier { fence, .. }) = (self.conn.wait, &granted)
        else {
            return Ok(granted);
        };
        const DOING: &str = "acquiring a Redis lock";
        let mut ms = itoa::Buffer::new();
        let (check, acks) = self
            .conn
            .run_waited(
                &self.scripts.extend,
                &[&self.layout.lock_key(req.name)],
                &[req.token.as_str(), ms.format(ttl_ms(req.ttl))],
                DOING,
            )
            .await?;
        match check {
            LeaseCheck::Ours => {
                let acks = acks.unwrap_or(Ok(0));
                self.undo_unreplicated(req.name, req.token, wait, acks)
                    .await?;
                Ok(Attempt::Acquired { fence: *fence })
            }
            // It ran out before we could use it.
            _ => Ok(Attempt::Busy { holder_ttl: None }),
        }
    }
}

/// The token of a grant this client was handed and did not use, which the acquire script takes
/// over; empty for none (a grant handed with an empty token counts as none).
fn taken_over(other: Option<&Grant>) -> &str {
    other.and_then(Grant::unused_token).unwrap_or("")
}
