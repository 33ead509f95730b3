//! The watchdog: renews a held lease every renew interval, and ends it when it is lost.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Backend, LeaseCheck};
use crate::client::ClientInner;
use crate::lease::{LeaseShared, LostReason};

/// Renews `lease` until it ends. Runs as its own task; aborted by the guard on release/drop.
pub(crate) async fn run<B: Backend>(client: Arc<ClientInner<B>>, lease: Arc<LeaseShared>) {
    let interval = lease.options.renew_interval();
    // After a failed renewal, try again sooner, but not in a tight loop.
    let retry = (interval / 4).max(Duration::from_millis(5));
    let mut wait = interval;
    loop {
        tokio::time::sleep(wait).await;
        let st = lease.snapshot();
        if st.end.is_some() {
            return;
        }
        let sent = lease.clock.now();
        let budget = st.valid_until.saturating_duration_since(sent);
        if budget.is_zero() {
            lease.end_if_past_deadline();
            return;
        }
        let ttl = st.ttl;
        let validity = ttl.saturating_sub(lease.options.drift_for(ttl));
        let reply =
            tokio::time::timeout(budget, client.backend.extend(&lease.key, &lease.token, ttl))
                .await;
        match reply {
            Ok(Ok(LeaseCheck::Ours)) => {
                if !lease.renewed(sent, ttl, validity) {
                    return;
                }
                tracing::debug!(
                    target: "distlock",
                    key = %lease.key,
                    fence = ?lease.fence,
                    valid_for_ms = validity.as_millis() as u64,
                    "lock renewed"
                );
                wait = interval;
            }
            Ok(Ok(LeaseCheck::Missing)) => {
                lease.end(LostReason::Expired);
                return;
            }
            Ok(Ok(LeaseCheck::Foreign)) => {
                lease.end(LostReason::Stolen);
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(target: "distlock", key = %lease.key, error = %e, "renewal failed");
                lease.renew_failed();
                if lease.end_if_past_deadline().is_some() {
                    return;
                }
                let left = lease
                    .snapshot()
                    .valid_until
                    .saturating_duration_since(lease.clock.now());
                wait = retry.min(left);
            }
            Err(_elapsed) => {
                // No answer before the lease ran out: we cannot know it is still ours.
                lease.renew_failed();
                lease.end_if_past_deadline();
                lease.end(LostReason::Unreachable);
                return;
            }
        }
    }
}
