//! Seeded bugs made outside the library: an engine wrapper that breaks one rule on purpose.
//!
//! The fault harness's negative controls (`distlock-faults controls`) run a scenario with a bug
//! switched on and must see its checkers fail; otherwise their "0 violations" proves nothing.
//! Most of those bugs are a lie an engine could tell the core, so they are made here, around a
//! real engine, and the library carries no switch for them:
//!
//! | bug | what [`Seeded`] does |
//! |---|---|
//! | `plain-del`, `blind-delete` | a release deletes the lock whoever holds it (the engine's [`Breaker`]) |
//! | `unconditional-pexpire` | a renewal that finds another holder says it renewed ours |
//! | `reply-time-validity` | a lease counts from the acquisition's reply, not from its request |
//! | `renew-after-loss` | every lease taken is renewed until it is released, lost or not |
//! | `pg-session-held`, `mysql-session-held` | a session's end is never told, and a renewal that finds no lock says it renewed it |
//! | `reader-ignores-writer` | a reader refused is told it has its share |
//! | `permit-over-count` | a semaphore of `n` permits is asked for `n + 1` |
//!
//! One more is made by the harness's worker with public means: `wall-clock` (a [`WallClock`]
//! given to the client). The rest break the library's own algorithms (Redlock's quorum and
//! clean-up, Redis's fence floor and its count of the replicas that acknowledged a write, an
//! election's local deadline); they live behind `--cfg distlock_seeded_bugs`, see
//! `distlock_core::seeded`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BatchRenew, BreakOutcome, Breaker, Capabilities, Downgrade,
    Handover, LeaseCheck, LeaseKind, LeaseRef, Linger, Lister, LockStatus, NextWaiter, Relabel,
    RenewItem, SessionWatch, Sessions, WakeSource,
};
use distlock_core::seeded::SeededBug;
use distlock_core::{Clock, LockError, Token};

/// `inner`, with `bug` made by a [`Seeded`] wrapper when it is one of the wrapper's; `inner`
/// itself otherwise.
pub fn wrap(inner: Arc<dyn Backend>, bug: Option<SeededBug>) -> Arc<dyn Backend> {
    match bug {
        Some(bug) if Seeded::makes(bug) => Arc::new(Seeded {
            inner,
            bug,
            tokens: Arc::new(Mutex::new(HashSet::new())),
        }),
        _ => inner,
    }
}

/// A real engine with one seeded bug (see the module's table).
pub struct Seeded {
    inner: Arc<dyn Backend>,
    bug: SeededBug,
    /// `renew-after-loss`: the tokens of the leases taken and not yet released.
    /// `reader-ignores-writer`: the tokens of the shares granted against the engine's answer.
    tokens: Arc<Mutex<HashSet<String>>>,
}

impl std::fmt::Debug for Seeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seeded")
            .field("engine", &self.inner.name())
            .field("bug", &self.bug)
            .finish()
    }
}

impl Seeded {
    /// Whether the wrapper makes `bug`.
    pub fn makes(bug: SeededBug) -> bool {
        matches!(
            bug,
            SeededBug::PlainDel
                | SeededBug::BlindDelete
                | SeededBug::UnconditionalPexpire
                | SeededBug::ReplyTimeValidity
                | SeededBug::RenewAfterLoss
                | SeededBug::PgSessionHeld
                | SeededBug::MysqlSessionHeld
                | SeededBug::ReaderIgnoresWriter
                | SeededBug::PermitOverCount
        )
    }

    fn session_held(&self) -> bool {
        matches!(
            self.bug,
            SeededBug::PgSessionHeld | SeededBug::MysqlSessionHeld
        )
    }

    /// `permit-over-count`: the kind the engine is asked for.
    fn kind(&self, kind: LeaseKind) -> LeaseKind {
        match kind {
            LeaseKind::Permit { permits } if self.bug == SeededBug::PermitOverCount => {
                LeaseKind::Permit {
                    permits: permits.saturating_add(1),
                }
            }
            kind => kind,
        }
    }

