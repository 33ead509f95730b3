//! Guards, and what the guards of one client share ([`ClientState`]): the engine's driver, the
//! local queues and the watchdog. A guard is made when a lease is taken: it registers the
//! lease with the watchdog, with the local queue and with the engine's session events, and it
//! ends the lease on every path (release, drop, leak, a hand-off to a local waiter).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::driver::Driver;
use crate::engine::{LeaseCheck, LeaseKind, LeaseRef, SessionWatch};
use crate::error::{ErrorKind, LockError};
use crate::lease::{LeaseEnd, LeaseHandle, LeaseShared, LostReason};
use crate::local::LocalQueues;
use crate::token::Token;
use crate::watchdog::Watchdog;

mod fenced;
mod typed;

pub use fenced::{Fence, Fenced};
pub(crate) use fenced::{no_fence, require_fences};
pub use typed::{DowngradeError, Guard, Permit, ReadGuard, WriteGuard};
pub(crate) use typed::{needs_fence, wrap};

/// What `release` found: whether the lease was still ours when we let it go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a release that finds the lease already lost means the critical section may not have been exclusive"]
pub enum Released {
    /// The lock still held our token and has been deleted: exclusivity held until now.
    Held,
    /// The lease had already ended before the release; the critical section may have overlapped
    /// with another holder.
    Lost(LostReason),
}

impl Released {
    /// Whether the lease was still ours at release.
    pub fn was_held(&self) -> bool {
        matches!(self, Released::Held)
    }
}

/// A lease given up without releasing it ([`LockGuard::leak`]): the lock stays taken until its
/// TTL runs out (or, on session engines, until this process ends).
#[derive(Debug, Clone)]
pub struct LeakedLease {
    /// The lock key.
    pub key: String,
    /// The token stored under the key.
    pub token: Token,
    /// The fencing token.
    pub fence: Option<u64>,
    /// The deadline of the lease when it was leaked.
    pub valid_until: Instant,
}

/// What the guards of one client share, and where they are made: the engine's driver, the
/// client's local queues (when on) and its watchdog.
pub(crate) struct ClientState {
    driver: Arc<Driver>,
    local: Option<LocalQueues<Handoff>>,
    watchdog: Watchdog,
    /// The engine's word that a lease's session ended, for every lease of the client.
    losses: crate::lease::losses::Losses,
}

impl ClientState {
    pub(crate) fn new(driver: Driver, local_queue: bool) -> Self {
        let driver = Arc::new(driver);
        let engine = Arc::downgrade(&driver);
        let still_on = Box::new(move |lease: &LeaseRef<'_>, session: u64| {
            engine.upgrade().is_some_and(|d| d.still_on(lease, session))
        });
        ClientState {
            driver,
            local: local_queue.then(LocalQueues::new),
            watchdog: Watchdog::new(),
            losses: crate::lease::losses::Losses::new(still_on),
        }
    }

    pub(crate) fn driver(&self) -> &Arc<Driver> {
        &self.driver
    }

    /// The local queues, unless the client turned them off.
    pub(crate) fn local(&self) -> Option<&LocalQueues<Handoff>> {
        self.local.as_ref()
    }

    /// The local queues for leases of `kind`: exclusive leases only. A local queue lets one
    /// task of the client hold a name and one wait on the engine for it, handing the lease from
    /// task to task; readers and permits share a name, so each task asks the engine itself.
    pub(crate) fn local_for(&self, kind: LeaseKind) -> Option<&LocalQueues<Handoff>> {
        self.local.as_ref().filter(|_| kind == LeaseKind::Exclusive)
    }

    /// The guard of a lease just taken: this client's holder of the key from now, renewed by
    /// the watchdog (unless the options say not to), and ended at once when the engine says its
    /// session ended.
    pub(crate) fn guard(self: &Arc<Self>, lease: Arc<LeaseShared>) -> LockGuard {
        if let Some(local) = self.local_for(lease.kind()) {
            local.set_holder(lease.key(), &lease);
        }
        if lease.options().auto_renew() {
            self.watchdog.watch(&self.driver, lease.clone());
        }
        if let Some(end) = self.driver.session_end(&lease.engine_ref(&lease.token())) {
            self.losses.watch(&lease, end);
        }
        LockGuard {
            holding: self.clone(),
            lease,
            done: false,
        }
    }

    /// After a renewal to another TTL (answered or not: a move may have been made before the
    /// call failed or was cancelled): an engine may have moved the lease to another shared
    /// session, whose end it hears from now (at the old one's end, the engine says it left).
    fn rewatch(&self, lease: &Arc<LeaseShared>) {
        if lease.snapshot().end.is_some() {
            return;
        }
        if let Some(w @ SessionWatch::Shared { session, .. }) =
            self.driver.session_end(&lease.engine_ref(&lease.token()))
            && lease.watched_session() != Some(session)
        {
            self.losses.watch(lease, w);
        }
    }
}

