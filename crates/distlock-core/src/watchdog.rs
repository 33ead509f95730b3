//! The watchdog: one task per client renews every held lease of that client. Renewals that are
//! due together go to the engine as one batch (a Redis pipeline, one keep-alive per etcd
//! session: see [`BatchRenew`](crate::engine::BatchRenew)): one round trip per tick, however
//! many locks are held. It sits above the lease and the driver, and knows nothing of guards or
//! clients.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant as TokioInstant;

use crate::driver::Driver;
use crate::engine::{LeaseCheck, RenewItem};
use crate::lease::{LeaseEnd, LeaseShared, LostReason};
use crate::sync::MutexExt;
use crate::token::Token;

mod schedule;

#[cfg(all(test, distlock_loom))]
mod loom_model;

use schedule::{Item, RenewOutcome, Schedule};

/// The client's handle on its watchdog task (started at the first lease that needs it).
///
/// New leases are dropped into a shared list without waking the task, unless the task sleeps
/// past the new lease's first renewal (it is idle, for example). A zero-hold workload thus costs
/// the task one wake-up per renew interval, not one per acquisition: leases released before
/// they are due are simply dropped when it next looks (at the latest after `INTAKE_BATCH` new
/// leases).
pub(crate) struct Watchdog {
    inbox: Arc<Inbox>,
}

/// What the client hands its watchdog task: new leases, and a wake-up when one is due sooner
/// than the task's next look.
struct Inbox {
    state: Mutex<InboxState>,
    wake: tokio::sync::Notify,
}

struct InboxState {
    /// Leases handed over since the task last looked, with when their first renewal is due.
    new: Vec<(Arc<LeaseShared>, TokioInstant)>,
    /// When the task will look next, if it sleeps on a timer; `None` when it waits for work.
    armed: Option<TokioInstant>,
    /// Whether the task runs (it stops when the client goes, or its runtime shuts down).
    running: bool,
    /// The client has gone: the task ends.
    closed: bool,
}

impl Inbox {
    fn state(&self) -> std::sync::MutexGuard<'_, InboxState> {
        self.state.locked()
    }
}

impl Watchdog {
    pub(crate) fn new() -> Self {
        Watchdog {
            inbox: Arc::new(Inbox {
                state: Mutex::new(InboxState {
                    new: Vec::new(),
                    armed: None,
                    running: false,
                    closed: false,
                }),
                wake: tokio::sync::Notify::new(),
            }),
        }
    }

    /// Hands `lease` to the watchdog task, starting the task if needed (or again, if the
    /// runtime it ran on has shut down). The task renews through `driver`, and ends with it.
    pub(crate) fn watch(&self, driver: &Arc<Driver>, lease: Arc<LeaseShared>) {
        // A renewal interval from now, or half of what is left of the lease if that is sooner:
        // its validity counts from the acquire's send, and an acquire that took a large part of
        // the TTL (a session opened over TLS first) leaves less than an interval.
        let left = lease
            .snapshot()
            .valid_until
            .saturating_duration_since(lease.now());
        let due = TokioInstant::now() + lease.options().renew_interval().min(left / 2);
        let mut state = self.inbox.state();
        state.new.push((lease, due));
        if !state.running {
            state.running = true;
            state.armed = None;
            drop(state);
            tokio::spawn(run(Arc::downgrade(driver), self.inbox.clone()));
        } else if state.armed.is_none_or(|t| t > due) || state.new.len() >= INBOX_BATCH {
            drop(state);
            self.inbox.wake.notify_one();
        }
    }
}

/// How many new leases wait for the task before it is woken anyway (to drop the released ones).
const INBOX_BATCH: usize = 64;

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.inbox.state().closed = true;
        self.inbox.wake.notify_one();
    }
}

/// Marks the watchdog stopped when its task ends (or is dropped with its runtime).
struct StoppedOnExit(Arc<Inbox>);

impl Drop for StoppedOnExit {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.running = false;
        state.armed = None;
    }
}

