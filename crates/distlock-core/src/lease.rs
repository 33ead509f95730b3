//! The state of one held lease, shared by its guard, its watchdog and any [`LeaseHandle`]: its
//! deadline, how it ended, and the gate that keeps renewals from crossing a release. The bottom
//! layer of the core: it knows nothing of engines, guards or clients.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::clock::{Clock, pack, unpack};
pub use crate::engine::LostReason;
use crate::engine::{LeaseKind, LeaseRef};
use crate::options::LockOptions;
use crate::sync::shim::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Locked, Mutex, MutexGuard};
use crate::token::{CompactToken, Token};

pub(crate) mod losses;

/// How a lease ended: released by its holder, or lost.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseEnd {
    /// Its holder released it (or dropped or leaked its guard).
    Released,
    /// It was lost, for this reason.
    Lost(LostReason),
}

impl LeaseEnd {
    /// The reason, if the lease was lost.
    pub fn lost(self) -> Option<LostReason> {
        match self {
            LeaseEnd::Lost(r) => Some(r),
            LeaseEnd::Released => None,
        }
    }
}

impl fmt::Display for LeaseEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseEnd::Released => f.write_str("the lease was released"),
            LeaseEnd::Lost(r) => r.fmt(f),
        }
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
    pub(crate) end: Option<LeaseEnd>,
    /// A renewal is outstanding or the last one failed for a network reason: a deadline passing
    /// now means `Unreachable`.
    pub(crate) renew_failing: bool,
}

/// [`LeaseState`] as the lease keeps it, with the loss watcher's counter (see `losses`): its
/// instants packed in 8 bytes each (see [`clock::pack`](crate::clock::pack)), and its TTL, end
/// and failing flag in one more (see [`Packed::ttl_end`]): 32 bytes where the state takes 56
/// and the counter's own cell 16.
struct Packed {
    valid_until: i64,
    sent_at: i64,
    /// The TTL in nanoseconds in the low [`TTL_BITS`] bits (options cap it at a year, 2^55
    /// nanoseconds), the end above them (see [`end_code`]), and in the top bit whether renewals
    /// are failing.
    ttl_end: u64,
    /// Told when the lease ends, once a loss watcher watches it.
    loss: Option<Arc<losses::LossCounter>>,
}

/// Bits of [`Packed::ttl_end`] that keep the TTL.
const TTL_BITS: u32 = 56;
const TTL_MASK: u64 = (1 << TTL_BITS) - 1;
const END_MASK: u64 = 0x7f << TTL_BITS;
const FAILING: u64 = 1 << 63;

/// A TTL as [`Packed`] keeps it (options cap it at a year, far below the most it holds).
fn ttl_nanos(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_nanos()).map_or(TTL_MASK, |n| n.min(TTL_MASK))
}

/// An end as [`Packed::ttl_end`] keeps it (0: none yet).
fn end_code(end: Option<LeaseEnd>) -> u64 {
    let code = match end {
        None => 0,
        Some(LeaseEnd::Released) => 1,
        Some(LeaseEnd::Lost(LostReason::Expired)) => 2,
        Some(LeaseEnd::Lost(LostReason::Stolen)) => 3,
        Some(LeaseEnd::Lost(LostReason::Unreachable)) => 4,
    };
    code << TTL_BITS
}

impl Packed {
    fn new(st: &LeaseState) -> Self {
        let mut p = Packed {
            valid_until: pack(st.valid_until),
            sent_at: pack(st.sent_at),
            ttl_end: end_code(st.end),
            loss: None,
        };
        p.set_ttl(st.ttl);
        p.set_renew_failing(st.renew_failing);
        p
    }

    fn ttl(&self) -> Duration {
        Duration::from_nanos(self.ttl_end & TTL_MASK)
    }

    fn set_ttl(&mut self, ttl: Duration) {
        self.ttl_end = (self.ttl_end & !TTL_MASK) | ttl_nanos(ttl);
    }

