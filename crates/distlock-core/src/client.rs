//! The lock client: acquire, wait, `with_lock`, status. Written once, for every engine.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use crate::backend::{AcquireRequest, Attempt, Backend, LockStatus};
use crate::clock::{Clock, SystemClock};
use crate::error::{ErrorKind, LockError};
use crate::guard::{LockGuard, Released, lost_error};
use crate::key::validate_key;
use crate::lease::{LeaseHandle, LeaseShared};
use crate::options::{LockOptions, Wait};
use crate::token::Token;

pub(crate) struct ClientInner<B> {
    pub(crate) backend: B,
    pub(crate) options: LockOptions,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) owner: String,
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
pub struct LockClient<B> {
    inner: Arc<ClientInner<B>>,
}

impl<B> Clone for LockClient<B> {
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

    /// Builds the client.
    pub fn build(self) -> LockClient<B> {
        let owner = self.owner.unwrap_or_else(default_owner);
        LockClient {
            inner: Arc::new(ClientInner {
                backend: self.backend,
                options: self.options,
                clock: self.clock,
                owner,
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
        match self.attempt(key, options).await? {
            Try::Got(g) => Ok(Some(g)),
            Try::Busy(_) => Ok(None),
        }
    }

    /// Takes `key`, waiting as the client's options say (default: forever), with jittered
    /// back-off between attempts that never sleeps past the holder's remaining lease.
    ///
    /// # Errors
    /// `Busy` when the options say not to wait, `Timeout` when the wait timeout passes, and the
    /// errors of `try_acquire`.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped `acquire` leaves nothing taken (see `try_acquire`).
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
        let deadline = match options.wait() {
            Wait::No => {
                return self.attempt(key, options).await.and_then(|t| match t {
                    Try::Got(g) => Ok(g),
                    Try::Busy(_) => Err(LockError::busy(key)),
                });
            }
            Wait::Forever => None,
            Wait::Timeout(d) => Some(tokio::time::Instant::now() + d),
        };
        let timed_out = || {
            LockError::new(
                ErrorKind::Timeout,
                format!("waited too long for lock {key:?}"),
            )
        };
        let mut round = 0u32;
        loop {
            let attempt = match deadline {
                Some(dl) => tokio::time::timeout_at(dl, self.attempt(key, options))
                    .await
                    .map_err(|_| timed_out())??,
                None => self.attempt(key, options).await?,
            };
            let holder_ttl = match attempt {
                Try::Got(g) => return Ok(g),
                Try::Busy(ttl) => ttl,
            };
            let mut pause = options.backoff().delay(round, holder_ttl);
            round = round.saturating_add(1);
            if let Some(dl) = deadline {
                let now = tokio::time::Instant::now();
                if now >= dl {
                    return Err(timed_out());
                }
                pause = pause.min(dl - now);
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// Runs `body` while holding `key`, and releases the lock on every path: success, error,
    /// panic (re-raised after the release) and cancellation (released in the background).
    ///
    /// The body gets a [`LeaseHandle`]: it can check `is_held()` between steps or `select!` on
    /// `lost()` to stop early.
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

    async fn attempt(&self, key: &str, options: &LockOptions) -> Result<Try<B>, LockError> {
        let inner = &self.inner;
        let token = Token::generate();
        let ttl = options.ttl();
        let req = AcquireRequest::new(key, &token, ttl, &inner.owner);
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
                Ok(Attempt::Busy { holder_ttl }) => {
                    cleanup.armed = false;
                    return Ok(Try::Busy(holder_ttl));
                }
                Err(e) if e.is_ambiguous() && resent < options.acquire_retries() => {
                    resent += 1;
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
        let validity = options.validity();
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