async fn run(driver: Weak<Driver>, inbox: Arc<Inbox>) {
    let running = StoppedOnExit(inbox);
    let inbox = &running.0;
    let mut schedule = Schedule::default();
    let mut in_flight = FuturesUnordered::new();
    let mut left_off = Vec::new();
    loop {
        let next_due = {
            let mut state = inbox.state();
            if state.closed {
                return;
            }
            for (lease, due) in state.new.drain(..) {
                if lease.snapshot().end.is_some() {
                    continue;
                }
                schedule.add(lease, due);
            }
            let next_due = schedule.next_due(&mut left_off);
            state.armed = next_due;
            next_due
        };
        detach_unrenewed(&driver, std::mem::take(&mut left_off));
        let sleep = async {
            match next_due {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            Some(items) = in_flight.next(), if !in_flight.is_empty() => {
                let items: Vec<Item> = items;
                let now = TokioInstant::now();
                for item in items {
                    schedule.settle(item, now, &mut left_off);
                }
            }
            () = inbox.wake.notified() => {}
            () = sleep => {
                let Some(driver) = driver.upgrade() else { return };
                if let Some(batch) = schedule.collect(TokioInstant::now(), &mut left_off) {
                    in_flight.push(send(driver, batch.items, batch.deadline));
                }
            }
        }
    }
}

/// Leases the watchdog stops renewing while their holder still has them (a hold limit reached,
/// or renewals that failed until the deadline) must not live on with a session that the engine
/// keeps alive for other leases: the engine takes them off it, to end within what is left of
/// them (at once, for a lease already given up).
fn detach_unrenewed(driver: &Weak<Driver>, leases: Vec<Arc<LeaseShared>>) {
    if leases.is_empty() {
        return;
    }
    let Some(driver) = driver.upgrade() else {
        return;
    };
    if driver.backend().sessions().is_none() {
        return;
    }
    for lease in leases {
        let st = lease.snapshot();
        let ttl = match st.end {
            None => st.valid_until.saturating_duration_since(lease.now()),
            Some(LeaseEnd::Lost(LostReason::Unreachable)) => Duration::ZERO,
            Some(_) => continue,
        };
        let driver = driver.clone();
        tokio::spawn(async move { driver.detach(&lease.engine_ref(&lease.token()), ttl).await });
    }
}

/// Renews `batch`, whose leases' latest deadline is `deadline`: each item with its outcome.
async fn send(
    driver: Arc<Driver>,
    mut batch: Vec<Item>,
    deadline: std::time::Instant,
) -> Vec<Item> {
    let sent = driver.now();
    let budget = deadline.saturating_duration_since(sent);
    let span = crate::trace::renew(driver.backend().name(), batch.len());
    // In chunks, one after another: what the engine builds for a renewal (requests, replies)
    // is then bounded by a chunk, not by every lease held (a client holding 100,000 locks
    // would otherwise keep the memory of 100,000 requests after its first tick).
    let chunk = driver.renew_chunk();
    // Each chunk's replies are settled as they come, into the batch's items: a batch's replies
    // are never all kept at once (64 bytes a lease).
    let renew_all = async {
        for chunk in batch.chunks_mut(chunk) {
            // The leases keep their tokens compact: spelled out for the chunk's requests.
            let tokens: Vec<Token> = chunk.iter().map(|i| i.renewal.lease().token()).collect();
            let items: Vec<RenewItem<'_>> = chunk
                .iter()
                .zip(&tokens)
                .map(|(i, t)| RenewItem::new(i.renewal.lease().engine_ref(t), i.ttl()))
                .collect();
            let replies = driver.renew_many(&items).await;
            drop(items);
            drop(tokens);
            settle_replies(chunk, replies, sent);
        }
    };
    let finished =
        tracing::Instrument::instrument(tokio::time::timeout(budget, renew_all), span).await;
    if finished.is_err() {
        // No answer before the last deadline of the batch: none of those left is known to be
        // ours.
        for item in batch.iter_mut().filter(|i| i.outcome.is_none()) {
            let lease = item.renewal.lease();
            lease.renew_failed();
            if lease.end_if_past_deadline().is_none() {
                lease.lose(LostReason::Unreachable);
            }
            item.outcome = Some(RenewOutcome::Ended);
        }
    }
    batch
}

/// What the engine answered for each of `chunk`'s leases (renewals sent at `sent`): each
/// lease renewed or ended, in its item.
fn settle_replies(
    chunk: &mut [Item],
    replies: Vec<Result<LeaseCheck, crate::engine::LockError>>,
    sent: std::time::Instant,
) {
    let mut replies = replies.into_iter();
    for item in chunk {
        let lease = item.renewal.lease();
        let ttl = item.ttl();
        let outcome = match replies.next() {
            Some(Ok(LeaseCheck::Ours)) => {
                let validity = ttl.saturating_sub(lease.options().drift_for(ttl));
                if lease.renewed(sent, ttl, validity) {
                    tracing::debug!(target: "distlock", key = %lease.key(),
                        fence = ?lease.fence(), valid_for_ms = validity.as_millis() as u64,
                        "lock renewed");
                    RenewOutcome::Renewed
                } else {
                    RenewOutcome::Ended
                }
            }
            Some(Ok(LeaseCheck::Missing)) => {
                lease.lose(lease.missing_reason());
                RenewOutcome::Ended
            }
            Some(Ok(LeaseCheck::Foreign)) => {
                lease.lose(LostReason::Stolen);
                RenewOutcome::Ended
            }
            Some(Err(e)) => {
                tracing::warn!(target: "distlock", key = %lease.key(), error = %e,
                    "renewal failed");
                lease.renew_failed();
                if lease.end_if_past_deadline().is_some() {
                    RenewOutcome::Ended
                } else {
                    RenewOutcome::Failed
                }
            }
            None => {
                tracing::warn!(target: "distlock", key = %lease.key(),
                    "the engine gave no reply for this renewal");
                lease.renew_failed();
                RenewOutcome::Failed
            }
        };
        item.outcome = Some(outcome);
    }
}
