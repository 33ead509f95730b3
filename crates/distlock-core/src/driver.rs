//! The engine as one client drives it: its backend, with the client's clock and holder label.
//! Every call the core makes to an engine goes through here, and so does the choice between a
//! capability and its fallback (a batch or one renewal each, a hand-over or a plain release,
//! events or none).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::engine::{
    AcquireMany, AcquireRequest, Attempt, Backend, BatchRenew, BreakOutcome, LeaseCheck, LeaseKind,
    LeaseRef, Listener, LockStatus, MANY_MARK, ManyAttempt, MultiLock, NextWaiter, RenewItem,
    SessionWatch, Subscription, Support, many_names,
};
use crate::error::{ErrorKind, LockError};

/// Renewals in flight at once on an engine that renews each lease with its own request.
const RENEWALS_IN_FLIGHT: usize = 16;
use crate::token::Token;

/// How many times a forced release reads the holder again when the lock changed hands under it.
const BREAK_ATTEMPTS: u32 = 5;

pub(crate) struct Driver {
    backend: Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    owner: String,
    /// The renewals in flight at once on an engine without a batch command (see
    /// [`renew_many`](Self::renew_many)).
    renew_slots: tokio::sync::Semaphore,
}

impl Driver {
    pub(crate) fn new(backend: Arc<dyn Backend>, clock: Arc<dyn Clock>, owner: String) -> Self {
        Driver {
            backend,
            clock,
            owner,
            renew_slots: tokio::sync::Semaphore::new(RENEWALS_IN_FLIGHT),
        }
    }

    pub(crate) fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub(crate) fn now(&self) -> Instant {
        self.clock.now()
    }

