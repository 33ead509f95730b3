//! The semaphore on Redis: each permit a member of a sorted set whose score is its deadline on
//! the server's clock, the waiting clients in a queue served in arrival order, a release telling
//! the next waiters on their wake channels (see `scripts/permits.lua`).

use std::time::Duration;

use distlock_core::engine::{AcquireRequest, Attempt, LeaseCheck, LeaseKind, LockError, Token};
use distlock_core::recipes::{HolderValue, MutexExt, kind_conflict};

use redis::Value;

use super::RedisBackend;
use crate::error::{map_err, protocol};
use crate::replies::PermitReply;
use crate::scripts::{LuaScript, ttl_ms};

/// The keys of the semaphore `name`, in the lock key's slot: holders, meta, queue, liveness,
/// the fence counter and the lock key.
pub(super) struct PermitKeys {
    pub(super) lock: String,
    holders: String,
    meta: String,
    queue: String,
    live: String,
    fence: String,
}

impl PermitKeys {
    pub(super) fn new(lock: String) -> Self {
        PermitKeys {
            holders: format!("{lock}:permits"),
            meta: format!("{lock}:pmeta"),
            queue: format!("{lock}:pqueue"),
            live: format!("{lock}:plive"),
            fence: format!("{lock}:fence"),
            lock,
        }
    }

    /// The holders' sorted set.
    pub(super) fn holders(&self) -> &str {
        &self.holders
    }

    /// The meta hash (size, fences, labels).
    pub(super) fn meta(&self) -> &str {
        &self.meta
    }

    /// The queue of waiting clients.
    pub(super) fn queue(&self) -> &str {
        &self.queue
    }

    /// The four keys every permit script takes first, owned (for a batch of renewals).
    pub(super) fn four_owned(self) -> Vec<String> {
        vec![self.holders, self.meta, self.queue, self.live]
    }

    /// The four keys every permit script takes first.
    fn four(&self) -> [&str; 4] {
        [&self.holders, &self.meta, &self.queue, &self.live]
    }
}

/// How long a waiter's place in the queue lasts without another attempt: waiters that hear
/// wake-ups try again at least every wake fallback (1 s by default), so a place is kept for
/// twice the lease, at least 5 s and at most a minute. A waiter that is gone (nobody hears its
/// channel) leaves at the next release.
fn place_ms(ttl: Duration) -> u64 {
    (ttl_ms(ttl) * 2).clamp(5_000, 60_000)
}

