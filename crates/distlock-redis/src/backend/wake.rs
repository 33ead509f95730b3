//! Waiting for a release (`WakeSource`): a subscription on the shared pub/sub connection (see
//! `subscriber`), and this client's exclusive waiters counted while they wait (`WriterWait`).

use std::sync::Arc;

use distlock_core::engine::{LeaseKind, Listener, LockError, Subscription, WakeSource};

use super::RedisBackend;
use crate::handover::Handovers;
use crate::subscriber::Subscriber;

#[distlock_core::engine::async_trait]
impl WakeSource for RedisBackend {
    /// An exclusive waiter is counted while it waits: a lock handed to this client while none
    /// waits (only its readers or permits do, which never take a writer's grant) is passed on
    /// at once, and the last one's going takes our writers' registrations out of the queue.
    /// A permit's waiter is told by its token (permit_release.lua), so it subscribes with it.
    async fn subscribe(
        &self,
        key: &str,
        who: Listener<'_>,
    ) -> Result<Option<Subscription>, LockError> {
        let Listener::Waiter { kind, token } = who else {
            return Ok(Some(
                self.subscriber
                    .subscribe(key, None, self.conn.response_timeout)
                    .await,
            ));
        };
        let token = matches!(kind, LeaseKind::Permit { .. }).then_some(token);
        self.subscribe_waiter(key, kind, token).await
    }

    fn watching(&self, key: &str) -> bool {
        self.subscriber.is_watching(key)
    }
}

impl RedisBackend {
    /// A waiter's subscription (by `token` where its wake-ups are addressed to it).
    async fn subscribe_waiter(
        &self,
        key: &str,
        kind: LeaseKind,
        token: Option<&str>,
    ) -> Result<Option<Subscription>, LockError> {
        if kind != LeaseKind::Exclusive {
            return Ok(Some(
                self.subscriber
                    .subscribe(key, token, self.conn.response_timeout)
                    .await,
            ));
        }
        self.handovers.writer_waits(key);
        let guard = WriterWait {
            handovers: self.handovers.clone(),
            subscriber: self.subscriber.clone(),
            key: key.to_owned(),
        };
        let sub = self
            .subscriber
            .subscribe(key, None, self.conn.response_timeout)
            .await;
        Ok(Some(sub.with_guard(guard)))
    }
}

/// An exclusive waiter of this client, counted until its subscription drops.
struct WriterWait {
    handovers: Handovers,
    subscriber: Arc<Subscriber>,
    key: String,
}

impl Drop for WriterWait {
    fn drop(&mut self) {
        if self.handovers.writer_done(&self.key) {
            self.subscriber.writers_left(&self.key);
        }
    }
}
