//! The lock client: acquire, wait, `with_lock`, status. Written once, for every engine.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use crate::backend::{AcquireRequest, Attempt, Backend, LeaseCheck, LockStatus};
use crate::clock::{Clock, SystemClock};
use crate::error::{ErrorKind, LockError};
use crate::guard::{Handoff, LockGuard, Released, lost_error};
use crate::key::validate_key;
use crate::lease::{LeaseHandle, LeaseShared};
use crate::local::{Gate, LocalQueues};
use crate::options::{LockOptions, Wait};
use crate::token::Token;
use crate::wake::Subscription;
use crate::watchdog::Watchdog;

pub(crate) struct ClientInner<B: Backend> {
    pub(crate) backend: B,
    pub(crate) options: LockOptions,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) owner: String,
    /// Per-key local queues (singleflight and hand-off); `None` when turned off.
    pub(crate) local: Option<LocalQueues<Handoff<B>>>,
    pub(crate) watchdog: Watchdog,
}

/// A lock client over one engine. Cheap to clone; share one per process.
///
/// ```no_run
/// # async fn demo<B: distlock_core::Backend>(backend: B) -> Result<(), distlock_core::LockError> {
/// use distlock_core::LockClient;
/// let client = LockClient::new(backend);
/// if let Some(guard) = client.try_acquire("reports:daily").await? {
///     println!("fence {:?}", guard.fence());
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
pub struct LockClient<B: Backend> {
    inner: Arc<ClientInner<B>>,
}

impl<B: Backend> Clone for LockClient<B> {
    fn clone(&self) -> Self {
        LockClient {
            inner: self.inner.clone(),
        }
    }
}

impl<B: Backend> fmt::Debug for LockClient<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("engine", &self.inner.backend.name())
            .field("owner", &self.inner.owner)
            .field("options", &self.inner.options)
            .finish()
    }
}

/// Builder of a [`LockClient`].
#[must_use]
pub struct LockClientBuilder<B> {
    backend: B,
    options: LockOptions,
    clock: Arc<dyn Clock>,
    owner: Option<String>,
    local_queue: bool,
}

impl<B: Backend> fmt::Debug for LockClientBuilder<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClientBuilder")
            .field("engine", &self.backend.name())
            .finish()
    }
}

impl<B: Backend> LockClientBuilder<B> {
    /// Default options of every acquisition made through this client.
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// The monotonic clock lease deadlines are measured on (tests inject one).
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
    pub fn build(self) -> LockClient<B> {
        let owner = self.owner.unwrap_or_else(default_owner);
        LockClient {
            inner: Arc::new(ClientInner {
                backend: self.backend,
                options: self.options,
                clock: self.clock,
                owner,
                local: self.local_queue.then(LocalQueues::new),
                watchdog: Watchdog::new(),
            }),
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

/// A waiter's subscription; parked in the local queue for the next head when the waiter goes.
struct SubSlot<'a, B: Backend> {
    local: Option<&'a LocalQueues<Handoff<B>>>,
    key: &'a str,
    sub: Option<Subscription>,
}

impl<B: Backend> Drop for SubSlot<'_, B> {
    fn drop(&mut self) {
        if let (Some(local), Some(sub)) = (self.local, self.sub.take()) {
            local.park(self.key, sub);
        }
    }
}

/// Outcome of one attempt, internally.
enum Try<B: Backend> {
    Got(LockGuard<B>),
    Busy(Option<Duration>),
}

/// Releases a lock taken by a request whose outcome we never learned, if the acquire is given up
/// or its future is dropped half-way.
struct PendingCleanup<'a, B: Backend> {
    client: &'a Arc<ClientInner<B>>,
    key: &'a str,
    token: &'a Token,
    armed: bool,
}

impl<B: Backend> Drop for PendingCleanup<'_, B> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // The token may hold the lock: never let a later attempt of this wait reuse it.
        if let Some(local) = &self.client.local {
            local.retire_token(self.key, self.token);
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let key = self.key.to_owned();
            let token = self.token.clone();
            rt.spawn(async move {
                let _ = client.backend.release(&key, &token).await;
            });
        }
    }
}

impl<B: Backend> LockClient<B> {
    /// A client with default options (see [`LockOptions::builder`]).
    pub fn new(backend: B) -> Self {
        Self::builder(backend).build()
    }

    /// A builder for options, clock and owner label.
    pub fn builder(backend: B) -> LockClientBuilder<B> {
        LockClientBuilder {
            backend,
            options: LockOptions::default(),
            clock: Arc::new(SystemClock),
            owner: None,
            local_queue: true,
        }
    }

    /// The engine.
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// The default options of this client.
    pub fn options(&self) -> &LockOptions {
        &self.inner.options
    }

    /// The holder label written with every lock.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// One attempt to take `key`. A busy lock is `Ok(None)`.
    ///
    /// A request whose reply is lost (timeout, broken connection) is resent with the same token,
    /// which the engine treats as the same acquisition.
    ///
    /// ```no_run
    /// # async fn demo<B: distlock_core::Backend>(
    /// #     locks: distlock_core::LockClient<B>,
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
    pub async fn try_acquire(&self, key: &str) -> Result<Option<LockGuard<B>>, LockError> {
        self.try_acquire_with(key, &self.inner.options).await
    }

