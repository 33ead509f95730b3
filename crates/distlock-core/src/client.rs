//! The lock client: the entry points of acquire, waiting, `with_lock`, status and forced
//! release, over the layers below it (acquire, guard, watchdog, driver, lease).

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use tracing::Instrument;

use crate::acquire::{Acquisition, TryOutcome, attempt, wait_for};
use crate::clock::{Clock, SystemClock};
use crate::driver::Driver;
use crate::engine::{Backend, IntoBackend, LeaseKind, LockStatus};
use crate::error::{ErrorKind, LockError};
use crate::guard::{ClientState, LockGuard, Released, lost_error};
use crate::key::validate_key;
use crate::lease::LeaseHandle;
use crate::options::{LockOptions, Wait};
use crate::token::Token;

/// A lock client over one engine. Cheap to clone; share one per process.
///
/// ```no_run
/// # async fn demo(backend: impl distlock_core::engine::IntoBackend) -> Result<(), distlock_core::LockError> {
/// use distlock_core::LockClient;
/// let client = LockClient::new(backend);
/// if let Some(guard) = client.try_acquire("reports:daily").await? {
///     println!("fence {:?}", guard.fence());
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
pub struct LockClient {
    holding: Arc<ClientState>,
    options: LockOptions,
}

impl Clone for LockClient {
    fn clone(&self) -> Self {
        LockClient {
            holding: self.holding.clone(),
            options: self.options,
        }
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("engine", &self.backend().name())
            .field("owner", &self.owner())
            .field("options", &self.options)
            .finish()
    }
}

/// Builder of a [`LockClient`].
#[must_use]
pub struct LockClientBuilder {
    backend: Arc<dyn Backend>,
    options: LockOptions,
    clock: Arc<dyn Clock>,
    owner: Option<String>,
    local_queue: bool,
}

impl fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClientBuilder")
            .field("engine", &self.backend.name())
            .finish()
    }
}

impl LockClientBuilder {
    /// Default options of every acquisition made through this client (a call can change any of
    /// them: [`LockClient::lock`]).
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// The monotonic clock lease deadlines are measured on (tests inject one). Engines that
    /// keep time of their own read it too.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The holder label shown by `status` (default `host/pid`).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// In-process singleflight (default on): tasks of this client that wait for the same key
    /// queue locally in FIFO order, and only the head of the queue talks to the engine. Turn it
    /// off to let every task poll the engine on its own (the naive behaviour of most lock
    /// libraries, kept for comparison). Local hand-off needs it.
    pub fn local_queue(mut self, on: bool) -> Self {
        self.local_queue = on;
        self
    }

    /// Builds the client.
    pub fn build(self) -> LockClient {
        let owner = self.owner.unwrap_or_else(default_owner);
        let driver = Driver::new(self.backend, self.clock, owner);
        LockClient {
            holding: Arc::new(ClientState::new(driver, self.local_queue)),
            options: self.options,
        }
    }
}

/// `host/pid`, the default holder label.
pub fn default_owner() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}/{}", std::process::id())
}

impl LockClient {
    /// A client with default options (see [`LockOptions::builder`]).
    pub fn new(backend: impl IntoBackend) -> Self {
        Self::builder(backend).build()
    }

    /// A builder for options, clock and owner label.
    pub fn builder(backend: impl IntoBackend) -> LockClientBuilder {
        LockClientBuilder {
            backend: backend.into_backend(),
            options: LockOptions::default(),
            clock: Arc::new(SystemClock),
            owner: None,
            local_queue: true,
        }
    }

    /// The engine.
    pub fn backend(&self) -> &dyn Backend {
        self.holding.driver().backend()
    }

    /// The engine, as the type it was built with (`None` for another type): for what only
    /// that engine offers (its key layout, say).
    pub fn engine<E: Backend>(&self) -> Option<&E> {
        (self.backend() as &dyn std::any::Any).downcast_ref()
    }

    /// The default options of this client's acquisitions.
    pub fn default_options(&self) -> &LockOptions {
        &self.options
    }

    /// The holder label written with every lock.
    pub fn owner(&self) -> &str {
        self.holding.driver().owner()
    }