    fn end(&self) -> Option<LeaseEnd> {
        match (self.ttl_end & END_MASK) >> TTL_BITS {
            0 => None,
            1 => Some(LeaseEnd::Released),
            2 => Some(LeaseEnd::Lost(LostReason::Expired)),
            3 => Some(LeaseEnd::Lost(LostReason::Stolen)),
            _ => Some(LeaseEnd::Lost(LostReason::Unreachable)),
        }
    }

    fn set_end(&mut self, end: LeaseEnd) {
        self.ttl_end = (self.ttl_end & !END_MASK) | end_code(Some(end));
    }

    fn renew_failing(&self) -> bool {
        self.ttl_end & FAILING != 0
    }

    fn set_renew_failing(&mut self, failing: bool) {
        self.ttl_end = if failing {
            self.ttl_end | FAILING
        } else {
            self.ttl_end & !FAILING
        };
    }

    fn unpacked(&self) -> LeaseState {
        LeaseState {
            valid_until: unpack(self.valid_until),
            sent_at: unpack(self.sent_at),
            ttl: self.ttl(),
            end: self.end(),
            renew_failing: self.renew_failing(),
        }
    }
}

/// What a new lease is: its name, token, kind and fence, the clock and options it lives by.
pub(crate) struct LeaseSpec {
    pub(crate) key: Arc<str>,
    pub(crate) token: Token,
    pub(crate) kind: LeaseKind,
    pub(crate) fence: Option<u64>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) options: LockOptions,
    /// A recorded holder's (see `AcquireRequest::recorded`).
    pub(crate) recorded: bool,
    /// The engine's name, for the metrics.
    pub(crate) engine: &'static str,
}

pub(crate) struct LeaseShared {
    /// Shared with the client's local queue of the name (one copy of a name a lease).
    key: Arc<str>,
    /// Compact: 24 bytes where a `Token` takes 40 (see [`engine_ref`](Self::engine_ref)).
    token: CompactToken,
    /// The kind it was taken as, in 5 bytes where a `LeaseKind` takes 8 (see
    /// [`kind`](Self::kind)): [`KIND_EXCLUSIVE`], [`KIND_SHARED`] or [`KIND_PERMIT`] with
    /// its `permits`.
    kind_tag: u8,
    permits: u32,
    /// The fence, [`NO_FENCE`] for none (8 bytes where an `Option` takes 16: every engine's
    /// fence is at most `i64::MAX`, a server's signed 64-bit counter or the file engine's,
    /// which stops there, so the value is never a fence).
    fence: u64,
    recorded: bool,
    /// The options, clock and engine name, shared by the leases taken with the same ones (see
    /// [`shared_context`]): 180 bytes a lease otherwise, for a client that holds 100,000.
    ctx: Arc<LeaseContext>,
    state: Mutex<Packed>,
    /// Woken when the lease ends or its deadline moves, and when a renewal lets go of the gate.
    /// Made by the first task that waits (see [`changed`](Self::changed)): most leases are
    /// never waited on, and 8 bytes here (a pointer set once; two first waiters may both make
    /// one, and the loser's goes) where the `Notify` takes 32 keep the lease in a smaller
    /// allocation.
    changed: once_cell::race::OnceBox<Notify>,
    /// When this holder's acquire (or the hand-off renewal) was sent: `max_hold` counts from here
    /// (packed, see [`Packed`]).
    acquired_at: i64,
    /// How many local hand-offs in a row led to this lease (0 for a fresh acquire).
    streak: u32,
    /// How many times the watchdog renewed it (for `max_renewals`; the watchdog's own count,
    /// kept here because the lease has room for it, where each entry of the watchdog's heap
    /// would cost 8 bytes more).
    renewals: AtomicU32,
    /// `RENEWING` while the watchdog has a renewal of this lease in flight; `CLOSED` once a
    /// release has ended the lease and waits for that renewal: no renewal starts after that.
    gate: AtomicU8,
    /// Set once a writer has been turned into a reader ([`kind`](Self::kind) says `Shared`
    /// from then on): a lease changes kind only that way, and only once.
    downgraded: AtomicBool,
    /// The shared session whose end the client's loss watcher waits for with this lease in
    /// its group ([`NO_SESSION`] before any): an `extend` that moved the lease to another
    /// session has it watched there too.
    watched_session: AtomicU64,
}