    /// [`try_acquire`](Self::try_acquire) with other options.
    ///
    /// # Errors
    /// As `try_acquire`.
    ///
    /// # Cancel safety
    /// As `try_acquire`.
    pub async fn try_acquire_with(
        &self,
        key: &str,
        options: &LockOptions,
    ) -> Result<Option<LockGuard<B>>, LockError> {
        validate_key(key)?;
        if self.held_here(key) {
            return Ok(None);
        }
        match self.attempt(key, options, false, Token::generate()).await? {
            Try::Got(g) => Ok(Some(g)),
            Try::Busy(_) => Ok(None),
        }
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
    /// # async fn demo<B: distlock_core::Backend>(backend: B) -> Result<(), distlock_core::LockError> {
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
    pub async fn acquire(&self, key: &str) -> Result<LockGuard<B>, LockError> {
        self.acquire_with(key, &self.inner.options).await
    }

    /// [`acquire`](Self::acquire) with other options.
    ///
    /// # Errors
    /// As `acquire`.
    ///
    /// # Cancel safety
    /// As `acquire`.
    pub async fn acquire_with(
        &self,
        key: &str,
        options: &LockOptions,
    ) -> Result<LockGuard<B>, LockError> {
        validate_key(key)?;
        match options.wait() {
            Wait::No => {
                if self.held_here(key) {
                    return Err(LockError::busy(key));
                }
                self.attempt(key, options, false, Token::generate())
                    .await
                    .and_then(|t| match t {
                        Try::Got(g) => Ok(g),
                        Try::Busy(_) => Err(LockError::busy(key)),
                    })
            }
            Wait::Forever => self.wait_for(key, options).await,
            Wait::Timeout(d) => tokio::time::timeout(d, self.wait_for(key, options))
                .await
                .map_err(|_| {
                    LockError::new(
                        ErrorKind::Timeout,
                        format!("waited {d:?} for lock {key:?} without getting it"),
                    )
                })?,
        }
    }

    /// Whether a task of this client holds `key` right now (a local check, no I/O).
    fn held_here(&self, key: &str) -> bool {
        self.inner
            .local
            .as_ref()
            .is_some_and(|l| l.live_holder(key).is_some())
    }

    /// The waiting loop of `acquire`; the caller bounds it with the wait timeout.
    async fn wait_for(&self, key: &str, options: &LockOptions) -> Result<LockGuard<B>, LockError> {
        let inner = &self.inner;
        let mut ticket = inner.local.as_ref().map(|l| l.join(key, *options));
        // Declared after the ticket, so dropped before it: the subscription is parked for the
        // next head while this waiter is still in the queue.
        let mut slot = SubSlot {
            local: inner.local.as_ref(),
            key,
            sub: None,
        };
        let sub = &mut slot.sub;
        let mut subscribed = false;
        let mut round = 0u32;
        // Without a local queue, this wait's own token (with one, the queue's, shared by its
        // successive heads): every attempt of a wait uses the same token, so a release that
        // hands the lock to the registered waiter ([`Attempt::Granted`]) finds it.
        let mut own_token: Option<Token> = None;
        loop {
            // Our turn in the local queue, or a hand-off from a local holder.
            if let Some(t) = ticket.as_mut() {
                loop {
                    match t.gate() {
                        Gate::Handed(h) => match h.into_guard() {
                            Some(g) => return Ok(g),
                            None => continue,
                        },
                        Gate::Go => break,
                        Gate::Wait(holder) => {
                            if let Some(h) = t.changed(holder.as_ref()).await
                                && let Some(g) = h.into_guard()
                            {
                                return Ok(g);
                            }
                        }
                    }
                }
            }
            if options.events()
                && sub.is_none()
                && let Some(parked) = inner.local.as_ref().and_then(|l| l.take_parked(key))
            {
                // A previous head's subscription, still active: no need to subscribe and try
                // again after this attempt.
                *sub = Some(parked);
                subscribed = true;
            }
            // Only a first attempt with no subscription yet may take the engine's fast path.
            let waiting = subscribed || round > 0;
            let token = match ticket.as_ref() {
                Some(t) => t.wait_token(),
                None => own_token.get_or_insert_with(Token::generate).clone(),
            };
            let holder_ttl = match self.attempt(key, options, waiting, token).await? {
                Try::Got(g) => return Ok(g),
                Try::Busy(ttl) => ttl,
            };
            if options.events() && !subscribed {
                // Subscribe first, then try again, then wait: a release between our attempt and
                // the subscription cannot be missed.
                subscribed = true;
                match inner.backend.subscribe(key).await {
                    Ok(Some(s)) => {
                        *sub = Some(s);
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => tracing::debug!(target: "distlock", key, error = %e,
                        "cannot subscribe to release events; polling"),
                }
            }
            let pause = match sub {
                Some(_) => {
                    let cap = options.wake_fallback();
                    holder_ttl.map_or(cap, |t| (t + Duration::from_millis(1)).min(cap))
                }
                None => options.backoff().delay(round, holder_ttl),
            };
            round = round.saturating_add(1);
            let event = async {
                match sub.as_mut() {
                    Some(s) => s.next().await,
                    None => std::future::pending().await,
                }
            };
            let nudged = async {
                match ticket.as_ref() {
                    Some(t) => t.nudged().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = event => {}
                () = nudged => {}
            }
        }
    }

    /// Runs `body` while holding `key`, and releases the lock on every path: success, error,
    /// panic (re-raised after the release) and cancellation (released in the background).
    ///
    /// The body gets a [`LeaseHandle`]: it can check `is_held()` between steps or `select!` on
    /// `lost()` to stop early.
    ///
    /// ```no_run
    /// # async fn demo<B: distlock_core::Backend>(
    /// #     locks: distlock_core::LockClient<B>,
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
        let guard = self.acquire(key).await?;
        let out = AssertUnwindSafe(body(guard.handle())).catch_unwind().await;
        let released = guard.release().await;
        match out {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(value) => match released? {
                Released::Held => Ok(value),
                Released::Lost(reason) => Err(lost_error(key, reason)),
            },
        }
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
        self.inner.backend.status(key).await
    }

    /// Breaks `key` whoever holds it: an operator's break-glass (see
    /// [`Backend::force_release`]). Returns the holder that was removed, `None` when the lock
    /// was free.
    ///
    /// The holder is not asked, and may go on working until its next renewal shows the loss:
    /// only a fenced resource turns its late writes away.
    ///
    /// # Errors
    /// `InvalidKey`, `Unsupported` on engines that cannot do it, and the engine's errors.
    pub async fn force_release(&self, key: &str) -> Result<Option<LockStatus>, LockError> {
        validate_key(key)?;
        self.inner.backend.force_release(key).await
    }

    /// One attempt with `token` (resent while replies are lost). `waiting`: see
    /// [`AcquireRequest::waiting`].
    async fn attempt(
        &self,
        key: &str,
        options: &LockOptions,
        waiting: bool,
        token: Token,
    ) -> Result<Try<B>, LockError> {
        let inner = &self.inner;
        let ttl = options.ttl();
        let mut req = AcquireRequest::new(key, &token, ttl, &inner.owner).waiting(waiting);
        let mut cleanup = PendingCleanup {
            client: inner,
            key,
            token: &token,
            armed: true,
        };
        let mut resent = 0;
        let (sent, fence) = loop {
            let sent = inner.clock.now();
            match inner.backend.try_acquire(&req).await {
                Ok(Attempt::Acquired { fence }) => break (sent, fence),
                Ok(Attempt::Granted {
                    fence,
                    elapsed,
                    ttl: granted_ttl,
                }) => {
                    // The lease was written when a release handed it to us, at most `elapsed`
                    // ago. Use it as it is if most of it is left; otherwise (or when its TTL is
                    // not ours, or its start unknown) renew it first, from now.
                    let now = inner.clock.now();
                    let validity = options.validity();
                    if granted_ttl == ttl
                        && let Some(since) = elapsed.and_then(|e| now.checked_sub(e))
                        && since + validity > now + validity / 2
                    {
                        break (since, fence);
                    }
                    let sent = inner.clock.now();
                    match inner.backend.extend(key, &token, ttl).await {
                        Ok(LeaseCheck::Ours) => break (sent, fence),
                        Ok(_) => {
                            // It ran out before we could use it.
                            cleanup.armed = false;
                            if let Some(local) = &inner.local {
                                local.retire_token(key, &token);
                            }
                            return Ok(Try::Busy(None));
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok(Attempt::Busy { holder_ttl }) => {
                    cleanup.armed = false;
                    return Ok(Try::Busy(holder_ttl));
                }
                Err(e) if e.is_ambiguous() && resent < options.acquire_retries() => {
                    resent += 1;
                    req = req.resent(true);
                    tracing::debug!(target: "distlock", key, error = %e, resent,
                        "acquire reply lost; resending with the same token");
                }
                Err(e) => {
                    // Leave cleanup armed only if the request may have taken the lock.
                    cleanup.armed = e.is_ambiguous();
                    return Err(e);
                }
            }
        };
        cleanup.armed = false;
        if let Some(local) = &inner.local {
            local.retire_token(key, &token);
        }
        let validity = options.validity();
        let sent = if crate::seeded::on(crate::seeded::SeededBug::ReplyTimeValidity) {
            inner.clock.now()
        } else {
            sent
        };
        let lease = Arc::new(LeaseShared::new(
            key.to_owned(),
            token.clone(),
            fence,
            inner.clock.clone(),
            *options,
            sent,
        ));
        tracing::debug!(target: "distlock", key, fence = ?fence,
            valid_for_ms = validity.as_millis() as u64, "lock acquired");
        Ok(Try::Got(LockGuard::new(inner.clone(), lease)))
    }
}
