//! The watchdog: one task per client renews every held lease of that client. Renewals that are
//! due together go to the engine as one batch ([`Backend::extend_many`]), which the Redis engine
//! sends as one pipeline: one round trip per tick, however many locks are held.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{OwnedMutexGuard, mpsc};
use tokio::time::Instant as TokioInstant;

use crate::backend::{Backend, LeaseCheck, RenewItem};
use crate::client::ClientInner;
use crate::lease::{LeaseShared, LostReason};

/// The client's handle on its watchdog task (started at the first lease that needs it).
pub(crate) struct Watchdog {
    tx: Mutex<Option<mpsc::UnboundedSender<Arc<LeaseShared>>>>,
}

impl Watchdog {
    pub(crate) fn new() -> Self {
        Watchdog {
            tx: Mutex::new(None),
        }
    }

    /// Hands `lease` to the client's watchdog task, starting the task if needed (or again, if
    /// the runtime it ran on has shut down).
    pub(crate) fn watch<B: Backend>(client: &Arc<ClientInner<B>>, lease: Arc<LeaseShared>) {
        let mut tx = client
            .watchdog
            .tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let lease = match tx.as_ref() {
            Some(sender) => match sender.send(lease) {
                Ok(()) => return,
                Err(back) => back.0,
            },
            None => lease,
        };
        let (sender, rx) = mpsc::unbounded_channel();
        let _ = sender.send(lease);
        *tx = Some(sender);
        tokio::spawn(run(Arc::downgrade(client), rx));
    }
}

struct Entry {
    id: u64,
    lease: Arc<LeaseShared>,
    due: TokioInstant,
    interval: Duration,
    renewals: u32,
    in_flight: bool,
    /// The hold limit is reached: no more renewals.
    retired: bool,
}

enum Outcome {
    Renewed,
    Failed,
    Ended,
}

/// Why a lease left the watchdog without being renewed again.
fn retire(e: &Entry) -> bool {
    if e.retired || e.lease.snapshot().end.is_some() {
        return true;
    }
    e.lease
        .options
        .max_renewals()
        .is_some_and(|max| e.renewals >= max)
}

