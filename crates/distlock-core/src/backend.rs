//! The engine trait: the few primitives an engine supplies. Everything else (waiting, the
//! watchdog, the lost signal, guards) is written once in the core on top of them.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::error::{ErrorKind, LockError};
use crate::token::Token;
use crate::wake::Subscription;

/// One lease to renew in a batch ([`Backend::extend_many`]).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RenewItem<'a> {
    /// The lock key.
    pub key: &'a str,
    /// Our token.
    pub token: &'a Token,
    /// The new lease, from the moment the batch is sent.
    pub ttl: Duration,
}

impl<'a> RenewItem<'a> {
    /// A renewal of `key` held with `token` to `ttl`.
    pub fn new(key: &'a str, token: &'a Token, ttl: Duration) -> Self {
        RenewItem { key, token, ttl }
    }
}

/// One acquire request, as handed to an engine.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct AcquireRequest<'a> {
    /// The lock key (already validated by the core).
    pub key: &'a str,
    /// Our token. A retry of a request whose reply was lost carries the same token.
    pub token: &'a Token,
    /// The lease to ask for.
    pub ttl: Duration,
    /// A label naming the holder (host/pid by default), shown by `status`.
    pub owner: &'a str,
    /// This is a resend of a request whose reply was lost (same token): the lock may already
    /// be ours.
    pub resent: bool,
    /// This attempt comes from a waiting `acquire` (not its first attempt): the engine should
    /// report the holder's remaining lease, and may queue the waiter for a wake-up. A first
    /// attempt may take a cheaper path that reports neither.
    pub waiting: bool,
}

impl<'a> AcquireRequest<'a> {
    /// A request for `key` with `token`, a lease of `ttl`, and the holder label `owner`.
    pub fn new(key: &'a str, token: &'a Token, ttl: Duration, owner: &'a str) -> Self {
        AcquireRequest {
            key,
            token,
            ttl,
            owner,
            resent: false,
            waiting: false,
        }
    }

    /// Marks the request as a resend (see [`AcquireRequest::resent`]).
    #[must_use]
    pub fn resent(mut self, resent: bool) -> Self {
        self.resent = resent;
        self
    }

    /// Marks the request as a waiter's attempt (see [`AcquireRequest::waiting`]).
    #[must_use]
    pub fn waiting(mut self, waiting: bool) -> Self {
        self.waiting = waiting;
        self
    }
}

/// What one acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The lock is ours: newly taken, or already ours with this token (a retried request).
    Acquired {
        /// The fencing token, if the engine gives a correct one.
        fence: Option<u64>,
    },
    /// A release handed the lock to this wait: the engine queues waiting clients and, when
    /// the holder releases, writes the lock for the first of them with the token and TTL that
    /// client registered (see [`Backend::release_queued`]), so the waiter takes it without
    /// another request. Only attempts with [`AcquireRequest::waiting`] set, reusing the token
    /// of an earlier attempt of the same wait, can get this.
    Granted {
        /// The fencing token the release took for us.
        fence: Option<u64>,
        /// The lease was written at most this long ago (the time since the registration it was
        /// granted on was sent); `None` when the engine cannot bound it, and the core then
        /// renews the lease before using it.
        elapsed: Option<Duration>,
        /// The TTL it was written with (the registration's; the core renews at once if that is
        /// not the TTL this wait asks for).
        ttl: Duration,
    },
    /// Someone else holds it.
    Busy {
        /// The holder's remaining lease, when the engine knows it.
        holder_ttl: Option<Duration>,
    },
}

/// The next waiter of this client for a key, as a release passes it to the engine: a release
/// that puts the client back in the engine's queue registers this token and TTL, so a later
/// release by another client can hand the lock straight to it ([`Attempt::Granted`]).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct NextWaiter<'a> {
    /// The token the waiter's attempts use.
    pub token: &'a Token,
    /// The lease it asks for.
    pub ttl: Duration,
    /// The holder label to write.
    pub owner: &'a str,
}