    fn lease<'a>(&self, lease: &LeaseRef<'a>) -> LeaseRef<'a> {
        LeaseRef::new(lease.name, lease.token, self.kind(lease.kind)).recorded(lease.recorded)
    }

    fn granted_against_engine(&self, token: &Token) -> bool {
        self.bug == SeededBug::ReaderIgnoresWriter
            && self.tokens.lock().unwrap().contains(token.as_str())
    }

    /// What the renewal of `lease` answers, for what the engine answered.
    fn renewed(&self, r: Result<LeaseCheck, LockError>) -> Result<LeaseCheck, LockError> {
        match (self.bug, r) {
            (SeededBug::UnconditionalPexpire, Ok(LeaseCheck::Foreign)) => Ok(LeaseCheck::Ours),
            (SeededBug::PgSessionHeld | SeededBug::MysqlSessionHeld, Ok(LeaseCheck::Missing)) => {
                Ok(LeaseCheck::Ours)
            }
            (_, r) => r,
        }
    }

    /// `renew-after-loss`: renews the lease every third of `ttl` until it is released through
    /// this wrapper or the engine no longer has it, whatever the client did with it.
    fn keep_renewing(&self, req: &AcquireRequest<'_>) {
        let token_text = req.token.as_str().to_owned();
        self.tokens.lock().unwrap().insert(token_text.clone());
        let (inner, tokens) = (self.inner.clone(), self.tokens.clone());
        let (name, token, kind, ttl) = (req.name.to_owned(), req.token.clone(), req.kind, req.ttl);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                if !tokens.lock().unwrap().contains(&token_text) {
                    return;
                }
                let lease = LeaseRef::new(&name, &token, kind);
                if !matches!(inner.renew(&lease, ttl).await, Ok(LeaseCheck::Ours)) {
                    tokens.lock().unwrap().remove(&token_text);
                    return;
                }
            }
        });
    }

    /// A release: the engine's, or under `plain-del` and `blind-delete` a delete of whatever
    /// holds the lock.
    async fn released(
        &self,
        lease: &LeaseRef<'_>,
        release: impl std::future::Future<Output = Result<LeaseCheck, LockError>>,
    ) -> Result<LeaseCheck, LockError> {
        let was_listed = self.tokens.lock().unwrap().remove(lease.token.as_str());
        if was_listed && self.bug == SeededBug::ReaderIgnoresWriter {
            return Ok(LeaseCheck::Ours);
        }
        let breaker = self.inner.breaker().filter(|_| {
            matches!(self.bug, SeededBug::PlainDel | SeededBug::BlindDelete)
                && lease.kind == LeaseKind::Exclusive
        });
        let Some(breaker) = breaker else {
            return release.await;
        };
        loop {
            match breaker.break_once(lease.name).await? {
                BreakOutcome::Changed => continue,
                BreakOutcome::Free => return Ok(LeaseCheck::Missing),
                _ => return Ok(LeaseCheck::Ours),
            }
        }
    }
}

#[distlock_core::engine::async_trait]
impl Backend for Seeded {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        let asked = (*req).kind(self.kind(req.kind));
        let attempt = self.inner.acquire(&asked).await?;
        Ok(match (self.bug, attempt) {
            (SeededBug::ReplyTimeValidity, Attempt::Acquired { fence }) => {
                Attempt::AcquiredEarlier {
                    fence,
                    age: Some(Duration::ZERO),
                    ttl: req.ttl,
                }
            }
            (SeededBug::ReaderIgnoresWriter, Attempt::Busy { .. })
                if req.kind == LeaseKind::Shared =>
            {
                self.tokens
                    .lock()
                    .unwrap()
                    .insert(req.token.as_str().to_owned());
                Attempt::Acquired { fence: None }
            }
            (SeededBug::RenewAfterLoss, a @ Attempt::Acquired { .. })
            | (SeededBug::RenewAfterLoss, a @ Attempt::AcquiredEarlier { .. }) => {
                self.keep_renewing(req);
                a
            }
            (_, a) => a,
        })
    }

    async fn renew(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        if self.granted_against_engine(lease.token) {
            return Ok(LeaseCheck::Ours);
        }
        let r = self.inner.renew(&self.lease(lease), ttl).await;
        self.renewed(r)
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        let asked = self.lease(lease);
        self.released(lease, self.inner.release(&asked)).await
    }

    async fn inspect(&self, name: &str) -> Result<LockStatus, LockError> {
        self.inner.inspect(name).await
    }

    fn batch_renew(&self) -> Option<&dyn BatchRenew> {
        self.inner.batch_renew().map(|_| self as &dyn BatchRenew)
    }

    fn wake_source(&self) -> Option<&dyn WakeSource> {
        self.inner.wake_source()
    }

    fn sessions(&self) -> Option<&dyn Sessions> {
        self.inner.sessions().map(|_| self as &dyn Sessions)
    }

    /// None under the deleting bugs: every release goes through [`Backend::release`].
    fn handover(&self) -> Option<&dyn Handover> {
        if matches!(self.bug, SeededBug::PlainDel | SeededBug::BlindDelete) {
            return None;
        }
        self.inner.handover().map(|_| self as &dyn Handover)
    }

    fn breaker(&self) -> Option<&dyn Breaker> {
        self.inner.breaker()
    }

    fn downgrade(&self) -> Option<&dyn Downgrade> {
        self.inner.downgrade()
    }

    fn linger(&self) -> Option<&dyn Linger> {
        self.inner.linger()
    }

    fn lister(&self) -> Option<&dyn Lister> {
        self.inner.lister()
    }

    fn relabel(&self) -> Option<&dyn Relabel> {
        self.inner.relabel()
    }
}

