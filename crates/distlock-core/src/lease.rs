//! The state of one held lease, shared by its guard, its watchdog and any [`LeaseHandle`].

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::clock::Clock;
use crate::options::LockOptions;
use crate::token::Token;

/// Why a lease ended before (or without) a successful release.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LostReason {
    /// The lease ran out: the engine had no lock for us, or the local deadline passed with no
    /// renewal (watchdog off, or renewal too late).
    Expired,
    /// Someone else removed or replaced our lock: another owner's token was found under the
    /// key, or the key was gone while our lease should still have been running (an external
    /// `DEL`, a flush, a server restart without persistence).
    Stolen,
    /// Renewals kept failing (engine unreachable) until the local deadline passed.
    Unreachable,
    /// This holder released the lease (or dropped or leaked its guard). Not a loss, but the end.
    Released,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "the lease expired",
            LostReason::Stolen => "another owner holds the lock",
            LostReason::Unreachable => "the lock engine was unreachable until the lease ran out",
            LostReason::Released => "the lease was released",
        })
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseState {
    /// Deadline of the lease on the monotonic clock: request sent + ttl − drift.
    pub(crate) valid_until: Instant,
    /// When the request that set `valid_until` was sent; a late renewal reply never moves the
    /// deadline backwards past a newer one.
    pub(crate) sent_at: Instant,
    /// The TTL renewals ask for.
    pub(crate) ttl: Duration,
    pub(crate) end: Option<LostReason>,
    /// A renewal is outstanding or the last one failed for a network reason: a deadline passing
    /// now means `Unreachable`.
    pub(crate) renew_failing: bool,
}

pub(crate) struct LeaseShared {
    pub(crate) key: String,
    pub(crate) token: Token,
    pub(crate) fence: Option<u64>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) options: LockOptions,
    state: Mutex<LeaseState>,
    /// Woken when the lease ends or its deadline moves, and when a renewal lets go of the gate.
    changed: Notify,
    /// When this holder's acquire (or the hand-off renewal) was sent: `max_hold` counts from here.
    pub(crate) acquired_at: Instant,
    /// How many local hand-offs in a row led to this lease (0 for a fresh acquire).
    pub(crate) streak: u32,
    /// `RENEWING` while the watchdog has a renewal of this lease in flight; `CLOSED` once a
    /// release has ended the lease and waits for that renewal: no renewal starts after that.
    gate: AtomicU8,
    /// The task that waits for the engine's own word that the lease is lost (engines with
    /// `loss_events`); stopped when the lease ends.
    loss_watch: Mutex<Option<tokio::task::AbortHandle>>,
}

/// [`LeaseShared::gate`]: a renewal is in flight.
const RENEWING: u8 = 1;
/// [`LeaseShared::gate`]: the lease is being released; no renewal may start.
const CLOSED: u8 = 2;

/// A renewal in flight: the gate opens again (and a waiting release goes on) when it drops.
pub(crate) struct Renewal {
    lease: Arc<LeaseShared>,
}

impl Renewal {
    pub(crate) fn lease(&self) -> &Arc<LeaseShared> {
        &self.lease
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        if self.lease.gate.fetch_and(!RENEWING, Ordering::AcqRel) & CLOSED != 0 {
            self.lease.changed.notify_waiters();
        }
    }
}

