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
use crate::engine::{Backend, LeaseCheck, RenewItem};
use crate::lease::{LeaseEnd, LeaseShared, LostReason, Renewal};
use crate::sync::MutexExt;

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
    pub(crate) fn watch<B: Backend>(&self, driver: &Arc<Driver<B>>, lease: Arc<LeaseShared>) {
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

enum RenewOutcome {
    Renewed,
    Failed,
    Ended,
}

/// Seeded bug `renew-after-loss`: ended leases stay in the watchdog and are renewed for as long
/// as the engine still has their token.
fn renew_after_loss() -> bool {
    crate::seeded::on(crate::seeded::SeededBug::RenewAfterLoss)
}

/// Why a lease left the watchdog without being renewed again.
fn retire(e: &Entry) -> bool {
    if e.retired || (e.lease.snapshot().end.is_some() && !renew_after_loss()) {
        return true;
    }
    e.lease
        .options()
        .max_renewals()
        .is_some_and(|max| e.renewals >= max)
}

async fn run<B: Backend>(driver: Weak<Driver<B>>, inbox: Arc<Inbox>) {
    let running = StoppedOnExit(inbox);
    let inbox = &running.0;
    let mut entries: Vec<Entry> = Vec::new();
    let mut next_id = 0u64;
    let mut in_flight = FuturesUnordered::new();
    loop {
        let next_due = {
            let mut state = inbox.state();
            if state.closed {
                return;
            }
            for (lease, due) in state.new.drain(..) {
                if lease.snapshot().end.is_some() && !renew_after_loss() {
                    continue;
                }
                next_id += 1;
                entries.push(Entry {
                    id: next_id,
                    interval: lease.options().renew_interval(),
                    lease,
                    due,
                    renewals: 0,
                    in_flight: false,
                    retired: false,
                });
            }
            let mut left_off = Vec::new();
            entries.retain(|e| {
                let keep = e.in_flight || !retire(e);
                if !keep {
                    left_off.push(e.lease.clone());
                }
                keep
            });
            detach_unrenewed(&driver, left_off);
            let next_due = entries.iter().filter(|e| !e.in_flight).map(|e| e.due).min();
            state.armed = next_due;
            next_due
        };
        let sleep = async {
            match next_due {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            Some(results) = in_flight.next(), if !in_flight.is_empty() => {
                let results: Vec<(u64, RenewOutcome)> = results;
                let now = TokioInstant::now();
                for (id, outcome) in results {
                    let Some(e) = entries.iter_mut().find(|e| e.id == id) else { continue };
                    e.in_flight = false;
                    match outcome {
                        RenewOutcome::Renewed => {
                            e.renewals = e.renewals.saturating_add(1);
                            e.due = now + e.interval;
                        }
                        RenewOutcome::Failed => {
                            // Try again sooner, but not in a tight loop, and before the deadline.
                            let left = e.lease.snapshot().valid_until
                                .saturating_duration_since(e.lease.now());
                            let retry = (e.interval / 4).max(Duration::from_millis(5));
                            e.due = now + retry.min(left);
                        }
                        RenewOutcome::Ended => e.retired = true,
                    }
                }
            }
            () = inbox.wake.notified() => {}
            () = sleep => {
                let Some(driver) = driver.upgrade() else { return };
                let batch = collect(&mut entries);
                if !batch.is_empty() {
                    in_flight.push(send(driver, batch));
                }
            }
        }
    }
}

/// Leases the watchdog stops renewing while their holder still has them (a hold limit reached,
/// or renewals that failed until the deadline) must not live on with a session that the engine
/// keeps alive for other leases: the engine takes them off it, to end within what is left of
/// them (at once, for a lease already given up).
fn detach_unrenewed<B: Backend>(driver: &Weak<Driver<B>>, leases: Vec<Arc<LeaseShared>>) {
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
        tokio::spawn(async move { driver.detach(&lease.engine_ref(), ttl).await });
    }
}

/// One lease in a batch, its renewal in flight until the reply is processed.
struct Item {
    id: u64,
    renewal: Renewal,
    ttl: Duration,
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
        // A release has closed the gate: skip, the lease is going away.
        let Some(renewal) = e.lease.begin_renewal() else {
            e.due = now + e.interval / 4;
            continue;
        };
        let lease = &e.lease;
        let st = lease.snapshot();
        if st.end.is_some() && !renew_after_loss() {
            continue;
        }
        let mut ttl = st.ttl;
        if let Some(max_hold) = lease.options().max_hold() {
            let left = (lease.acquired_at() + max_hold).saturating_duration_since(lease.now());
            // Whole milliseconds, as engines want them.
            let left = Duration::from_millis(left.as_millis() as u64);
            if left.is_zero() {
                // Hold limit reached: stop renewing, the lease runs out.
                e.retired = true;
                continue;
            }
            ttl = ttl.min(left);
        }
        if lease.end_if_past_deadline().is_some() && !renew_after_loss() {
            continue;
        }
        e.in_flight = true;
        batch.push(Item {
            id: e.id,
            renewal,
            ttl,
        });
    }
    batch
}

async fn send<B: Backend>(driver: Arc<Driver<B>>, batch: Vec<Item>) -> Vec<(u64, RenewOutcome)> {
    let sent = driver.now();
    let budget = batch
        .iter()
        .map(|i| {
            i.renewal
                .lease()
                .snapshot()
                .valid_until
                .saturating_duration_since(sent)
        })
        .max()
        .unwrap_or_default();
    // Seeded bug `renew-after-loss`: an ended lease's deadline no longer moves; give the
    // renewal its TTL instead.
    let budget = if renew_after_loss() {
        batch
            .iter()
            .map(|i| i.ttl)
            .max()
            .unwrap_or(budget)
            .max(budget)
    } else {
        budget
    };
    for i in &batch {
        i.renewal.lease().renew_sent();
    }
    let items: Vec<RenewItem<'_>> = batch
        .iter()
        .map(|i| RenewItem::new(i.renewal.lease().engine_ref(), i.ttl))
        .collect();
    let span = crate::trace::renew(driver.backend().name(), items.len());
    let replies = tracing::Instrument::instrument(
        tokio::time::timeout(budget, driver.renew_many(&items)),
        span,
    )
    .await;
    drop(items);
    let mut out = Vec::with_capacity(batch.len());
    match replies {
        Ok(replies) => {
            let mut replies = replies.into_iter();
            for item in &batch {
                let lease = item.renewal.lease();
                let outcome = match replies.next() {
                    Some(Ok(LeaseCheck::Ours)) => {
                        let validity = item.ttl.saturating_sub(lease.options().drift_for(item.ttl));
                        if lease.renewed(sent, item.ttl, validity) || renew_after_loss() {
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
                out.push((item.id, outcome));
            }
        }
        Err(_elapsed) => {
            // No answer before the last deadline of the batch: none of them is known to be ours.
            for item in &batch {
                let lease = item.renewal.lease();
                lease.renew_failed();
                if lease.end_if_past_deadline().is_none() {
                    lease.lose(LostReason::Unreachable);
                }
                out.push((item.id, RenewOutcome::Ended));
            }
        }
    }
    out
}