    /// One attempt to take `key`. A busy lock is `Ok(None)`.
    ///
    /// A request whose reply is lost (timeout, broken connection) is resent with the same token,
    /// which the engine treats as the same acquisition.
    ///
    /// ```no_run
    /// # async fn demo(
    /// #     locks: distlock_core::LockClient,
    /// # ) -> Result<(), distlock_core::LockError> {
    /// match locks.try_acquire("backup").await? {
    ///     Some(guard) => {
    ///         // ... the work, passing guard.fence() to whatever it writes ...
    ///         let released = guard.release().await?;
    ///         assert!(released.was_held(), "the lease ran out before the work ended");
    ///     }
    ///     None => println!("another process is running the backup"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `InvalidKey`, and the engine's errors (`Connection`, `Timeout`, `Auth`, `Protocol`…).
    ///
    /// # Cancel safety
    /// If the future is dropped while a request is in flight, a release of that token is sent in
    /// the background, so nothing stays half taken.
    pub async fn try_acquire(&self, key: &str) -> Result<Option<LockGuard>, LockError> {
        self.try_lease(key, LeaseKind::Exclusive, &self.options)
            .await
    }

    /// Takes `key`, waiting as the client's options say (default: forever).
    ///
    /// How it waits:
    /// - tasks of this client that wait for the same key queue locally, in FIFO order; only the
    ///   head of the queue talks to the engine (see [`LockClientBuilder::local_queue`]);
    /// - after a busy attempt, the head subscribes to the key's release events (when the engine
    ///   has them), tries once more, and then sleeps until a release event, the holder's
    ///   remaining lease or [`LockOptions::wake_fallback`], whichever comes first;
    /// - on engines without events, it sleeps a jittered back-off, never past the holder's
    ///   remaining lease.
    ///
    /// ```no_run
    /// # async fn demo(backend: impl distlock_core::engine::IntoBackend) -> Result<(), distlock_core::LockError> {
    /// use std::time::Duration;
    /// use distlock_core::{ErrorKind, LockClient, LockOptions};
    ///
    /// let options = LockOptions::builder()
    ///     .ttl(Duration::from_secs(30))
    ///     .wait_timeout(Duration::from_secs(5))
    ///     .build()?;
    /// let locks = LockClient::builder(backend).options(options).build();
    /// match locks.acquire("deploy").await {
    ///     Ok(guard) => {
    ///         // ... deploy ...
    ///         guard.release().await?;
    ///     }
    ///     Err(e) if e.kind() == ErrorKind::Timeout => println!("still held after 5 s"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `Busy` when the options say not to wait, `Timeout` when the wait timeout passes, and the
    /// errors of `try_acquire`.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped `acquire` leaves nothing taken, no subscription and no place in
    /// the local queue.
    pub async fn acquire(&self, key: &str) -> Result<LockGuard, LockError> {
        self.lease(key, LeaseKind::Exclusive, &self.options).await
    }