impl<'a> NextWaiter<'a> {
    /// A waiter with `token`, asking for `ttl`, labelled `owner`.
    pub fn new(token: &'a Token, ttl: Duration, owner: &'a str) -> Self {
        NextWaiter { token, ttl, owner }
    }
}

/// What the engine found under the key when we renewed or released it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseCheck {
    /// It held our token (and the operation was applied).
    Ours,
    /// There was no lock: our lease had expired.
    Missing,
    /// Another owner's token was there: our lease expired and someone else took the lock.
    Foreign,
}

/// What `status` reports about a key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LockStatus {
    /// Whether anybody holds the lock.
    pub held: bool,
    /// The holder's label (host/pid and since when), if known.
    pub owner: Option<String>,
    /// The holder's fencing token, when the engine recorded it.
    pub fence: Option<u64>,
    /// The highest fence the engine has issued for this key so far, when it keeps a counter
    /// (the holder's fence is at most this; the next holder's will be higher). Engines that
    /// skip recording the holder's fence on their fast path report only this.
    pub last_fence: Option<u64>,
    /// The holder's remaining lease, if the lease expires.
    pub ttl: Option<Duration>,
}

impl LockStatus {
    /// Nobody holds the lock.
    pub fn free() -> Self {
        LockStatus::default()
    }

    /// The lock is held.
    pub fn held(owner: Option<String>, fence: Option<u64>, ttl: Option<Duration>) -> Self {
        LockStatus {
            held: true,
            owner,
            fence,
            last_fence: None,
            ttl,
        }
    }

    /// The same status, with the highest fence issued so far.
    #[must_use]
    pub fn with_last_fence(mut self, last_fence: Option<u64>) -> Self {
        self.last_fence = last_fence;
        self
    }
}

/// Whether an engine gives fencing tokens, and why not when it does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fencing {
    /// Every new holder gets a strictly greater number than every earlier holder.
    Monotonic,
    /// No correct token can be given; the reason is shown to users.
    Unavailable(&'static str),
}

/// What an engine can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Fencing tokens.
    pub fencing: Fencing,
    /// Whether the engine expires a lease by itself after its TTL (Redis: yes). Session engines
    /// (the file lock) free the lock when the holder's process or session ends instead.
    pub expiring: bool,
    /// Whether the engine learns on its own that a held lease can no longer be trusted (a
    /// ZooKeeper session suspended or expired), through [`Backend::lease_lost`].
    pub loss_events: bool,
}

impl Capabilities {
    /// Builds a capabilities value.
    pub fn new(fencing: Fencing, expiring: bool) -> Self {
        Capabilities {
            fencing,
            expiring,
            loss_events: false,
        }
    }

    /// Says the engine implements [`Backend::lease_lost`].
    #[must_use]
    pub fn with_loss_events(mut self) -> Self {
        self.loss_events = true;
        self
    }
}