/// [`LeaseShared::kind_tag`]s.
const KIND_EXCLUSIVE: u8 = 0;
const KIND_SHARED: u8 = 1;
const KIND_PERMIT: u8 = 2;

/// [`LeaseShared::fence`] when the lease has none.
const NO_FENCE: u64 = u64::MAX;

/// [`LeaseShared::watched_session`] before a shared session is watched for the lease.
const NO_SESSION: u64 = u64::MAX;

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
            self.lease.notify_changed();
        }
    }
}

/// What the leases taken with the same options, on the same clock and engine, share.
pub(crate) struct LeaseContext {
    options: LockOptions,
    clock: Arc<dyn Clock>,
    /// The engine's name, for the metrics.
    engine: &'static str,
}

/// A lease's options, clock and engine behind an `Arc` that the leases taken with the same ones
/// share: the last one made on this thread is reused when equal (a client's leases mostly share
/// its defaults).
fn shared_context(
    options: LockOptions,
    clock: Arc<dyn Clock>,
    engine: &'static str,
) -> Arc<LeaseContext> {
    thread_local! {
        static LAST: std::cell::RefCell<Option<Arc<LeaseContext>>> =
            const { std::cell::RefCell::new(None) };
    }
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        match &*last {
            Some(c)
                if c.options == options
                    && std::ptr::addr_eq(Arc::as_ptr(&c.clock), Arc::as_ptr(&clock))
                    && c.engine == engine =>
            {
                c.clone()
            }
            _ => {
                let c = Arc::new(LeaseContext {
                    options,
                    clock,
                    engine,
                });
                *last = Some(c.clone());
                c
            }
        }
    })
}

impl LeaseShared {
    /// A lease whose request was sent at `sent_at`, valid for the options' validity from then.
    pub(crate) fn new(spec: LeaseSpec, sent_at: Instant) -> Self {
        let ttl = spec.options.ttl();
        let validity = spec.options.validity();
        Self::with_deadline(spec, sent_at, ttl, sent_at + validity, 0)
    }

    /// A lease valid until `valid_until`, renewed with `ttl`, the `streak`-th local hand-off in
    /// a row.
    pub(crate) fn with_deadline(
        spec: LeaseSpec,
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
        crate::metrics::held(spec.engine, spec.kind, 1.0);
        LeaseShared {
            key: spec.key,
            token: CompactToken::from(&spec.token),
            kind_tag: match spec.kind {
                LeaseKind::Exclusive => KIND_EXCLUSIVE,
                LeaseKind::Shared => KIND_SHARED,
                LeaseKind::Permit { .. } => KIND_PERMIT,
            },
            permits: match spec.kind {
                LeaseKind::Permit { permits } => permits,
                _ => 0,
            },
            fence: spec.fence.unwrap_or(NO_FENCE),
            recorded: spec.recorded,
            ctx: shared_context(spec.options, spec.clock, spec.engine),
            state: Mutex::new(Packed::new(&state)),
            changed: once_cell::race::OnceBox::new(),
            acquired_at: pack(sent_at),
            streak,
            renewals: AtomicU32::new(0),
            gate: AtomicU8::new(0),
            downgraded: AtomicBool::new(false),
            watched_session: AtomicU64::new(NO_SESSION),
        }
    }

    /// The same lease's spec with other options (a hand-off to a waiter that asked for them).
    pub(crate) fn with_options(&self, options: LockOptions) -> LeaseSpec {
        LeaseSpec {
            key: self.key.clone(),
            token: self.token.to_token(),
            kind: self.kind(),
            fence: self.fence(),
            clock: self.ctx.clock.clone(),
            options,
            recorded: self.recorded,
            engine: self.ctx.engine,
        }
    }

    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The key, shared (the local queue keeps its record of the holder under it).
    pub(crate) fn key_arc(&self) -> &Arc<str> {
        &self.key
    }

