//! A per-call request: `client.lock(key).ttl(d).wait_timeout(w).acquire()`. It starts from the
//! client's default options, so one call can change a timeout without building a whole
//! `LockOptions`; the changed options are checked when the request is sent.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::client::LockClient;
use crate::engine::LeaseKind;
use crate::error::LockError;
use crate::guard::{Fenced, Guard, LockGuard, Permit, ReadGuard, WriteGuard, needs_fence, wrap};
use crate::guard::{no_fence, require_fences};
use crate::lease::LeaseHandle;
use crate::options::{LockOptions, LockOptionsBuilder};

/// One lock request, made by [`LockClient::lock`] (a [`LockGuard`] when granted),
/// [`read_lock`](LockClient::read_lock) (a [`ReadGuard`]), [`write_lock`](LockClient::write_lock)
/// (a [`WriteGuard`]) or [`semaphore`](LockClient::semaphore) (a [`Permit`]). Nothing is sent
/// until `acquire`, `try_acquire` or `run`.
///
/// ```no_run
/// # async fn demo(
/// #     locks: distlock_core::LockClient,
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
pub struct LockRequest<'a, G: Guard = LockGuard> {
    client: &'a LockClient,
    key: &'a str,
    kind: LeaseKind,
    options: LockOptionsBuilder,
    guard: std::marker::PhantomData<fn() -> G>,
}

impl<G: Guard> fmt::Debug for LockRequest<'_, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockRequest")
            .field("key", &self.key)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// A request for `key` whose options can be changed for this call alone:
    /// `client.lock("k").ttl(d).wait_timeout(w).acquire().await`.
    pub fn lock<'a>(&'a self, key: &'a str) -> LockRequest<'a> {
        LockRequest {
            client: self,
            key,
            kind: LeaseKind::Exclusive,
            options: self.default_options().to_builder(),
            guard: std::marker::PhantomData,
        }
    }

    /// The request of `key` for a lease of `kind`, granted as the guard `G`.
    fn typed<'a, G: Guard>(&'a self, key: &'a str, kind: LeaseKind) -> LockRequest<'a, G> {
        LockRequest {
            client: self,
            key,
            kind,
            options: self.default_options().to_builder(),
            guard: std::marker::PhantomData,
        }
    }
}

impl LockClient {
    /// A request to read under the read-write lock `key`: readers share it, and a writer
    /// ([`write_lock`](Self::write_lock)) excludes them all.
    ///
    /// Readers and writers queue in one line in arrival order, on the engines that order their
    /// waiters: a waiting writer holds back the readers that come after it, so a stream of
    /// readers never starves a writer, and the readers ahead of a writer are all let in before
    /// it.
    ///
    /// Each reader is a lease of its own, with its own token, TTL, watchdog renewal and lost
    /// signal: a dead reader frees its share when its own TTL runs out, whatever the other
    /// readers do.
    ///
    /// A reader's [`fence`](LockGuard::fence) is not unique: it is a point in the order of
    /// writers' fences, above every writer that held the lock before this reader and below
    /// every writer that holds it after. A resource that keeps the highest writer's fence it
    /// has seen can so refuse a reader whose fence is below it: a writer came in after that
    /// reader's lease ended, and what the reader read may be stale.
    ///
    /// ```no_run
    /// # async fn demo(
    /// #     locks: distlock_core::LockClient,
    /// # ) -> Result<(), distlock_core::LockError> {
    /// let reader = locks.read_lock("catalog").acquire().await?;
    /// // ... read, alongside other readers ...
    /// reader.release().await?;
    /// let writer = locks.write_lock("catalog").acquire().await?;
    /// // ... write, alone; pass writer.fence() to the store ...
    /// writer.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn read_lock<'a>(&'a self, key: &'a str) -> LockRequest<'a, ReadGuard> {
        self.typed(key, LeaseKind::Shared)
    }

    /// A request to write under the read-write lock `key`: the writer excludes every reader and
    /// every other writer (it is the same lease as [`lock`](Self::lock)'s). Each writer gets a
    /// fence above every earlier writer's.
    pub fn write_lock<'a>(&'a self, key: &'a str) -> LockRequest<'a, WriteGuard> {
        self.typed(key, LeaseKind::Exclusive)
    }

    /// A request for one of the `permits` permits of the semaphore `key`: at most `permits`
    /// holders at once. Each permit is a lease of its own (token, TTL, watchdog, lost signal),
    /// so a dead holder's permit comes back after its own TTL, and each gets a fence above
    /// every earlier permit's of the name.
    ///
    /// Every client must open a name with the same number of permits: a request with another
    /// number, or for a lock on a semaphore's name, fails with
    /// [`ErrorKind::KindConflict`](crate::ErrorKind::KindConflict) while the name has holders
    /// or waiters. `permits` is 1 to [`MAX_PERMITS`](crate::engine::MAX_PERMITS) (`Config`
    /// otherwise, when sent).
    ///
    /// ```no_run
    /// # async fn demo(
    /// #     locks: distlock_core::LockClient,
    /// # ) -> Result<(), distlock_core::LockError> {
    /// // At most 4 exports at once, across every process.
    /// let permit = locks.semaphore("exports", 4).acquire().await?;
    /// // ... export ...
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore<'a>(&'a self, key: &'a str, permits: u32) -> LockRequest<'a, Permit> {
        self.typed(key, LeaseKind::Permit { permits })
    }
}