    /// Runs `body` while holding `key`, and releases the lock on every path: success, error,
    /// panic (re-raised after the release) and cancellation (released in the background).
    ///
    /// The body gets a [`LeaseHandle`]: it can check `is_held()` between steps or `select!` on
    /// `lost()` to stop early.
    ///
    /// ```no_run
    /// # async fn demo(
    /// #     locks: distlock_core::LockClient,
    /// # ) -> Result<(), distlock_core::LockError> {
    /// let rows = locks
    ///     .with_lock("reindex", |lease| async move {
    ///         let mut done = 0;
    ///         for _batch in 0..10 {
    ///             if !lease.is_held() {
    ///                 break; // the lease ended: stop before the next step
    ///             }
    ///             done += 1; // ... one batch, fenced with lease.fence() ...
    ///         }
    ///         done
    ///     })
    ///     .await?; // Err(Lost) if the lease ended before the body finished
    /// println!("{rows} batches");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The errors of `acquire`; and `Lost` when the lease had ended before the body finished
    /// (its result is then discarded, because it may not have run exclusively).
    ///
    /// # Cancel safety
    /// If cancelled, the body is dropped and the lock released in the background.
    pub async fn with_lock<F, Fut, T>(&self, key: &str, body: F) -> Result<T, LockError>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        self.run_leased(key, LeaseKind::Exclusive, &self.options, false, body)
            .await
    }

    /// Runs `body` only while `key` is held: if the lease is lost first, the body is dropped
    /// (cancelled at the await it is parked on) and the call returns `Lost`. The lock is
    /// released on every path, as [`with_lock`](Self::with_lock) does.
    ///
    /// For work that must not go on once another holder may have the lock. The body is
    /// cancelled at the local deadline, before another client can have taken the lock; what it
    /// wrote before that still needs a fence to be turned away if it lands late.
    ///
    /// ```no_run
    /// # async fn copy(_fence: Option<u64>) -> usize { 0 }
    /// # async fn demo(
    /// #     locks: distlock_core::LockClient,
    /// # ) -> Result<(), distlock_core::LockError> {
    /// use distlock_core::ErrorKind;
    ///
    /// match locks
    ///     .while_held("reindex", |lease| async move { copy(lease.fence()).await })
    ///     .await
    /// {
    ///     Ok(rows) => println!("{rows} rows"),
    ///     Err(e) if e.kind() == ErrorKind::Lost => eprintln!("stopped: {e}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The errors of `acquire`; `Lost` when the lease ended before the body finished (the body
    /// was cancelled then).
    ///
    /// # Cancel safety
    /// If cancelled, the body is dropped and the lock released in the background.
    pub async fn while_held<F, Fut, T>(&self, key: &str, body: F) -> Result<T, LockError>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        self.run_leased(key, LeaseKind::Exclusive, &self.options, true, body)
            .await
    }

    /// Who holds `key`: held or free, the holder's label, remaining TTL and fence.
    ///
    /// # Errors
    /// `InvalidKey`, and the engine's errors.
    ///
    /// # Cancel safety
    /// Cancel-safe (read only).
    pub async fn status(&self, key: &str) -> Result<LockStatus, LockError> {
        validate_key(key)?;
        self.holding.driver().inspect(key).await
    }

    /// Breaks `key` whoever holds it: an operator's break-glass (see
    /// [`Breaker`](crate::engine::Breaker)). Returns the holder that was removed, `None` when
    /// the lock was free.
    ///
    /// The holder is not asked, and may go on working until its next renewal shows the loss:
    /// only a fenced resource turns its late writes away.
    ///
    /// # Errors
    /// `InvalidKey`, `Unsupported` on engines that cannot do it, and the engine's errors.
    pub async fn force_release(&self, key: &str) -> Result<Option<LockStatus>, LockError> {
        validate_key(key)?;
        self.holding.driver().force_release(key).await
    }

    /// One attempt at a lease of `kind` on `key`; a busy lock is `Ok(None)`.
    pub(crate) async fn try_lease(
        &self,
        key: &str,
        kind: LeaseKind,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.try_lease_as(Acquisition::new(key, kind, options))
            .await
    }

    /// One attempt at the lease `want` describes; a busy lock is `Ok(None)`.
    pub(crate) async fn try_lease_as(
        &self,
        want: Acquisition<'_>,
    ) -> Result<Option<LockGuard>, LockError> {
        let timer = crate::metrics::Timer::start();
        let engine = self.backend().name();
        let span = crate::trace::acquire(engine, want.key, want.kind);
        let mut run = std::pin::pin!(self.try_lease_once(want).instrument(span));
        let got = run.as_mut().await;
        let outcome = match &got {
            Ok(None) => "busy",
            other => crate::metrics::outcome(other),
        };
        let fence = got
            .as_ref()
            .ok()
            .and_then(Option::as_ref)
            .and_then(LockGuard::fence);
        crate::trace::acquired(run.span(), outcome, fence);
        crate::metrics::acquire(engine, want.kind, want.key, outcome, timer.elapsed());
        got
    }

    async fn try_lease_once(&self, want: Acquisition<'_>) -> Result<Option<LockGuard>, LockError> {
        let key = want.key;
        validate_key(key)?;
        if self.held_here(key) {
            return Ok(None);
        }
        let engine = self.backend().name();
        match attempt(&self.holding, want, false, Token::generate())
            .instrument(crate::trace::attempt(engine, 1))
            .await?
        {
            TryOutcome::Taken(g) => Ok(Some(g)),
            TryOutcome::Busy(_) => Ok(None),
        }
    }

    /// A lease of `kind` on `key`, waiting as `options` say.
    pub(crate) async fn lease(
        &self,
        key: &str,
        kind: LeaseKind,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        self.lease_as(Acquisition::new(key, kind, options)).await
    }

    /// The lease `want` describes, waiting as its options say.
    pub(crate) async fn lease_as(&self, want: Acquisition<'_>) -> Result<LockGuard, LockError> {
        let timer = crate::metrics::Timer::start();
        let engine = self.backend().name();
        let span = crate::trace::acquire(engine, want.key, want.kind);
        let mut run = std::pin::pin!(self.lease_waiting(want).instrument(span));
        let got = run.as_mut().await;
        let outcome = crate::metrics::outcome(&got);
        let fence = got.as_ref().ok().and_then(LockGuard::fence);
        crate::trace::acquired(run.span(), outcome, fence);
        crate::metrics::acquire(engine, want.kind, want.key, outcome, timer.elapsed());
        got
    }

    async fn lease_waiting(&self, want: Acquisition<'_>) -> Result<LockGuard, LockError> {
        let (key, options) = (want.key, want.options);
        validate_key(key)?;
        match options.wait() {
            Wait::No => {
                if self.held_here(key) {
                    return Err(LockError::busy(key));
                }
                let engine = self.backend().name();
                match attempt(&self.holding, want, false, Token::generate())
                    .instrument(crate::trace::attempt(engine, 1))
                    .await?
                {
                    TryOutcome::Taken(g) => Ok(g),
                    TryOutcome::Busy(_) => Err(LockError::busy(key)),
                }
            }
            // Waits for the lock, not for the engine: an engine that fails ends it.
            Wait::Forever => wait_for(&self.holding, want, None).await,
            // Within the budget, a failing engine (a fail-over, a restart) is tried again; after
            // it, the error names the last cause.
            Wait::Timeout(d) => {
                let last = std::sync::Mutex::new(None);
                let waited =
                    tokio::time::timeout(d, wait_for(&self.holding, want, Some(&last))).await;
                let last = last
                    .into_inner()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                match (waited, last) {
                    (Ok(r), _) => r,
                    (Err(_), Some(cause)) => Err(LockError::after(
                        format_args!("waited {d:?} for lock {key:?}; the last attempt failed"),
                        cause,
                    )),
                    (Err(_), None) => Err(LockError::new(
                        ErrorKind::Timeout,
                        format!("waited {d:?} for lock {key:?} without getting it"),
                    )),
                }
            }
        }
    }

    /// Runs `body` under a lease of `kind` on `key`, released on every path.
    pub(crate) async fn run_leased<F, Fut, T>(
        &self,
        key: &str,
        kind: LeaseKind,
        options: &LockOptions,
        cancel_on_loss: bool,
        body: F,
    ) -> Result<T, LockError>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.lease(key, kind, options).await?;
        let handle = guard.handle();
        let run = AssertUnwindSafe(body(guard.handle())).catch_unwind();
        let out = if cancel_on_loss {
            tokio::select! {
                biased;
                reason = handle.lost() => Err(reason),
                out = run => Ok(out),
            }
        } else {
            Ok(run.await)
        };
        let released = guard.release().await;
        match out {
            Err(reason) => Err(lost_error(key, reason)),
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Ok(Ok(value)) => match released? {
                Released::Held => Ok(value),
                Released::Lost(reason) => Err(lost_error(key, reason)),
            },
        }
    }

    /// What the client's guards and waits share (its engine driver, local queues).
    pub(crate) fn holding(&self) -> &Arc<ClientState> {
        &self.holding
    }

    /// Whether a task of this client holds `key` right now (a local check, no I/O).
    fn held_here(&self, key: &str) -> bool {
        self.holding
            .local()
            .is_some_and(|l| l.live_holder(key).is_some())
    }
}