    pub(crate) fn kind(&self) -> LeaseKind {
        match self.taken_as() {
            LeaseKind::Exclusive if self.downgraded.load(Ordering::Acquire) => LeaseKind::Shared,
            kind => kind,
        }
    }

    /// The kind it was taken as (before any downgrade).
    fn taken_as(&self) -> LeaseKind {
        match self.kind_tag {
            KIND_SHARED => LeaseKind::Shared,
            KIND_PERMIT => LeaseKind::Permit {
                permits: self.permits,
            },
            _ => LeaseKind::Exclusive,
        }
    }

    /// Records that the engine has turned this writer into a reader.
    pub(crate) fn set_downgraded(&self) {
        if !self.downgraded.swap(true, Ordering::AcqRel) && self.taken_as() == LeaseKind::Exclusive
        {
            crate::metrics::held(self.ctx.engine, LeaseKind::Exclusive, -1.0);
            crate::metrics::held(self.ctx.engine, LeaseKind::Shared, 1.0);
        }
    }

    pub(crate) fn token(&self) -> Token {
        self.token.to_token()
    }

    pub(crate) fn fence(&self) -> Option<u64> {
        Some(self.fence).filter(|f| *f != NO_FENCE)
    }

    pub(crate) fn options(&self) -> &LockOptions {
        &self.ctx.options
    }

    pub(crate) fn now(&self) -> Instant {
        self.ctx.clock.now()
    }

    /// When this holder's acquire (or the hand-off renewal) was sent.
    pub(crate) fn acquired_at(&self) -> Instant {
        unpack(self.acquired_at)
    }

    /// How many local hand-offs in a row led to this lease.
    pub(crate) fn streak(&self) -> u32 {
        self.streak
    }

    /// How many times the watchdog has renewed it.
    pub(crate) fn renewals(&self) -> u32 {
        self.renewals.load(Ordering::Relaxed)
    }

    /// The watchdog renewed it once more.
    pub(crate) fn count_renewal(&self) {
        let n = self.renewals.load(Ordering::Relaxed);
        self.renewals.store(n.saturating_add(1), Ordering::Relaxed);
    }

    /// The lease as the engine names it, with its `token` spelled out (from
    /// [`token`](Self::token): the lease keeps it compact, and the engine's `LeaseRef` borrows
    /// a `Token`).
    pub(crate) fn engine_ref<'a>(&'a self, token: &'a Token) -> LeaseRef<'a> {
        LeaseRef::new(&self.key, token, self.kind()).recorded(self.recorded)
    }