    /// The holder label written with every lock.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    /// An acquire request for `token` on `key`, with this client's label and clock; `renewed`
    /// when the watchdog will renew the lease.
    pub(crate) fn request<'a>(
        &'a self,
        key: &'a str,
        kind: LeaseKind,
        token: &'a Token,
        ttl: Duration,
        renewed: bool,
    ) -> AcquireRequest<'a> {
        AcquireRequest::new(key, token, ttl, &self.owner, &self.clock)
            .kind(kind)
            .renewed(renewed)
    }

    pub(crate) async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        req.kind.validate()?;
        if let Support::No(why) = self.backend.capabilities().support(req.kind) {
            let what = match req.kind {
                LeaseKind::Shared => "read-write locks' shared leases",
                LeaseKind::Permit { .. } => "semaphores' permits",
                _ => "leases of this kind",
            };
            return Err(LockError::new(
                ErrorKind::Unsupported,
                format!(
                    "the {} engine cannot hold {what}: {why}",
                    self.backend.name(),
                ),
            ));
        }
        self.backend.acquire(req).await
    }

    pub(crate) async fn renew(
        &self,
        lease: &LeaseRef<'_>,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        if let Some(names) = many_names(lease.name) {
            return self.multi()?.renew_all(&names, lease.token, ttl).await;
        }
        self.backend.renew(lease, ttl).await
    }

    /// The engine's [`MultiLock`], or `Unsupported` with the reason it has none.
    pub(crate) fn multi(&self) -> Result<&dyn MultiLock, LockError> {
        self.backend.multi_lock().ok_or_else(|| {
            LockError::new(
                ErrorKind::Unsupported,
                format!(
                    "the {} engine cannot take several names at once: {}",
                    self.backend.name(),
                    self.backend.capabilities().why_no_many
                ),
            )
        })
    }

    /// One attempt on several names (see [`MultiLock::acquire_all`]).
    pub(crate) async fn acquire_all(
        &self,
        req: &AcquireMany<'_>,
    ) -> Result<ManyAttempt, LockError> {
        self.multi()?.acquire_all(req).await
    }

    /// Turns a held writer into a reader in one step, where the engine can: `Unsupported`
    /// otherwise, with the reason.
    pub(crate) async fn downgrade(
        &self,
        lease: &LeaseRef<'_>,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        let name = self.backend.name();
        let caps = self.backend.capabilities();
        let why = if let Support::No(why) = caps.shared {
            why
        } else if let Some(engine) = self.backend.downgrade() {
            return engine.downgrade(lease, ttl).await;
        } else {
            caps.why_no_downgrade
        };
        Err(LockError::new(
            ErrorKind::Unsupported,
            format!("the {name} engine cannot downgrade a writer to a reader: {why}"),
        ))
    }

    /// Writes `owner` as the label of our lease's holder, where the engine can: `Unsupported`
    /// otherwise, with the reason.
    pub(crate) async fn relabel(
        &self,
        lease: &LeaseRef<'_>,
        owner: &str,
    ) -> Result<LeaseCheck, LockError> {
        match self.backend.relabel() {
            Some(engine) => engine.relabel(lease, owner).await,
            None => Err(LockError::new(
                ErrorKind::Unsupported,
                format!(
                    "the {} engine cannot publish a new value without a new election: {}",
                    self.backend.name(),
                    self.backend.capabilities().why_no_relabel
                ),
            )),
        }
    }

    /// Whether a lease of `kind` can be left to run out by itself (see
    /// [`Linger`](crate::engine::Linger)).
    pub(crate) fn lingers(&self, kind: LeaseKind) -> bool {
        self.backend.linger().is_some_and(|l| l.lingers(kind))
    }

    /// Leaves `lease` to run out by itself `ttl` from now, where the engine can: `Unsupported`
    /// otherwise.
    pub(crate) async fn linger(
        &self,
        lease: &LeaseRef<'_>,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        match self.backend.linger() {
            Some(engine) if engine.lingers(lease.kind) && !lease.name.starts_with(MANY_MARK) => {
                engine.linger(lease, ttl).await
            }
            _ => Err(LockError::new(
                ErrorKind::Unsupported,
                format!(
                    "the {} engine ends a {} lease with its holder's session: it cannot be left \
                     to run out by itself",
                    self.backend.name(),
                    lease.kind.name()
                ),
            )),
        }
    }

    /// Leases one [`renew_many`](Self::renew_many) call carries at most.
    pub(crate) fn renew_chunk(&self) -> usize {
        self.backend
            .batch_renew()
            .map_or(1024, BatchRenew::max_batch)
            .max(1)
    }

    /// Renews every item: in one round trip where the engine can, else one renewal each, a
    /// few at a time.
    pub(crate) async fn renew_many(
        &self,
        items: &[RenewItem<'_>],
    ) -> Vec<Result<LeaseCheck, LockError>> {
        if items.iter().any(|i| i.lease.name.starts_with(MANY_MARK)) {
            return self.renew_mixed(items).await;
        }
        self.renew_names(items).await
    }

    /// Renews a batch with multi-name leases in it: those one by one (each is one request of
    /// its own on the engine), beside the batch of the others.
    async fn renew_mixed(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        let (many, single): (Vec<usize>, Vec<usize>) =
            (0..items.len()).partition(|&i| items[i].lease.name.starts_with(MANY_MARK));
        let singles: Vec<RenewItem<'_>> = single.iter().map(|&i| items[i]).collect();
        let (single_out, many_out) = futures_util::future::join(
            self.renew_names(&singles),
            futures_util::future::join_all(many.iter().map(|&i| async move {
                // One of the client's renewal slots each, as a lease renewed on its own.
                let _slot = self.renew_slots.acquire().await;
                self.renew(&items[i].lease, items[i].ttl).await
            })),
        )
        .await;
        let mut out: Vec<Option<Result<LeaseCheck, LockError>>> =
            (0..items.len()).map(|_| None).collect();
        for (i, r) in single.into_iter().zip(single_out) {
            out[i] = Some(r);
        }
        for (i, r) in many.into_iter().zip(many_out) {
            out[i] = Some(r);
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Ok(LeaseCheck::Missing)))
            .collect()
    }

    /// [`renew_many`](Self::renew_many) of single-name leases.
    async fn renew_names(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        use futures_util::StreamExt;
        match self.backend.batch_renew() {
            Some(batch) => batch.renew_many(items).await,
            // One request per lease, at most RENEWALS_IN_FLIGHT at once for the whole client:
            // an engine without a batch command (the file engine; memcached before its
            // pipeline) would otherwise get a connection per renewal in flight, and refuse them
            // past its limit (memcached's 1,024 as it comes). The limit is the client's, not
            // the call's: when renewals are slower than they come due, the watchdog has several
            // batches in flight, and a limit per call let a client holding 100,000 locks on
            // memcached open more than a thousand connections.
            None => {
                let mut out = Vec::with_capacity(items.len());
                let mut running = futures_util::stream::FuturesOrdered::new();
                let mut next = items.iter();
                loop {
                    while running.len() < RENEWALS_IN_FLIGHT
                        && let Some(item) = next.next()
                    {
                        running.push_back(self.renew_one(item));
                    }
                    match running.next().await {
                        Some(r) => out.push(r),
                        None => return out,
                    }
                }
            }
        }
    }

    /// One lease's renewal, once one of the client's renewal slots is free.
    async fn renew_one(&self, item: &RenewItem<'_>) -> Result<LeaseCheck, LockError> {
        // Never closed: an error cannot happen, and would only lift the limit.
        let _slot = self.renew_slots.acquire().await;
        self.backend.renew(&item.lease, item.ttl).await
    }

    /// Releases `lease`. `next` is this client's next waiter for the same name, if any (its
    /// token, TTL and own label): an engine with a server-side queue puts the client back in
    /// it in the same round trip.
    pub(crate) async fn release(
        &self,
        lease: &LeaseRef<'_>,
        next: Option<(&Token, Duration, Option<&str>)>,
    ) -> Result<LeaseCheck, LockError> {
        if let Some(names) = many_names(lease.name) {
            return self.multi()?.release_all(&names, lease.token).await;
        }
        match (self.backend.handover(), next) {
            (Some(handover), Some((token, ttl, label))) => {
                let next = NextWaiter::new(token, ttl, label.unwrap_or(&self.owner));
                handover.release_requeue(lease, &next).await
            }
            _ => self.backend.release(lease).await,
        }
    }

    /// A subscription to `key`'s release events, for the waiter of `token`; `None` when the
    /// engine has none.
    pub(crate) async fn subscribe(
        &self,
        key: &str,
        kind: LeaseKind,
        token: &Token,
    ) -> Result<Option<Subscription>, LockError> {
        match self.backend.wake_source() {
            Some(source) => {
                source
                    .subscribe(
                        key,
                        Listener::Waiter {
                            kind,
                            token: token.as_str(),
                        },
                    )
                    .await
            }
            None => Ok(None),
        }
    }

    /// A subscription to `key`'s release events for a follower that does not wait for the
    /// lease itself (an election's observer); `None` when the engine has none.
    pub(crate) async fn subscribe_any(&self, key: &str) -> Result<Option<Subscription>, LockError> {
        match self.backend.wake_source() {
            Some(source) => source.subscribe(key, Listener::Follower).await,
            None => Ok(None),
        }
    }

    /// Whether the engine's events come however a lease ends (see
    /// [`WakeSource::hears_every_release`](crate::engine::WakeSource::hears_every_release)).
    pub(crate) fn hears_every_release(&self) -> bool {
        self.backend
            .wake_source()
            .is_some_and(|s| s.hears_every_release())
    }

    /// Whether the engine listens for `key`'s events already (see
    /// [`WakeSource::watching`](crate::engine::WakeSource::watching)).
    pub(crate) fn watching(&self, key: &str) -> bool {
        self.backend.wake_source().is_some_and(|s| s.watching(key))
    }

    /// The engine's word that the session holding `lease` ended, if it has sessions.
    pub(crate) fn session_end(&self, lease: &LeaseRef<'_>) -> Option<SessionWatch> {
        // A multi-name lease's loss is heard at its renewals.
        if lease.name.starts_with(MANY_MARK) {
            return None;
        }
        self.backend.sessions().map(|s| s.session_end(lease))
    }

    /// Whether `lease` was still on the shared `session` when it ended (see
    /// [`Sessions::still_on`](crate::engine::Sessions::still_on)).
    pub(crate) fn still_on(&self, lease: &LeaseRef<'_>, session: u64) -> bool {
        lease.name.starts_with(MANY_MARK)
            || self
                .backend
                .sessions()
                .is_none_or(|s| s.still_on(lease, session))
    }

    /// Takes a lease that is no longer renewed off its session, where the engine shares
    /// sessions between leases (see [`Sessions::detach`](crate::engine::Sessions::detach)).
    pub(crate) async fn detach(&self, lease: &LeaseRef<'_>, ttl: Duration) {
        if !lease.name.starts_with(MANY_MARK)
            && let Some(sessions) = self.backend.sessions()
            && let Err(e) = sessions.detach(lease, ttl).await
        {
            tracing::debug!(target: "distlock", key = lease.name, error = %e,
                "could not take a lease that is no longer renewed off its session");
        }
    }

    pub(crate) async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        self.backend.inspect(key).await
    }

    /// Removes whoever holds `key`: what was removed, or `None` when the lock was free. The
    /// holder is read and removed again when the lock changed hands in between, a few times.
    pub(crate) async fn force_release(&self, key: &str) -> Result<Option<LockStatus>, LockError> {
        let Some(breaker) = self.backend.breaker() else {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                format!("the {} engine cannot break a lock", self.backend.name()),
            ));
        };
        for _ in 0..BREAK_ATTEMPTS {
            match breaker.break_once(key).await? {
                BreakOutcome::Free => return Ok(None),
                BreakOutcome::Broken(status) => return Ok(Some(status)),
                BreakOutcome::Changed => {}
            }
        }
        Err(LockError::new(
            ErrorKind::Busy,
            format!("{key:?} changed hands {BREAK_ATTEMPTS} times while being broken; try again"),
        ))
    }
}