impl LeaseShared {
    pub(crate) fn new(
        key: String,
        token: Token,
        fence: Option<u64>,
        clock: Arc<dyn Clock>,
        options: LockOptions,
        sent_at: Instant,
    ) -> Self {
        let ttl = options.ttl();
        let validity = options.validity();
        Self::with_deadline(
            key,
            token,
            fence,
            clock,
            options,
            sent_at,
            ttl,
            sent_at + validity,
            0,
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn with_deadline(
        key: String,
        token: Token,
        fence: Option<u64>,
        clock: Arc<dyn Clock>,
        options: LockOptions,
        sent_at: Instant,
        ttl: Duration,
        valid_until: Instant,
        streak: u32,
    ) -> Self {
        let state = LeaseState {
            valid_until,
            sent_at,
            ttl,
            end: None,
            renew_failing: false,
        };
        LeaseShared {
            key,
            token,
            fence,
            clock,
            options,
            state: Mutex::new(state),
            changed: Notify::new(),
            acquired_at: sent_at,
            streak,
            gate: AtomicU8::new(0),
            loss_watch: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn snapshot(&self) -> LeaseState {
        *self.lock()
    }

    /// Starts a renewal of this lease, unless a release has closed the gate. The caller checks
    /// that the lease has not ended *after* this succeeds.
    pub(crate) fn begin_renewal(self: &Arc<Self>) -> Option<Renewal> {
        self.gate
            .compare_exchange(0, RENEWING, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Renewal {
                lease: self.clone(),
            })
    }

    /// Closes the gate for good and waits for a renewal in flight to finish: after this, no
    /// renewal of this lease is ever sent. Call it after ending the lease. Cancel-safe.
    pub(crate) async fn close_gate(&self) {
        if self.gate.fetch_or(CLOSED, Ordering::AcqRel) & RENEWING == 0 {
            return;
        }
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.gate.load(Ordering::Acquire) & RENEWING == 0 {
                return;
            }
            changed.await;
        }
    }

    pub(crate) fn is_held(&self) -> bool {
        let st = self.snapshot();
        st.end.is_none() && self.clock.now() < st.valid_until
    }

    /// Whether the holder released the lease (its release may still be on its way).
    pub(crate) fn is_released(&self) -> bool {
        self.snapshot().end == Some(LostReason::Released)
    }

    /// Records a successful renewal sent at `sent_at`. Returns false if the lease had ended,
    /// including when its deadline passed before the reply came: once `is_held` has turned
    /// false it never turns true again.
    pub(crate) fn renewed(&self, sent_at: Instant, ttl: Duration, validity: Duration) -> bool {
        if self.end_if_past_deadline().is_some() {
            return false;
        }
        {
            let mut st = self.lock();
            if st.end.is_some() {
                return false;
            }
            st.renew_failing = false;
            if sent_at >= st.sent_at {
                st.sent_at = sent_at;
                st.valid_until = sent_at + validity;
                st.ttl = ttl;
            }
        }
        self.changed.notify_waiters();
        true
    }

    /// Why the lease is lost when the engine no longer has our key: before our deadline, it
    /// cannot have run out, so somebody removed it; after, it expired.
    pub(crate) fn missing_reason(&self) -> LostReason {
        if self.clock.now() < self.snapshot().valid_until {
            LostReason::Stolen
        } else {
            LostReason::Expired
        }
    }

    /// A renewal is on its way: until it is confirmed, a deadline passing means `Unreachable`.
    pub(crate) fn renew_sent(&self) {
        self.renew_failed();
    }

    pub(crate) fn renew_failed(&self) {
        // Only the reason for a deadline that passes changes: nobody waits for this.
        self.lock().renew_failing = true;
    }

    /// Ends the lease with `reason` unless it already ended. Returns the reason in force.
    /// Ends the lease when `lost` resolves (the engine's own word that it is lost).
    pub(crate) fn watch_loss(
        self: &Arc<Self>,
        lost: impl std::future::Future<Output = LostReason> + Send + 'static,
    ) {
        let lease = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            let reason = lost.await;
            if let Some(lease) = lease.upgrade() {
                lease.end(reason);
            }
        });
        let mut slot = self
            .loss_watch
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.lock().end.is_some() {
            task.abort();
        } else {
            *slot = Some(task.abort_handle());
        }
    }

    pub(crate) fn end(&self, reason: LostReason) -> LostReason {
        {
            let mut st = self.lock();
            if let Some(prev) = st.end {
                return prev;
            }
            st.end = Some(reason);
        }
        if let Some(watch) = self
            .loss_watch
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            watch.abort();
        }
        self.changed.notify_waiters();
        if reason != LostReason::Released {
            tracing::warn!(
                target: "distlock",
                key = %self.key,
                fence = ?self.fence,
                reason = %reason,
                "lock lost"
            );
        }
        reason
    }

    /// Ends the lease as expired if its deadline has passed; the reason says whether renewals were
    /// failing.
    pub(crate) fn end_if_past_deadline(&self) -> Option<LostReason> {
        let st = self.snapshot();
        if let Some(r) = st.end {
            return Some(r);
        }
        if self.clock.now() < st.valid_until {
            return None;
        }
        let reason = if st.renew_failing {
            LostReason::Unreachable
        } else {
            LostReason::Expired
        };
        Some(self.end(reason))
    }

    pub(crate) async fn lost(&self) -> LostReason {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check: an end or a renewal after it wakes the wait.
            changed.as_mut().enable();
            let st = self.snapshot();
            if let Some(r) = st.end {
                return r;
            }
            let now = self.clock.now();
            if now >= st.valid_until {
                if let Some(r) = self.end_if_past_deadline() {
                    return r;
                }
                continue;
            }
            tokio::select! {
                () = &mut changed => {}
                () = tokio::time::sleep(st.valid_until - now) => {
                    if let Some(r) = self.end_if_past_deadline() {
                        return r;
                    }
                    // An injected clock that has not reached the deadline: wait for news instead.
                    changed.await;
                }
            }
        }
    }
}

/// A cheap, clonable view of a held lease, for code that runs under the lock (for example the
/// body of [`LockClient::with_lock`](crate::LockClient::with_lock)). It cannot release the lock.
#[derive(Clone)]
pub struct LeaseHandle {
    pub(crate) shared: Arc<LeaseShared>,
}

impl LeaseHandle {
    /// The lock key.
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// The fencing token, if the engine gives a correct one. Pass it to the protected resource
    /// so it can refuse writes from a holder whose lease has run out.
    pub fn fence(&self) -> Option<u64> {
        self.shared.fence
    }

    /// The token stored under the key for this acquisition.
    pub fn token(&self) -> &Token {
        &self.shared.token
    }

    /// The end of the lease on the monotonic clock, counted from when the acquire (or the last
    /// renewal) was **sent**, minus the drift allowance.
    pub fn valid_until(&self) -> Instant {
        self.shared.snapshot().valid_until
    }

    /// Whether the lease is still ours: not lost, not released, and its deadline not passed.
    /// A local check; no I/O.
    pub fn is_held(&self) -> bool {
        self.shared.is_held()
    }

    /// Resolves when the lease ends: lost (expired, stolen, unreachable) or released.
    ///
    /// # Cancel safety
    /// Cancel-safe: drop it and call again at will, for example inside `tokio::select!`.
    pub async fn lost(&self) -> LostReason {
        self.shared.lost().await
    }
}

impl fmt::Debug for LeaseHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseHandle")
            .field("key", &self.shared.key)
            .field("fence", &self.shared.fence)
            .field("held", &self.is_held())
            .finish()
    }
}