    fn lock(&self) -> MutexGuard<'_, Packed> {
        self.state.locked()
    }

    pub(crate) fn snapshot(&self) -> LeaseState {
        self.lock().unpacked()
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

    /// Takes the gate as a renewal would, waiting for a renewal in flight to finish: no renewal
    /// of this lease is sent while the returned `Renewal` lives (the watchdog tries again a
    /// little later). `None` once a release has closed the gate. Cancel-safe.
    pub(crate) async fn hold_gate(self: &Arc<Self>) -> Option<Renewal> {
        loop {
            if let Some(held) = self.begin_renewal() {
                return Some(held);
            }
            if self.gate.load(Ordering::Acquire) & CLOSED != 0 {
                return None;
            }
            // A renewal is in flight: one round trip at most. Its end is not signalled to
            // anybody but a release, so look again shortly.
            let changed = self.changed().notified();
            let _ = tokio::time::timeout(Duration::from_millis(2), changed).await;
        }
    }

    /// The `Notify` a task waits on for a change (made at the first wait).
    ///
    /// A waiter gets it, registers, and then reads the state; a change is made, and then
    /// [`notify_changed`](Self::notify_changed) looks for the `Notify`. A change that finds
    /// none was made before the waiter read the state, so the waiter sees it: the state is
    /// read under the lease's mutex (the deadline, the end), whose lock orders the two, or by
    /// a read-modify-write of the gate (a renewal's end): the gate's read-modify-writes are
    /// totally ordered, and the later one reads from the earlier, so it sees what came before
    /// it (the `Notify` made).
    fn changed(&self) -> &Notify {
        self.changed.get_or_init(|| Box::new(Notify::new()))
    }

    /// Wakes the tasks waiting for a change, if any task ever waited.
    fn notify_changed(&self) {
        if let Some(changed) = self.changed.get() {
            changed.notify_waiters();
        }
    }

    /// Closes the gate for good and waits for a renewal in flight to finish: after this, no
    /// renewal of this lease is ever sent. Call it after ending the lease. Cancel-safe.
    pub(crate) async fn close_gate(&self) {
        if self.gate.fetch_or(CLOSED, Ordering::AcqRel) & RENEWING == 0 {
            return;
        }
        loop {
            let changed = self.changed().notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            // Read by a read-modify-write, not a load: it reads the gate's latest value, so
            // either the renewal's end is seen here, or the renewal's `fetch_and` comes after
            // it, reads from it, and so sees the `Notify` made above (see `notify_changed`).
            if self.gate.fetch_or(CLOSED, Ordering::AcqRel) & RENEWING == 0 {
                return;
            }
            changed.await;
        }
    }

    pub(crate) fn is_held(&self) -> bool {
        let st = self.snapshot();
        st.end.is_none() && self.ctx.clock.now() < st.valid_until
    }

    /// Whether the holder released the lease (its release may still be on its way).
    pub(crate) fn is_released(&self) -> bool {
        self.snapshot().end == Some(LeaseEnd::Released)
    }

    /// Records a successful renewal sent at `sent_at`. Returns false if the lease had ended,
    /// including when its deadline passed before the reply came: once `is_held` has turned
    /// false it never turns true again.
    pub(crate) fn renewed(&self, sent_at: Instant, ttl: Duration, validity: Duration) -> bool {
        {
            // One lock: the deadline, then the renewal (as `end_if_past_deadline` would).
            let mut st = self.lock();
            if st.end().is_some() {
                return false;
            }
            if self.ctx.clock.now() >= unpack(st.valid_until) {
                let reason = if st.renew_failing() {
                    LostReason::Unreachable
                } else {
                    LostReason::Expired
                };
                drop(st);
                self.lose(reason);
                return false;
            }
            st.set_renew_failing(false);
            let sent = pack(sent_at);
            if sent >= st.sent_at {
                st.sent_at = sent;
                st.valid_until = pack(sent_at + validity);
                st.set_ttl(ttl);
            }
        }
        self.notify_changed();
        true
    }

    /// Why the lease is lost when the engine no longer has our key: before our deadline, it
    /// cannot have run out, so somebody removed it; after, it expired.
    pub(crate) fn missing_reason(&self) -> LostReason {
        if self.ctx.clock.now() < self.snapshot().valid_until {
            LostReason::Stolen
        } else {
            LostReason::Expired
        }
    }

    /// A renewal is on its way: until it is confirmed, a deadline passing means `Unreachable`.
    pub(crate) fn renew_sent(&self) {
        // Not a failure: none is counted.
        self.lock().set_renew_failing(true);
    }

    pub(crate) fn renew_failed(&self) {
        // Only the reason for a deadline that passes changes: nobody waits for this.
        self.lock().set_renew_failing(true);
        crate::metrics::renew_failed(self.ctx.engine);
    }

    /// The shared session whose end the loss watcher waits for with this lease, if any.
    pub(crate) fn watched_session(&self) -> Option<u64> {
        Some(self.watched_session.load(Ordering::Acquire)).filter(|s| *s != NO_SESSION)
    }

    /// The loss watcher waits for the end of shared `session` with this lease.
    pub(crate) fn set_watched_session(&self, session: u64) {
        self.watched_session.store(session, Ordering::Release);
    }

    /// Watched by a client's loss watcher (see `losses`), which `counter` tells of the end.
    pub(crate) fn set_loss_counter(&self, counter: &Arc<losses::LossCounter>) {
        let mut st = self.lock();
        if st.loss.is_none() {
            st.loss = Some(counter.clone());
        }
    }

    /// Ends the lease as lost, unless it already ended. Returns how it ended.
    pub(crate) fn lose(&self, reason: LostReason) -> LeaseEnd {
        self.finish(LeaseEnd::Lost(reason))
    }

    /// Ends the lease as released by its holder, unless it already ended. Returns how it ended.
    pub(crate) fn mark_released(&self) -> LeaseEnd {
        self.finish(LeaseEnd::Released)
    }

    fn finish(&self, end: LeaseEnd) -> LeaseEnd {
        {
            let mut st = self.lock();
            if let Some(prev) = st.end() {
                return prev;
            }
            st.set_end(end);
            if let Some(counter) = &st.loss {
                counter.note_end();
            }
        }
        self.notify_changed();
        crate::metrics::held(self.ctx.engine, self.kind(), -1.0);
        if let LeaseEnd::Lost(reason) = end {
            crate::metrics::lost(self.ctx.engine, reason);
            tracing::warn!(
                target: "distlock",
                key = %self.key,
                fence = ?self.fence(),
                reason = %reason,
                "lock lost"
            );
        }
        end
    }

    /// The reason the lease is lost now: its earlier loss, or its deadline passing (the reason
    /// then says whether renewals were failing). `None` while it is held, and once released.
    pub(crate) fn lost_by_now(&self) -> Option<LostReason> {
        self.end_if_past_deadline().and_then(LeaseEnd::lost)
    }

    /// Ends the lease as lost if its deadline has passed; returns how it ended, if it did.
    pub(crate) fn end_if_past_deadline(&self) -> Option<LeaseEnd> {
        let st = self.snapshot();
        if let Some(r) = st.end {
            return Some(r);
        }
        if self.ctx.clock.now() < st.valid_until {
            return None;
        }
        let reason = if st.renew_failing {
            LostReason::Unreachable
        } else {
            LostReason::Expired
        };
        Some(self.lose(reason))
    }

    /// Resolves when the lease is lost; never, once it was released.
    pub(crate) async fn lost(&self) -> LostReason {
        match self.ended().await {
            LeaseEnd::Lost(reason) => reason,
            LeaseEnd::Released => std::future::pending().await,
        }
    }

    /// Resolves when the lease ends, however it ends.
    pub(crate) async fn ended(&self) -> LeaseEnd {
        loop {
            let changed = self.changed().notified();
            tokio::pin!(changed);
            // Registered before the check: an end or a renewal after it wakes the wait.
            changed.as_mut().enable();
            let st = self.snapshot();
            if let Some(r) = st.end {
                return r;
            }
            let now = self.ctx.clock.now();
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
        self.shared.fence()
    }

    /// The token stored under the key for this acquisition.
    pub fn token(&self) -> Token {
        self.shared.token()
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

    /// Resolves when the lease is lost (expired, stolen, unreachable). It never resolves once
    /// the lease was released: code that must stop either way awaits [`ended`](Self::ended).
    ///
    /// # Cancel safety
    /// Cancel-safe: drop it and call again at will, for example inside `tokio::select!`.
    pub async fn lost(&self) -> LostReason {
        self.shared.lost().await
    }

    /// Resolves when the lease ends, lost or released (by its guard's `release`, drop or
    /// `leak`).
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn ended(&self) -> LeaseEnd {
        self.shared.ended().await
    }
}

impl fmt::Debug for LeaseHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseHandle")
            .field("key", &self.shared.key)
            .field("fence", &self.shared.fence())
            .field("held", &self.is_held())
            .finish()
    }
}