/// Looks at a lease's session again when dropped (see [`ClientState::rewatch`]).
struct Rewatch<'a> {
    holding: &'a ClientState,
    lease: &'a Arc<LeaseShared>,
}

impl Drop for Rewatch<'_> {
    fn drop(&mut self) {
        self.holding.rewatch(self.lease);
    }
}

/// Proof that we hold a lock, until it is released, dropped or lost.
///
/// # Release on drop is not immediate
/// Dropping a guard does no I/O and never blocks: it stops the watchdog and spawns a best-effort
/// release on the current tokio runtime. Outside a runtime, nothing is sent and the engine frees
/// the lock when its TTL runs out. Call [`release`](Self::release) to know whether the lease was
/// still ours.
#[must_use = "dropping the guard releases the lock at once (in the background)"]
pub struct LockGuard {
    holding: Arc<ClientState>,
    lease: Arc<LeaseShared>,
    done: bool,
}

/// A lease handed from a releasing holder to a waiting task of the same client. If it is never
/// taken (the waiter's future was dropped), its drop releases the lock.
pub(crate) struct Handoff {
    holding: Arc<ClientState>,
    lease: Option<Arc<LeaseShared>>,
}

impl Handoff {
    /// The guard of the handed-over lease.
    pub(crate) fn into_guard(mut self) -> Option<LockGuard> {
        let lease = self.lease.take()?;
        Some(self.holding.guard(lease))
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            let before = lease.lost_by_now();
            lease.mark_released();
            spawn_finish(self.holding.clone(), lease, before);
        }
    }
}

fn spawn_finish(holding: Arc<ClientState>, lease: Arc<LeaseShared>, before: Option<LostReason>) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            if let Err(e) = finish(&holding, &lease, before).await {
                tracing::debug!(target: "distlock", key = %lease.key(), error = %e,
                    "background release failed; the TTL will free the lock");
            }
        });
    } else if let Some(local) = holding.local_for(lease.kind()) {
        local.clear_holder(lease.key(), &lease);
    }
}

/// Ends a lease that the caller has already marked released: waits for any renewal in flight,
/// hands the lease to a local waiter if the options ask for it, and otherwise releases it on the
/// engine (which compares the token). `before` is how the lease was lost before the release, if
/// it was.
async fn finish(
    holding: &Arc<ClientState>,
    lease: &Arc<LeaseShared>,
    before: Option<LostReason>,
) -> Result<Released, LockError> {
    // Wait for a renewal in flight, and let no other start: no renewal ever follows the release.
    lease.close_gate().await;
    let result = async {
        if before.is_none()
            && lease.options().handoff()
            && lease.streak() < lease.options().handoff_streak()
            && let Some(done) = hand_off(holding, lease).await
        {
            return done;
        }
        let next = holding
            .local_for(lease.kind())
            .and_then(|l| l.next_waiter(lease.key()));
        let reply = holding
            .driver()
            .release(
                &lease.engine_ref(&lease.token()),
                next.as_ref()
                    .map(|(token, ttl, label)| (token, *ttl, label.as_deref())),
            )
            .await;
        match (before, reply) {
            (Some(reason), _) => Ok(Released::Lost(reason)),
            (None, Ok(LeaseCheck::Ours)) => Ok(Released::Held),
            (None, Ok(LeaseCheck::Missing)) => Ok(Released::Lost(lease.missing_reason())),
            (None, Ok(LeaseCheck::Foreign)) => Ok(Released::Lost(LostReason::Stolen)),
            (None, Err(e)) => Err(e),
        }
    }
    .await;
    if let Some(local) = holding.local_for(lease.kind()) {
        local.clear_holder(lease.key(), lease);
    }
    result
}