/// The primitives a lock engine supplies.
///
/// Every method takes `&self` and may be called concurrently. Implementations must make
/// `try_acquire` idempotent for a repeated token (a retry after a lost reply), and `extend` and
/// `release` must compare the token before changing anything.
pub trait Backend: Send + Sync + 'static {
    /// A short engine name for logs and errors ("redis", "file").
    fn name(&self) -> &'static str;

    /// What this engine can do.
    fn capabilities(&self) -> Capabilities;

    /// One attempt to take the lock.
    fn try_acquire(
        &self,
        req: &AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Attempt, LockError>> + Send;

    /// Renews our lease to `ttl` from now, if the key still holds `token`.
    fn extend(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
    ) -> impl Future<Output = Result<LeaseCheck, LockError>> + Send;

    /// Deletes the lock if the key still holds `token`.
    fn release(
        &self,
        key: &str,
        token: &Token,
    ) -> impl Future<Output = Result<LeaseCheck, LockError>> + Send;

    /// Who holds `key`, if anybody.
    fn status(&self, key: &str) -> impl Future<Output = Result<LockStatus, LockError>> + Send;

    /// An operator's break-glass: removes whoever holds `key`, as a release by the holder
    /// would (waiters are woken, or handed the lock, as after a release; fences stay
    /// monotonic, so the next holder's is higher). Returns what was removed, or `None` when
    /// the lock was free.
    ///
    /// The holder is not asked: it learns at its next renewal (or at once, on engines with
    /// loss events), and until then may still believe it holds the lock. Only fencing keeps
    /// its late writes out. The default is `Unsupported`.
    fn force_release(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<LockStatus>, LockError>> + Send {
        let _ = key;
        let name = self.name();
        std::future::ready(Err(LockError::new(
            ErrorKind::Unsupported,
            format!("the {name} engine cannot break a lock"),
        )))
    }

    /// [`release`](Self::release), called when tasks of this client still wait for the same
    /// key; `next` is the one whose turn comes next. An engine with a queue of waiting clients
    /// (Redis) puts this client back at the end of it in the same round trip, registered with
    /// `next`'s token, so its next task neither jumps ahead of other clients nor spends a round
    /// trip queueing, and can be handed the lock when its turn comes. The default is `release`.
    fn release_queued(
        &self,
        key: &str,
        token: &Token,
        next: &NextWaiter<'_>,
    ) -> impl Future<Output = Result<LeaseCheck, LockError>> + Send {
        let _ = next;
        self.release(key, token)
    }

    /// Renews many leases at once: one result per item, in order. The watchdog sends every
    /// renewal that is due in one call. Engines that can pipeline (Redis) send them in one round
    /// trip; the default runs [`extend`](Self::extend) for all of them concurrently.
    fn extend_many<'a>(
        &'a self,
        items: &'a [RenewItem<'a>],
    ) -> impl Future<Output = Vec<Result<LeaseCheck, LockError>>> + Send + 'a {
        futures_util::future::join_all(
            items
                .iter()
                .map(move |i| self.extend(i.key, i.token, i.ttl)),
        )
    }

    /// A subscription to `key`'s release events, so a waiter can sleep until the lock is free
    /// instead of polling. `Ok(None)` (the default) means the engine has no events: waiters use
    /// jittered back-off. A subscription may also miss events (a foreign client's release, a
    /// reconnect): waiters always bound their sleep by the holder's remaining lease and a capped
    /// fallback interval.
    ///
    /// Engines should return only once the subscription is active at the server (or give up on
    /// confirmation after a short time), so a release between this call and the next attempt is
    /// not missed.
    fn subscribe(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Subscription>, LockError>> + Send {
        let _ = key;
        std::future::ready(Ok(None))
    }

    /// Resolves, with the reason, when the engine learns by itself that the lease of `token` on
    /// `key`, just taken, can no longer be trusted: the guard then ends it at once (`is_held`
    /// turns false, `lost()` fires) instead of at the next renewal. Called once per guard, only
    /// when [`Capabilities::loss_events`] is set; the future is dropped when the lease ends. The
    /// default never resolves.
    fn lease_lost(
        &self,
        key: &str,
        token: &Token,
    ) -> impl Future<Output = crate::LostReason> + Send + 'static {
        let _ = (key, token);
        std::future::pending()
    }
}

/// A boxed, `Send` future, as returned by [`DynBackend`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe twin of [`Backend`], so an engine can be chosen at run time (from a URL).
/// Every `Backend` is a `DynBackend`, and `Box<dyn DynBackend>` is a `Backend` again.
pub trait DynBackend: Send + Sync + 'static {
    /// See [`Backend::name`].
    fn dyn_name(&self) -> &'static str;
    /// See [`Backend::capabilities`].
    fn dyn_capabilities(&self) -> Capabilities;
    /// See [`Backend::try_acquire`].
    fn dyn_try_acquire<'a>(
        &'a self,
        req: &'a AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Attempt, LockError>>;
    /// See [`Backend::extend`].
    fn dyn_extend<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>>;
    /// See [`Backend::release`].
    fn dyn_release<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>>;
    /// See [`Backend::status`].
    fn dyn_status<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LockStatus, LockError>>;
    /// See [`Backend::force_release`].
    fn dyn_force_release<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockStatus>, LockError>>;
    /// See [`Backend::release_queued`].
    fn dyn_release_queued<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        next: &'a NextWaiter<'a>,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>>;
    /// See [`Backend::extend_many`].
    fn dyn_extend_many<'a>(
        &'a self,
        items: &'a [RenewItem<'a>],
    ) -> BoxFuture<'a, Vec<Result<LeaseCheck, LockError>>>;
    /// See [`Backend::lease_lost`].
    fn dyn_lease_lost(&self, key: &str, token: &Token) -> BoxFuture<'static, crate::LostReason>;
    /// See [`Backend::subscribe`].
    fn dyn_subscribe<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Subscription>, LockError>>;
}