#[cfg(test)]
impl LeaseShared {
    /// An exclusive lease on `name` for the core's unit tests: a fresh token, a 30 s TTL, the
    /// system clock, taken now.
    pub(crate) fn for_test(name: &str) -> LeaseShared {
        let spec = LeaseSpec {
            key: name.into(),
            token: Token::generate(),
            kind: LeaseKind::Exclusive,
            fence: None,
            clock: Arc::new(crate::clock::SystemClock),
            options: LockOptions::builder()
                .ttl(Duration::from_secs(30))
                .build()
                .expect("options"),
            recorded: false,
            engine: "test",
        };
        LeaseShared::new(spec, Instant::now())
    }
}

#[cfg(all(test, distlock_loom))]
mod loom_model;

/// The lease's `Notify` is made by the first waiter, so a change and a wait that race must
/// still meet: run each race many times on two threads, and require every wait to end.
#[cfg(test)]
mod lazy_wakes {
    use super::*;

    const ROUNDS: usize = 2_000;

    /// A release that closes the gate while a renewal in flight ends on another thread.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_waiting_for_a_renewal_always_hears_it_end() {
        for _ in 0..ROUNDS {
            let lease = Arc::new(LeaseShared::for_test("gate"));
            let renewal = lease.begin_renewal().expect("the gate is open");
            let ender = std::thread::spawn(move || drop(renewal));
            let closed = tokio::time::timeout(Duration::from_secs(5), lease.close_gate()).await;
            assert!(closed.is_ok(), "a release never heard the renewal end");
            ender.join().expect("the renewal's thread");
            assert!(lease.begin_renewal().is_none(), "the gate stays closed");
        }
    }

    /// A task waiting for the lease's end while another thread ends it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_for_the_end_always_hears_it() {
        for _ in 0..ROUNDS {
            let lease = Arc::new(LeaseShared::for_test("end"));
            let other = lease.clone();
            let ender = std::thread::spawn(move || other.lose(LostReason::Stolen));
            let ended = tokio::time::timeout(Duration::from_secs(5), lease.ended()).await;
            assert_eq!(ended.ok(), Some(LeaseEnd::Lost(LostReason::Stolen)));
            ender.join().expect("the ending thread");
        }
    }

    /// A lease nobody waited on has no `Notify`; a wait makes one.
    #[test]
    fn the_notify_is_made_by_the_first_wait_only() {
        let lease = LeaseShared::for_test("lazy");
        lease.notify_changed();
        assert!(lease.changed.get().is_none());
        let _wait = lease.changed().notified();
        assert!(lease.changed.get().is_some());
    }
}