async fn run<B: Backend>(
    client: Weak<ClientInner<B>>,
    mut rx: mpsc::UnboundedReceiver<Arc<LeaseShared>>,
) {
    let mut entries: Vec<Entry> = Vec::new();
    let mut next_id = 0u64;
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    loop {
        entries.retain(|e| e.in_flight || !retire(e));
        if !open && entries.is_empty() && in_flight.is_empty() {
            return;
        }
        let next_due = entries.iter().filter(|e| !e.in_flight).map(|e| e.due).min();
        let sleep = async {
            match next_due {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            Some(results) = in_flight.next(), if !in_flight.is_empty() => {
                let results: Vec<(u64, Outcome)> = results;
                let now = TokioInstant::now();
                for (id, outcome) in results {
                    let Some(e) = entries.iter_mut().find(|e| e.id == id) else { continue };
                    e.in_flight = false;
                    match outcome {
                        Outcome::Renewed => {
                            e.renewals = e.renewals.saturating_add(1);
                            e.due = now + e.interval;
                        }
                        Outcome::Failed => {
                            // Try again sooner, but not in a tight loop, and before the deadline.
                            let left = e.lease.snapshot().valid_until
                                .saturating_duration_since(e.lease.clock.now());
                            let retry = (e.interval / 4).max(Duration::from_millis(5));
                            e.due = now + retry.min(left);
                        }
                        Outcome::Ended => e.retired = true,
                    }
                }
            }
            msg = rx.recv(), if open => match msg {
                Some(lease) => {
                    let interval = lease.options.renew_interval();
                    next_id += 1;
                    entries.push(Entry {
                        id: next_id,
                        lease,
                        due: TokioInstant::now() + interval,
                        interval,
                        renewals: 0,
                        in_flight: false,
                        retired: false,
                    });
                }
                None => open = false,
            },
            () = sleep => {
                let Some(client) = client.upgrade() else { return };
                let batch = collect(&mut entries);
                if !batch.is_empty() {
                    in_flight.push(send(client, batch));
                }
            }
        }
    }
}

/// One lease in a batch, with its gate held until the reply is processed.
struct Item {
    id: u64,
    lease: Arc<LeaseShared>,
    ttl: Duration,
    _gate: OwnedMutexGuard<()>,
}

/// Takes every lease that is due, or due within half its interval (renewing a little early
/// aligns leases, so they share later ticks).
fn collect(entries: &mut [Entry]) -> Vec<Item> {
    let now = TokioInstant::now();
    let mut batch = Vec::new();
    for e in entries.iter_mut() {
        if e.in_flight || e.due > now + e.interval / 2 {
            continue;
        }
        // Release holds the gate while it ends the lease: skip, the lease is going away.
        let Ok(gate) = e.lease.gate.clone().try_lock_owned() else {
            e.due = now + e.interval / 4;
            continue;
        };
        let lease = &e.lease;
        let st = lease.snapshot();
        if st.end.is_some() {
            continue;
        }
        let mut ttl = st.ttl;
        if let Some(max_hold) = lease.options.max_hold() {
            let left = (lease.acquired_at + max_hold).saturating_duration_since(lease.clock.now());
            // Whole milliseconds, as engines want them.
            let left = Duration::from_millis(left.as_millis() as u64);
            if left.is_zero() {
                // Hold limit reached: stop renewing, the lease runs out.
                e.retired = true;
                continue;
            }
            ttl = ttl.min(left);
        }
        if lease.end_if_past_deadline().is_some() {
            continue;
        }
        e.in_flight = true;
        batch.push(Item {
            id: e.id,
            lease: lease.clone(),
            ttl,
            _gate: gate,
        });
    }
    batch
}

async fn send<B: Backend>(client: Arc<ClientInner<B>>, batch: Vec<Item>) -> Vec<(u64, Outcome)> {
    let sent = client.clock.now();
    let budget = batch
        .iter()
        .map(|i| {
            i.lease
                .snapshot()
                .valid_until
                .saturating_duration_since(sent)
        })
        .max()
        .unwrap_or_default();
    for i in &batch {
        i.lease.renew_sent();
    }
    let items: Vec<RenewItem<'_>> = batch
        .iter()
        .map(|i| RenewItem::new(&i.lease.key, &i.lease.token, i.ttl))
        .collect();
    let replies = tokio::time::timeout(budget, client.backend.extend_many(&items)).await;
    drop(items);
    let mut out = Vec::with_capacity(batch.len());
    match replies {
        Ok(replies) => {
            let mut replies = replies.into_iter();
            for item in &batch {
                let lease = &item.lease;
                let outcome = match replies.next() {
                    Some(Ok(LeaseCheck::Ours)) => {
                        let validity = item.ttl.saturating_sub(lease.options.drift_for(item.ttl));
                        if lease.renewed(sent, item.ttl, validity) {
                            tracing::debug!(target: "distlock", key = %lease.key,
                                fence = ?lease.fence, valid_for_ms = validity.as_millis() as u64,
                                "lock renewed");
                            Outcome::Renewed
                        } else {
                            Outcome::Ended
                        }
                    }
                    Some(Ok(LeaseCheck::Missing)) => {
                        lease.end(lease.missing_reason());
                        Outcome::Ended
                    }
                    Some(Ok(LeaseCheck::Foreign)) => {
                        lease.end(LostReason::Stolen);
                        Outcome::Ended
                    }
                    Some(Err(e)) => {
                        tracing::warn!(target: "distlock", key = %lease.key, error = %e,
                            "renewal failed");
                        lease.renew_failed();
                        if lease.end_if_past_deadline().is_some() {
                            Outcome::Ended
                        } else {
                            Outcome::Failed
                        }
                    }
                    None => {
                        tracing::warn!(target: "distlock", key = %lease.key,
                            "the engine gave no reply for this renewal");
                        lease.renew_failed();
                        Outcome::Failed
                    }
                };
                out.push((item.id, outcome));
            }
        }
        Err(_elapsed) => {
            // No answer before the last deadline of the batch: none of them is known to be ours.
            for item in &batch {
                item.lease.renew_failed();
                if item.lease.end_if_past_deadline().is_none() {
                    item.lease.end(LostReason::Unreachable);
                }
                out.push((item.id, Outcome::Ended));
            }
        }
    }
    out
}