impl RedisBackend {
    /// One attempt at one of `permits` permits.
    pub(super) async fn acquire_permit(
        &self,
        req: &AcquireRequest<'_>,
        permits: u32,
    ) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a Redis semaphore's permit";
        let keys = PermitKeys::new(self.layout.lock_key(req.name));
        let token = req.token.as_str();
        // Queue only while subscribed to wake-ups: a release tells the queue's next waiters.
        let member = if req.mode.waits() && self.subscriber.is_watching(req.name) {
            format!("{token} {}", self.wake.for_lock(&keys.lock))
        } else {
            String::new()
        };
        let mut n = itoa::Buffer::new();
        let mut ttl = itoa::Buffer::new();
        let mut floor = itoa::Buffer::new();
        let mut place = itoa::Buffer::new();
        let [h, m, q, l] = keys.four();
        let holder = HolderValue::now(token, req.owner).encode();
        let (reply, acks) = self
            .conn
            .run_waited(
                &self.scripts.permit_acquire,
                &[h, m, q, l, &keys.fence, &keys.lock],
                &[
                    token,
                    n.format(permits),
                    ttl.format(ttl_ms(req.ttl)),
                    &member,
                    floor.format(self.seen.floor(req.name)),
                    place.format(place_ms(req.ttl)),
                    &holder,
                    if req.mode.is_resend() { "1" } else { "0" },
                ],
                DOING,
            )
            .await?;
        match reply {
            PermitReply::Acquired { fence } => {
                self.seen.record(req.name, fence);
                self.permit_members
                    .locked()
                    .insert(token.to_owned(), format!("{fence} {holder}"));
                if let (Some(wait), Some(acks)) = (self.conn.wait, acks)
                    && let Err(e) = wait.check(acks)
                {
                    // Taken here, not known to be on the replicas: give it back.
                    let _ = self.release_permit(req.name, req.token).await;
                    return Err(e);
                }
                Ok(Attempt::Acquired { fence: Some(fence) })
            }
            PermitReply::Busy { holder_ttl, .. } => Ok(Attempt::Busy { holder_ttl }),
            PermitReply::OtherSize { permits: theirs } => Err(kind_conflict(
                req.name,
                req.kind,
                LeaseKind::Permit { permits: theirs },
            )),
            PermitReply::LockHeld => Err(kind_conflict(req.name, req.kind, LeaseKind::Exclusive)),
        }
    }

    /// Renews our permit of `name`, if it is still ours.
    pub(super) async fn renew_permit(
        &self,
        name: &str,
        token: &Token,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "renewing a Redis semaphore's permit";
        let keys = PermitKeys::new(self.layout.lock_key(name));
        let member = self.permit_member(token);
        self.renew_by(
            &self.scripts.permit_extend,
            &keys.four(),
            (token, Some(&member)),
            ttl,
            DOING,
        )
        .await
    }

    /// The member of our permit `token` in its semaphore's holders' set, or '' when this client
    /// does not know it (the scripts then find it by the token).
    pub(super) fn permit_member(&self, token: &Token) -> String {
        self.permit_members
            .locked()
            .get(token.as_str())
            .cloned()
            .unwrap_or_default()
    }

    /// A renewal by `script` (keys, then the token, the TTL in ms and `extra` if given), which
    /// counts only once the replicas acknowledged it when `WAIT` is configured.
    pub(super) async fn renew_by(
        &self,
        script: &LuaScript<LeaseCheck>,
        keys: &[&str],
        (token, extra): (&Token, Option<&str>),
        ttl: Duration,
        doing: &str,
    ) -> Result<LeaseCheck, LockError> {
        let mut ms = itoa::Buffer::new();
        let ms = ms.format(ttl_ms(ttl));
        let args = [token.as_str(), ms, extra.unwrap_or("")];
        let args = if extra.is_some() {
            &args[..]
        } else {
            &args[..2]
        };
        let (check, acks) = self.conn.run_waited(script, keys, args, doing).await?;
        if let (Some(wait), Some(acks), LeaseCheck::Ours) = (self.conn.wait, acks, check) {
            wait.check(acks)?;
        }
        Ok(check)
    }

    /// Gives our permit of `name` back, and tells the next waiters.
    ///
    /// When the client knows its member and none of its tasks waits for the name (the
    /// uncontended case), one round trip of two plain commands: `ZREM` of the member and
    /// `ZCARD` of the queue; only when somebody waits does the release script follow, to tell
    /// them (and to take a waiter of ours that gave up out of the queue). The answer is
    /// `ZREM`'s: our member was there. Whether its deadline had passed is the core's to say,
    /// from the lease's local deadline, which is never later than the server's. A client whose
    /// tasks wait for the name knows the queue is not empty: the script at once.
    pub(super) async fn release_permit(
        &self,
        name: &str,
        token: &Token,
    ) -> Result<LeaseCheck, LockError> {
        const DOING: &str = "releasing a Redis semaphore's permit";
        let keys = PermitKeys::new(self.layout.lock_key(name));
        let queued = format!("{token} {}", self.wake.for_lock(&keys.lock));
        let mut held = self.permit_member(token);
        let [h, m, q, l] = keys.four();
        let mut removed = false;
        if !held.is_empty() && !self.subscriber.is_watching(name) {
            let mut pipe = redis::Pipeline::with_capacity(2);
            pipe.cmd("ZREM").arg(h).arg(&held);
            pipe.cmd("ZCARD").arg(q);
            let replies = self.conn.send(&pipe).await.map_err(|e| map_err(e, DOING))?;
            match replies.as_slice() {
                [Value::Int(gone), Value::Int(0)] => {
                    self.permit_members.locked().remove(token.as_str());
                    return Ok(if *gone == 1 {
                        LeaseCheck::Ours
                    } else {
                        LeaseCheck::Missing
                    });
                }
                // Somebody waits: the script tells them, without looking for our member
                // again ('-') when it was removed.
                [Value::Int(gone), Value::Int(_)] => {
                    removed = *gone == 1;
                    if removed {
                        held = "-".to_owned();
                    }
                }
                [Value::ServerError(e), ..] | [_, Value::ServerError(e)] => {
                    return Err(map_err(e.clone().into(), DOING));
                }
                _ => return Err(protocol(DOING, &Value::Array(replies))),
            }
        }
        let check = self
            .conn
            .run(
                &self.scripts.permit_release,
                &[h, m, q, l, &keys.lock],
                &[token.as_str(), &queued, &held],
                DOING,
            )
            .await?;
        self.permit_members.locked().remove(token.as_str());
        Ok(if removed { LeaseCheck::Ours } else { check })
    }
}