/// The packed state keeps every end, the failing flag and the longest TTL apart.
#[cfg(test)]
mod packing {
    use super::*;

    #[test]
    fn every_field_of_the_packed_state_reads_back_as_written() {
        let now = Instant::now();
        let ends = [
            None,
            Some(LeaseEnd::Released),
            Some(LeaseEnd::Lost(LostReason::Expired)),
            Some(LeaseEnd::Lost(LostReason::Stolen)),
            Some(LeaseEnd::Lost(LostReason::Unreachable)),
        ];
        let ttls = [
            Duration::from_millis(1),
            Duration::from_secs(3),
            crate::options::MAX_TTL,
        ];
        for end in ends {
            for ttl in ttls {
                for failing in [false, true] {
                    let st = LeaseState {
                        valid_until: now + ttl,
                        sent_at: now,
                        ttl,
                        end,
                        renew_failing: failing,
                    };
                    let mut p = Packed::new(&st);
                    let back = p.unpacked();
                    assert_eq!(
                        (back.ttl, back.end, back.renew_failing),
                        (ttl, end, failing)
                    );
                    p.set_renew_failing(!failing);
                    p.set_ttl(Duration::from_secs(7));
                    let back = p.unpacked();
                    let moved = (back.ttl, back.end, back.renew_failing);
                    assert_eq!(moved, (Duration::from_secs(7), end, !failing));
                    p.set_end(LeaseEnd::Released);
                    assert_eq!(p.end(), Some(LeaseEnd::Released));
                    assert_eq!(p.renew_failing(), !failing);
                }
            }
        }
    }
}