#[distlock_core::engine::async_trait]
impl BatchRenew for Seeded {
    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        let Some(batch) = self.inner.batch_renew() else {
            return Vec::new();
        };
        let asked: Vec<RenewItem<'_>> = items
            .iter()
            .map(|i| RenewItem::new(self.lease(&i.lease), i.ttl))
            .collect();
        let answers = batch.renew_many(&asked).await;
        answers
            .into_iter()
            .zip(items)
            .map(|(r, i)| {
                if self.granted_against_engine(i.lease.token) {
                    Ok(LeaseCheck::Ours)
                } else {
                    self.renewed(r)
                }
            })
            .collect()
    }

    fn max_batch(&self) -> usize {
        self.inner.batch_renew().map_or(1, |b| b.max_batch())
    }
}

#[distlock_core::engine::async_trait]
impl Sessions for Seeded {
    /// Under the `*-session-held` bugs a session's end is never told.
    fn session_end(&self, lease: &LeaseRef<'_>) -> SessionWatch {
        match self.inner.sessions() {
            Some(s) if !self.session_held() => s.session_end(lease),
            _ => SessionWatch::Never,
        }
    }

    fn still_on(&self, lease: &LeaseRef<'_>, session: u64) -> bool {
        self.inner
            .sessions()
            .is_none_or(|s| s.still_on(lease, session))
    }