/// Gives the lease to the next local waiter with one renewal. `None` when nobody took it (the
/// caller then releases as usual).
async fn hand_off(
    holding: &Arc<ClientState>,
    lease: &Arc<LeaseShared>,
) -> Option<Result<Released, LockError>> {
    let local = holding.local_for(lease.kind())?;
    let mut offer = local.offer(lease.key(), lease)?;
    let ttl = offer.options.ttl();
    let sent = lease.now();
    let renewed = holding
        .driver()
        .renew(&lease.engine_ref(&lease.token()), ttl)
        .await;
    match renewed {
        Ok(LeaseCheck::Ours) => {}
        Ok(check) => {
            local.withdraw(lease.key(), offer);
            let reason = if check == LeaseCheck::Foreign {
                LostReason::Stolen
            } else {
                lease.missing_reason()
            };
            return Some(Ok(Released::Lost(reason)));
        }
        Err(e) => {
            tracing::debug!(target: "distlock", key = %lease.key(), error = %e,
                "hand-off renewal failed; releasing instead");
            local.withdraw(lease.key(), offer);
            return None;
        }
    }
    // The lock is ours until sent + ttl: give it to the first waiter still there.
    loop {
        let options = offer.options;
        let validity = ttl.saturating_sub(options.drift_for(ttl));
        let next = Arc::new(LeaseShared::with_deadline(
            lease.with_options(options),
            sent,
            ttl,
            sent + validity,
            lease.streak() + 1,
        ));
        let value = Handoff {
            holding: holding.clone(),
            lease: Some(next.clone()),
        };
        match local.deliver(lease.key(), offer, &next, value) {
            Ok(()) => {
                crate::metrics::handoff(holding.driver().backend().name(), "local");
                tracing::debug!(target: "distlock", key = %lease.key(), fence = ?lease.fence(),
                    streak = lease.streak() + 1, "lock handed to a local waiter");
                return Some(Ok(Released::Held));
            }
            Err(mut back) => {
                // That waiter has gone: nobody must release this lease on its behalf.
                back.lease = None;
                match local.offer(lease.key(), lease) {
                    Some(o) => offer = o,
                    None => return None,
                }
            }
        }
    }
}

impl LockGuard {
    /// The lock key.
    pub fn key(&self) -> &str {
        self.lease.key()
    }

    /// The kind of lease held: exclusive (a mutex or a writer), shared (a reader), or one of a
    /// semaphore's permits.
    pub fn kind(&self) -> LeaseKind {
        self.lease.kind()
    }

    /// The fencing token: strictly greater for every new holder of this key. `None` when the
    /// engine cannot give a correct one.
    pub fn fence(&self) -> Option<u64> {
        self.lease.fence()
    }

    /// The token stored under the key.
    pub fn token(&self) -> Token {
        self.lease.token()
    }

    /// The deadline of the lease on the monotonic clock: the moment the acquire (or the last
    /// renewal) was **sent**, plus the TTL, minus the drift allowance.
    pub fn valid_until(&self) -> Instant {
        self.lease.snapshot().valid_until
    }

    /// Whether the lease is still ours (not lost, deadline not passed). No I/O.
    pub fn is_held(&self) -> bool {
        self.lease.is_held()
    }

    /// A clonable view of this lease (key, fence, `is_held`, `lost`) for other tasks.
    pub fn handle(&self) -> LeaseHandle {
        LeaseHandle {
            shared: self.lease.clone(),
        }
    }

    /// Resolves when the lease is lost (the guard's own release ends it otherwise).
    ///
    /// Race it against the work, so that the work stops as soon as the lock is no longer ours:
    ///
    /// ```no_run
    /// # async fn work() {}
    /// # async fn demo(
    /// #     locks: distlock_core::LockClient,
    /// # ) -> Result<(), distlock_core::LockError> {
    /// let guard = locks.acquire("migrations").await?;
    /// tokio::select! {
    ///     reason = guard.lost() => eprintln!("lock lost ({reason}): stopped half-way"),
    ///     () = work() => {}
    /// }
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn lost(&self) -> LostReason {
        self.lease.lost().await
    }