impl<B: Backend> DynBackend for B {
    fn dyn_name(&self) -> &'static str {
        self.name()
    }
    fn dyn_capabilities(&self) -> Capabilities {
        self.capabilities()
    }
    fn dyn_try_acquire<'a>(
        &'a self,
        req: &'a AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Attempt, LockError>> {
        Box::pin(self.try_acquire(req))
    }
    fn dyn_extend<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>> {
        Box::pin(self.extend(key, token, ttl))
    }
    fn dyn_release<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>> {
        Box::pin(self.release(key, token))
    }
    fn dyn_status<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LockStatus, LockError>> {
        Box::pin(self.status(key))
    }
    fn dyn_force_release<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockStatus>, LockError>> {
        Box::pin(self.force_release(key))
    }
    fn dyn_release_queued<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        next: &'a NextWaiter<'a>,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>> {
        Box::pin(self.release_queued(key, token, next))
    }
    fn dyn_extend_many<'a>(
        &'a self,
        items: &'a [RenewItem<'a>],
    ) -> BoxFuture<'a, Vec<Result<LeaseCheck, LockError>>> {
        Box::pin(self.extend_many(items))
    }
    fn dyn_subscribe<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Subscription>, LockError>> {
        Box::pin(self.subscribe(key))
    }
    fn dyn_lease_lost(&self, key: &str, token: &Token) -> BoxFuture<'static, crate::LostReason> {
        Box::pin(self.lease_lost(key, token))
    }
}

/// An engine chosen at run time.
pub type AnyBackend = Box<dyn DynBackend>;

impl Backend for Box<dyn DynBackend> {
    fn name(&self) -> &'static str {
        (**self).dyn_name()
    }
    fn capabilities(&self) -> Capabilities {
        (**self).dyn_capabilities()
    }
    async fn try_acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        (**self).dyn_try_acquire(req).await
    }
    async fn extend(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        (**self).dyn_extend(key, token, ttl).await
    }
    async fn release(&self, key: &str, token: &Token) -> Result<LeaseCheck, LockError> {
        (**self).dyn_release(key, token).await
    }
    async fn status(&self, key: &str) -> Result<LockStatus, LockError> {
        (**self).dyn_status(key).await
    }
    async fn force_release(&self, key: &str) -> Result<Option<LockStatus>, LockError> {
        (**self).dyn_force_release(key).await
    }
    async fn release_queued(
        &self,
        key: &str,
        token: &Token,
        next: &NextWaiter<'_>,
    ) -> Result<LeaseCheck, LockError> {
        (**self).dyn_release_queued(key, token, next).await
    }
    fn extend_many<'a>(
        &'a self,
        items: &'a [RenewItem<'a>],
    ) -> impl Future<Output = Vec<Result<LeaseCheck, LockError>>> + Send + 'a {
        (**self).dyn_extend_many(items)
    }
    async fn subscribe(&self, key: &str) -> Result<Option<Subscription>, LockError> {
        (**self).dyn_subscribe(key).await
    }
    fn lease_lost(
        &self,
        key: &str,
        token: &Token,
    ) -> impl Future<Output = crate::LostReason> + Send + 'static {
        (**self).dyn_lease_lost(key, token)
    }
}