    async fn detach(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<(), LockError> {
        match self.inner.sessions() {
            Some(s) => s.detach(lease, ttl).await,
            None => Ok(()),
        }
    }
}

#[distlock_core::engine::async_trait]
impl Handover for Seeded {
    async fn release_requeue(
        &self,
        lease: &LeaseRef<'_>,
        next: &NextWaiter<'_>,
    ) -> Result<LeaseCheck, LockError> {
        let asked = self.lease(lease);
        let Some(handover) = self.inner.handover() else {
            return self.released(lease, self.inner.release(&asked)).await;
        };
        self.released(lease, handover.release_requeue(&asked, next))
            .await
    }
}

/// Seeded bug `wall-clock`: a [`Clock`] that follows the wall clock (`SystemTime`), jumps
/// included, where the library's deadlines must follow the monotonic one.
#[derive(Debug)]
pub struct WallClock {
    base: Instant,
    base_wall: SystemTime,
}

impl Default for WallClock {
    fn default() -> Self {
        WallClock {
            base: Instant::now(),
            base_wall: SystemTime::now(),
        }
    }
}

#[distlock_core::engine::async_trait]
impl Clock for WallClock {
    fn now(&self) -> Instant {
        match SystemTime::now().duration_since(self.base_wall) {
            Ok(ahead) => self.base + ahead,
            Err(behind) => self
                .base
                .checked_sub(behind.duration())
                .unwrap_or(self.base),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;
    use distlock_core::SystemClock;

    const TTL: Duration = Duration::from_secs(30);

    async fn take(
        engine: &dyn Backend,
        name: &str,
        kind: LeaseKind,
        token: &Token,
    ) -> Result<Attempt, LockError> {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let req = AcquireRequest::new(name, token, TTL, "test", &clock).kind(kind);
        engine.acquire(&req).await
    }

    fn taken(a: &Attempt) -> bool {
        matches!(
            a,
            Attempt::Acquired { .. } | Attempt::AcquiredEarlier { .. }
        )
    }

    /// A's lease runs out and B takes the lock; A then releases. Whether B still holds it.
    async fn b_holds_after_a_stale_release(bug: Option<SeededBug>) -> bool {
        let store = MemoryStore::new();
        let engine = wrap(Arc::new(store.backend()), bug);
        let (a, b) = (Token::generate(), Token::generate());
        assert!(taken(
            &take(&*engine, "k", LeaseKind::Exclusive, &a).await.unwrap()
        ));
        store.expire("k");
        assert!(taken(
            &take(&*engine, "k", LeaseKind::Exclusive, &b).await.unwrap()
        ));
        let stale = LeaseRef::new("k", &a, LeaseKind::Exclusive);
        let _ = engine.release(&stale).await.unwrap();
        engine.inspect("k").await.unwrap().held
    }

    #[tokio::test]
    async fn plain_del_deletes_the_next_holders_lock() {
        assert!(b_holds_after_a_stale_release(None).await);
        assert!(!b_holds_after_a_stale_release(Some(SeededBug::PlainDel)).await);
    }

    /// A's lease runs out and B takes the lock: what A's renewal is told.
    async fn stale_renewal(bug: Option<SeededBug>) -> LeaseCheck {
        let store = MemoryStore::new();
        let engine = wrap(Arc::new(store.backend()), bug);
        let (a, b) = (Token::generate(), Token::generate());
        take(&*engine, "k", LeaseKind::Exclusive, &a).await.unwrap();
        store.expire("k");
        take(&*engine, "k", LeaseKind::Exclusive, &b).await.unwrap();
        let stale = LeaseRef::new("k", &a, LeaseKind::Exclusive);
        engine.renew(&stale, TTL).await.unwrap()
    }

    #[tokio::test]
    async fn unconditional_pexpire_renews_what_another_holds() {
        assert_eq!(stale_renewal(None).await, LeaseCheck::Foreign);
        assert_eq!(
            stale_renewal(Some(SeededBug::UnconditionalPexpire)).await,
            LeaseCheck::Ours
        );
    }

    #[tokio::test]
    async fn permit_over_count_admits_one_more_holder() {
        for (bug, second) in [(None, false), (Some(SeededBug::PermitOverCount), true)] {
            let engine = wrap(Arc::new(MemoryStore::new().backend()), bug);
            let one = LeaseKind::Permit { permits: 1 };
            let (a, b) = (Token::generate(), Token::generate());
            let first = take(&*engine, "s", one, &a).await.unwrap();
            let next = take(&*engine, "s", one, &b).await.unwrap();
            assert!(taken(&first));
            assert_eq!(taken(&next), second, "{bug:?}");
        }
    }

    #[tokio::test]
    async fn reader_ignores_writer_is_told_it_has_its_share() {
        for (bug, shares) in [(None, false), (Some(SeededBug::ReaderIgnoresWriter), true)] {
            let engine = wrap(Arc::new(MemoryStore::new().backend()), bug);
            let (w, r) = (Token::generate(), Token::generate());
            let writer = take(&*engine, "rw", LeaseKind::Exclusive, &w).await;
            assert!(taken(&writer.unwrap()));
            let reader = take(&*engine, "rw", LeaseKind::Shared, &r).await;
            assert_eq!(taken(&reader.unwrap()), shares, "{bug:?}");
        }
    }

    #[tokio::test]
    async fn reply_time_validity_counts_from_the_reply() {
        let engine = wrap(
            Arc::new(MemoryStore::new().backend()),
            Some(SeededBug::ReplyTimeValidity),
        );
        let token = Token::generate();
        let a = take(&*engine, "k", LeaseKind::Exclusive, &token).await;
        assert!(matches!(
            a.unwrap(),
            Attempt::AcquiredEarlier { age: Some(age), .. } if age.is_zero()
        ));
    }

    /// Every bug is made in one place: the wrapper, the library, or the harness's worker
    /// (`wall-clock`).
    #[test]
    fn every_bug_is_made_in_one_place() {
        for bug in SeededBug::ALL {
            let by_worker = bug == SeededBug::WallClock;
            let places = [Seeded::makes(bug), bug.in_library(), by_worker];
            assert_eq!(places.iter().filter(|p| **p).count(), 1, "{bug:?}");
        }
    }
}