    /// Renews the lease to `ttl`, counted from the moment this request is sent.
    ///
    /// # Errors
    /// `Lost` if the lease has already ended or the engine no longer holds our token (the guard
    /// then reports lost); `Config` for a TTL the options would refuse; engine errors otherwise,
    /// which leave the lease as it was.
    ///
    /// # Cancel safety
    /// Cancelling may or may not have renewed the lease; the deadline is only moved on a reply.
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        crate::options::LockOptions::builder()
            .ttl(ttl)
            .auto_renew(false)
            .build()?;
        let lease = &self.lease;
        if let Some(end) = lease.end_if_past_deadline() {
            return Err(lost_error(lease.key(), end));
        }
        let sent = lease.now();
        // A renewal to another TTL may move the lease to another session (etcd): however the
        // call ends, its session is looked at again.
        let _rewatch = (ttl != lease.snapshot().ttl).then(|| Rewatch {
            holding: &self.holding,
            lease,
        });
        let check = self
            .holding
            .driver()
            .renew(&lease.engine_ref(&lease.token()), ttl)
            .await?;
        match check {
            LeaseCheck::Ours => {
                let validity = ttl.saturating_sub(lease.options().drift_for(ttl));
                if !lease.renewed(sent, ttl, validity) {
                    let end = lease.snapshot().end.unwrap_or(LeaseEnd::Released);
                    return Err(lost_error(lease.key(), end));
                }
                tracing::debug!(target: "distlock", key = %lease.key(), fence = ?lease.fence(),
                    valid_for_ms = validity.as_millis() as u64, "lock renewed");
                Ok(())
            }
            LeaseCheck::Missing => Err(lost_error(lease.key(), lease.lose(lease.missing_reason()))),
            LeaseCheck::Foreign => Err(lost_error(lease.key(), lease.lose(LostReason::Stolen))),
        }
    }

    /// The engine's step of [`WriteGuard::downgrade`], which documents it.
    pub(crate) async fn downgrade(&mut self) -> Result<(), LockError> {
        let lease = self.lease.clone();
        if lease.kind() != LeaseKind::Exclusive {
            return Err(LockError::new(
                ErrorKind::Config,
                format!(
                    "lock {:?}: only a writer can be downgraded, and this guard holds a {} lease",
                    lease.key(),
                    lease.kind().name()
                ),
            ));
        }
        // No renewal may go out as a writer's once the engine has made us a reader.
        let Some(_gate) = lease.hold_gate().await else {
            return Err(lost_error(lease.key(), LeaseEnd::Released));
        };
        if let Some(end) = lease.end_if_past_deadline() {
            return Err(lost_error(lease.key(), end));
        }
        let ttl = lease.snapshot().ttl;
        let check = self
            .holding
            .driver()
            .downgrade(&lease.engine_ref(&lease.token()), ttl)
            .await?;
        match check {
            LeaseCheck::Ours => {
                // The deadline stays the writer's: an engine whose leases live on a session
                // (etcd) did not refresh it, and the watchdog renews the reader from here.
                lease.set_downgraded();
                // Other tasks of this client that wait for the writer's lock now wait on the
                // engine, behind this reader.
                if let Some(local) = self.holding.local() {
                    local.clear_holder(lease.key(), &lease);
                }
                tracing::debug!(target: "distlock", key = %lease.key(), fence = ?lease.fence(),
                    "writer downgraded to a reader");
                Ok(())
            }
            LeaseCheck::Missing => Err(lost_error(lease.key(), lease.lose(lease.missing_reason()))),
            LeaseCheck::Foreign => Err(lost_error(lease.key(), lease.lose(LostReason::Stolen))),
        }
    }

    /// Writes `owner` as the label of this lease's holder, keeping the lease (an election's new
    /// value).
    pub(crate) async fn relabel(&self, owner: &str) -> Result<(), LockError> {
        let lease = &self.lease;
        if let Some(end) = lease.end_if_past_deadline() {
            return Err(lost_error(lease.key(), end));
        }
        let check = self
            .holding
            .driver()
            .relabel(&lease.engine_ref(&lease.token()), owner)
            .await?;
        match check {
            LeaseCheck::Ours => Ok(()),
            LeaseCheck::Missing => Err(lost_error(lease.key(), lease.lose(lease.missing_reason()))),
            LeaseCheck::Foreign => Err(lost_error(lease.key(), lease.lose(LostReason::Stolen))),
        }
    }

    /// Releases the lock (compare-and-delete: never another owner's lock) and says whether the
    /// lease was still ours. No renewal goes out after this returns.
    ///
    /// A lease already known to be lost (the lost signal fired, or its deadline passed) is
    /// reported as [`Released::Lost`] at once, without waiting on the engine, which may be the
    /// very thing that stopped answering: the compare-and-delete that frees the key early if
    /// it is still ours goes out in the background, as on drop.
    ///
    /// # Errors
    /// Engine errors (the lock then frees when its TTL runs out).
    ///
    /// # Cancel safety
    /// If cancelled, the lock is released in the background as on drop.
    pub async fn release(mut self) -> Result<Released, LockError> {
        self.done = true;
        let lease = self.lease.clone();
        let before = lease.lost_by_now();
        lease.mark_released();
        if let Some(reason) = before {
            spawn_finish(self.holding.clone(), lease, before);
            tracing::debug!(target: "distlock", key = %self.lease.key(), fence = ?self.lease.fence(),
                %reason, "released a lease that was already lost");
            return Ok(Released::Lost(reason));
        }
        // If this future is dropped half-way, release in the background instead.
        let mut pending = PendingFinish {
            holding: &self.holding,
            lease: &lease,
            before,
            armed: true,
        };
        let engine = self.holding.driver().backend().name();
        let span = crate::trace::release(engine, lease.key(), lease.fence());
        let mut run = std::pin::pin!(tracing::Instrument::instrument(
            finish(&self.holding, &lease, before),
            span
        ));
        let outcome = run.as_mut().await;
        pending.armed = false;
        run.span().record(
            "outcome",
            match &outcome {
                Ok(Released::Held) => "released",
                Ok(_) => "lost",
                Err(_) => "error",
            },
        );
        let outcome = outcome?;
        tracing::debug!(target: "distlock", key = %lease.key(), fence = ?lease.fence(),
            held = outcome.was_held(), "lock released");
        Ok(outcome)
    }

    /// Ends the guard so that the lock is free once `at_least` has passed since it was taken
    /// (counted on this client's monotonic clock from when the acquire was sent); at once if
    /// that time has passed. The scheduled-job case: when every host's cron starts the same
    /// job and each keeps the lock for the period, the job runs once a period however quick it
    /// is and however far apart (less than `at_least`) the hosts' clocks are.
    ///
    /// - Where the engine's leases can outlive their holder ([`lingers`](Self::lingers):
    ///   Redis, Redlock, Sentinel and Cluster, etcd, memcached, the file engine's exclusive
    ///   locks), the lease is set to run out by itself then, and this returns at once: the
    ///   process may exit (or crash) and the lock stays taken until then, as ShedLock's
    ///   `lockAtLeastFor`. Engines count in their own units and round up: etcd's leases in
    ///   whole seconds (with its least TTL), memcached in seconds.
    /// - Elsewhere (ZooKeeper's ephemeral nodes, PostgreSQL and MySQL session locks: a lease
    ///   ends with its session), it keeps the lock until then, the watchdog renewing it, and
    ///   releases it; so it does too when the engine could not be told (an error), which
    ///   `DEBUG` logs.
    ///
    /// A lease found lost is reported ([`Released::Lost`]), while it waits too.
    ///
    /// # Errors
    /// As [`release`](Self::release).
    ///
    /// # Cancel safety
    /// If cancelled, the lock is released in the background as on drop (without waiting out
    /// the rest of `at_least`).
    pub async fn release_after(mut self, at_least: Duration) -> Result<Released, LockError> {
        // Past what an instant holds (`Duration::MAX`): all of it, as good as never.
        let left = match self.lease.acquired_at().checked_add(at_least) {
            Some(end) => end.saturating_duration_since(self.lease.now()),
            None => at_least,
        };
        if left.is_zero() {
            return self.release().await;
        }
        if self.lingers()
            && let Some(done) = self.leave(left).await
        {
            return done;
        }
        tokio::select! {
            () = tokio::time::sleep(left) => {}
            _ = self.lost() => {}
        }
        self.release().await
    }

    /// Whether [`release_after`](Self::release_after) can leave this lease on the engine to
    /// run out by itself (and return at once), rather than keep it until then.
    pub fn lingers(&self) -> bool {
        self.holding.driver().lingers(self.lease.kind())
    }

    /// Leaves the lease to run out by itself `left` from now. `None` when it was not done (the
    /// lease is already lost, or the engine failed): the guard holds on as before.
    async fn leave(&mut self, left: Duration) -> Option<Result<Released, LockError>> {
        let lease = self.lease.clone();
        if lease.lost_by_now().is_some() {
            return None;
        }
        // No renewal crosses the engine's change: one after it would stretch the lease back
        // to its TTL.
        let gate = lease.hold_gate().await?;
        let outcome = match self
            .holding
            .driver()
            .linger(&lease.engine_ref(&lease.token()), left)
            .await
        {
            Ok(LeaseCheck::Ours) => Released::Held,
            Ok(LeaseCheck::Missing) => Released::Lost(lease.missing_reason()),
            Ok(LeaseCheck::Foreign) => Released::Lost(LostReason::Stolen),
            Err(e) => {
                tracing::debug!(target: "distlock", key = %lease.key(), error = %e,
                    "could not leave the lock to run out by itself; keeping it until then");
                return None;
            }
        };
        self.done = true;
        match outcome {
            Released::Held => lease.mark_released(),
            Released::Lost(reason) => lease.lose(reason),
        };
        drop(gate);
        lease.close_gate().await;
        if let Some(local) = self.holding.local_for(lease.kind()) {
            local.clear_holder(lease.key(), &lease);
        }
        tracing::debug!(target: "distlock", key = %lease.key(), fence = ?lease.fence(),
            left_ms = left.as_millis() as u64, held = outcome.was_held(),
            "lock left to run out by itself");
        Some(Ok(outcome))
    }

    /// Gives the guard up without releasing: the watchdog stops and the lock stays taken until
    /// its TTL runs out (on engines whose leases do not expire, `capabilities().expiring` false,
    /// until the client's session ends). Returns what is needed to release it later by hand.
    pub fn leak(mut self) -> LeakedLease {
        self.done = true;
        let valid_until = self.valid_until();
        self.lease.mark_released();
        if let Some(local) = self.holding.local_for(self.lease.kind()) {
            local.clear_holder(self.lease.key(), &self.lease);
        }
        // Nobody renews it from now: where it shares a session with renewed leases, it must
        // not live on with them.
        if self.lease.options().auto_renew()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let (driver, lease) = (self.holding.driver().clone(), self.lease.clone());
            let left = valid_until.saturating_duration_since(lease.now());
            rt.spawn(async move { driver.detach(&lease.engine_ref(&lease.token()), left).await });
        }
        LeakedLease {
            key: self.lease.key().to_owned(),
            token: self.lease.token(),
            fence: self.lease.fence(),
            valid_until,
        }
    }
}

/// Finishes a release in the background if `release()` is cancelled.
struct PendingFinish<'a> {
    holding: &'a Arc<ClientState>,
    lease: &'a Arc<LeaseShared>,
    before: Option<LostReason>,
    armed: bool,
}

impl Drop for PendingFinish<'_> {
    fn drop(&mut self) {
        if self.armed {
            spawn_finish(self.holding.clone(), self.lease.clone(), self.before);
        }
    }
}

pub(crate) fn lost_error(key: &str, end: impl fmt::Display) -> LockError {
    match crate::engine::many_names(key) {
        Some(names) => LockError::new(
            ErrorKind::Lost,
            format!("locks {}: {end}", crate::engine::shown_names(&names)),
        ),
        None => LockError::new(ErrorKind::Lost, format!("lock {key:?}: {end}")),
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let before = self.lease.lost_by_now();
        self.lease.mark_released();
        spawn_finish(self.holding.clone(), self.lease.clone(), before);
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.lease.key())
            .field("fence", &self.lease.fence())
            .field("engine", &self.holding.driver().backend().name())
            .field("held", &self.is_held())
            .finish()
    }
}