/// The kind of an untyped request, chosen at run time (the `distlock` command's flags, say).
impl LockRequest<'_, LockGuard> {
    /// Asks for a lease of `kind` (what [`shared`](Self::shared) and
    /// [`permits`](Self::permits) set).
    pub fn kind(mut self, kind: LeaseKind) -> Self {
        self.kind = kind;
        self
    }

    /// Asks for a shared lease: a reader of a read-write lock (see
    /// [`LockClient::read_lock`]).
    pub fn shared(mut self) -> Self {
        self.kind = LeaseKind::Shared;
        self
    }

    /// Asks for one of `permits` permits: a counting semaphore (see
    /// [`LockClient::semaphore`]).
    pub fn permits(mut self, permits: u32) -> Self {
        self.kind = LeaseKind::Permit { permits };
        self
    }
}

impl<'a, G: Guard> LockRequest<'a, G> {
    crate::options::request_option_setters!();

    /// The longest the watchdog keeps the lease alive, counted from the acquire.
    pub fn max_hold(mut self, limit: Duration) -> Self {
        self.options = self.options.max_hold(limit);
        self
    }

    /// Takes the lock, waiting as the options say (see [`LockClient::acquire`]).
    ///
    /// # Errors
    /// `Config` for options `LockOptions::build` refuses; then as [`LockClient::acquire`].
    ///
    /// # Cancel safety
    /// As [`LockClient::acquire`].
    pub async fn acquire(self) -> Result<G, LockError> {
        let options = self.checked()?;
        let guard = self.client.lease(self.key, self.kind, &options).await?;
        self.finish(guard).await
    }

    /// One attempt; a busy lock is `Ok(None)` (see [`LockClient::try_acquire`]).
    ///
    /// # Errors
    /// `Config` for options `LockOptions::build` refuses; then as
    /// [`LockClient::try_acquire`].
    ///
    /// # Cancel safety
    /// As [`LockClient::try_acquire`].
    pub async fn try_acquire(self) -> Result<Option<G>, LockError> {
        let options = self.checked()?;
        match self.client.try_lease(self.key, self.kind, &options).await? {
            Some(guard) => self.finish(guard).await.map(Some),
            None => Ok(None),
        }
    }

    /// Makes this request's guard carry its lease's fence (see
    /// [`FencedClient`](crate::FencedClient), which makes every request so).
    pub fn fenced(self) -> LockRequest<'a, Fenced<G>> {
        LockRequest {
            client: self.client,
            key: self.key,
            kind: self.kind,
            options: self.options,
            guard: std::marker::PhantomData,
        }
    }

    /// The options, checked, for a guard this client's engine can give.
    fn checked(&self) -> Result<LockOptions, LockError> {
        if needs_fence::<G>() {
            require_fences(self.client.backend())?;
        }
        self.options.clone().build()
    }

    /// The granted lease as the guard `G`; a lease that cannot be one (a fenced guard's, come
    /// without a fence) is given back.
    async fn finish(&self, guard: LockGuard) -> Result<G, LockError> {
        match wrap(guard) {
            Ok(guard) => Ok(guard),
            Err(guard) => {
                let _ = guard.release().await;
                Err(no_fence(self.client.backend(), self.key))
            }
        }
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
        let options = self.checked()?;
        self.client
            .run_leased(self.key, self.kind, &options, false, body)
            .await
    }

    /// Runs `body` only while the lock is held: a lost lease cancels it and the call returns
    /// `Lost` (see [`LockClient::while_held`]).
    ///
    /// # Errors
    /// `Config` for options `LockOptions::build` refuses; then as
    /// [`LockClient::while_held`].
    ///
    /// # Cancel safety
    /// As [`LockClient::while_held`].
    pub async fn run_while_held<F, Fut, T>(self, body: F) -> Result<T, LockError>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let options = self.checked()?;
        self.client
            .run_leased(self.key, self.kind, &options, true, body)
            .await
    }
}
