//! A per-call request: `client.lock(key).ttl(d).wait_timeout(w).acquire()`. It starts from the
//! client's default options, so one call can change a timeout without building a whole
//! `LockOptions`; the changed options are checked when the request is sent.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::client::LockClient;
use crate::engine::{Backend, LeaseKind};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::lease::LeaseHandle;
use crate::options::{LockOptions, LockOptionsBuilder, Wait};

/// One lock request, made by [`LockClient::lock`]. Nothing is sent until `acquire`,
/// `try_acquire` or `run`.
///
/// ```no_run
/// # async fn demo<B: distlock_core::Backend>(
/// #     locks: distlock_core::LockClient<B>,
/// # ) -> Result<(), distlock_core::LockError> {
/// use std::time::Duration;
///
/// let guard = locks
///     .lock("reports:daily")
///     .ttl(Duration::from_secs(60))
///     .wait_timeout(Duration::from_secs(2))
///     .acquire()
///     .await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "a request does nothing until it is sent with acquire, try_acquire or run"]
pub struct LockRequest<'a, B: Backend> {
    client: &'a LockClient<B>,
    key: &'a str,
    kind: LeaseKind,
    options: LockOptionsBuilder,
}

impl<B: Backend> fmt::Debug for LockRequest<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockRequest")
            .field("key", &self.key)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> LockClient<B> {
    /// A request for `key` whose options can be changed for this call alone:
    /// `client.lock("k").ttl(d).wait_timeout(w).acquire().await`.
    pub fn lock<'a>(&'a self, key: &'a str) -> LockRequest<'a, B> {
        LockRequest {
            client: self,
            key,
            kind: LeaseKind::Exclusive,
            options: self.default_options().to_builder(),
        }
    }
}

impl<'a, B: Backend> LockRequest<'a, B> {
    /// The lease length for this call.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options = self.options.ttl(ttl);
        self
    }

    /// How this call waits for a busy lock.
    pub fn wait(mut self, wait: Wait) -> Self {
        self.options = self.options.wait(wait);
        self
    }

    /// Waits at most `d` for a busy lock, then fails with `Timeout`.
    pub fn wait_timeout(mut self, d: Duration) -> Self {
        self.options = self.options.wait_timeout(d);
        self
    }

    /// One attempt: a busy lock fails with `Busy`.
    pub fn no_wait(mut self) -> Self {
        self.options = self.options.no_wait();
        self
    }

    /// Whether the watchdog renews the lease while the guard lives.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.options = self.options.auto_renew(on);
        self
    }

    /// The longest the watchdog keeps the lease alive, counted from the acquire.
    pub fn max_hold(mut self, limit: Duration) -> Self {
        self.options = self.options.max_hold(limit);
        self
    }

    /// Replaces every option with `options`.
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options.to_builder();
        self
    }

    /// Takes the lock, waiting as the options say (see [`LockClient::acquire`]).
    ///
    /// # Errors
    /// `Config` for options `LockOptions::build` refuses; then as [`LockClient::acquire`].
    ///
    /// # Cancel safety
    /// As [`LockClient::acquire`].
    pub async fn acquire(self) -> Result<LockGuard<B>, LockError> {
        let options = self.options.build()?;
        self.client.lease(self.key, self.kind, &options).await
    }

    /// One attempt; a busy lock is `Ok(None)` (see [`LockClient::try_acquire`]).
    ///
    /// # Errors
    /// `Config` for options `LockOptions::build` refuses; then as
    /// [`LockClient::try_acquire`].
    ///
    /// # Cancel safety
    /// As [`LockClient::try_acquire`].
    pub async fn try_acquire(self) -> Result<Option<LockGuard<B>>, LockError> {
        let options = self.options.build()?;
        self.client.try_lease(self.key, self.kind, &options).await
    }

    /// Runs `body` under the lock and releases it on every path (see
    /// [`LockClient::with_lock`]).
    ///
    /// # Errors
    /// `Config` for options `LockOptions::build` refuses; then as [`LockClient::with_lock`].
    ///
    /// # Cancel safety
    /// As [`LockClient::with_lock`].
    pub async fn run<F, Fut, T>(self, body: F) -> Result<T, LockError>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let options = self.options.build()?;
        self.client
            .run_leased(self.key, self.kind, &options, body)
            .await
    }
}
