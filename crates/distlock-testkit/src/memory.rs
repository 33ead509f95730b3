//! An engine in memory, for testing the core without a server, as tokio tests its `sync`
//! types: [`MemoryStore`] is the "server", and each [`MemoryStore::backend`] a client's engine
//! on it (as separate processes would have). It keeps every kind of lease, with fences, a TTL
//! on the store's clock, release events, a break-glass, a new label for a holder and a
//! writer's downgrade; it passes the conformance suite every engine passes
//! (`crates/distlock-core/tests/memory/conformance.rs`), so a core test on it tests the core,
//! not a toy.
//!
//! What it leaves out on purpose: a network (no reply is ever lost unless a test says so with
//! [`MemoryStore::fail_next`]) and an expiry that tells anyone (like PostgreSQL's `NOTIFY`,
//! its events come from releases only, so waiters keep backing off besides).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BreakOutcome, Breaker, Capabilities, Clock, Downgrade,
    ErrorKind, Fencing, HolderStatus, LeaseCheck, LeaseKind, LeaseRef, Listener, LockError,
    LockStatus, Relabel, Subscription, WakeSource,
};
use distlock_core::recipes::{HolderValue, WakeHub, kind_conflict, shares_unbreakable};

/// The "server": every lock, shared by the backends made from it.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Store>,
}

struct Store {
    names: Mutex<HashMap<String, Name>>,
    clock: Arc<dyn Clock>,
    /// Each backend's wake hub, told of every release.
    hubs: Mutex<Vec<WakeHub>>,
    /// Requests answered so far (acquire, renew, release, inspect), for tests that count.
    requests: AtomicU64,
    /// The next this many requests fail with a connection error (nothing done).
    failing: AtomicU32,
}

/// One name's state.
#[derive(Default)]
struct Name {
    /// The last fence given; a writer's or a permit's is one more.
    fence: u64,
    holders: Vec<Holder>,
}

struct Holder {
    token: String,
    kind: LeaseKind,
    /// The stored holder value (`<token> <since> <owner>`).
    value: String,
    fence: u64,
    deadline: Instant,
}

impl Name {
    fn purge(&mut self, now: Instant) {
        self.holders.retain(|h| h.deadline > now);
    }

    fn position(&self, token: &str) -> Option<usize> {
        self.holders.iter().position(|h| h.token == token)
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("requests", &self.requests())
            .finish_non_exhaustive()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// A store whose leases expire on the system's monotonic clock.
    pub fn new() -> Self {
        MemoryStore::with_clock(Arc::new(distlock_core::SystemClock))
    }

    /// A store whose leases expire on `clock` (give the clients the same one).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryStore {
            inner: Arc::new(Store {
                names: Mutex::default(),
                clock,
                hubs: Mutex::default(),
                requests: AtomicU64::new(0),
                failing: AtomicU32::new(0),
            }),
        }
    }

    /// A client's engine on this store.
    pub fn backend(&self) -> MemoryBackend {
        let hub = WakeHub::new(|_| {}, |_| {});
        self.inner.hubs.lock().unwrap().push(hub.clone());
        MemoryBackend {
            store: self.inner.clone(),
            hub,
        }
    }

    /// How many requests the store has answered (or failed).
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::SeqCst)
    }

    /// Makes the next `n` requests fail with a connection error, doing nothing.
    pub fn fail_next(&self, n: u32) {
        self.inner.failing.store(n, Ordering::SeqCst);
    }

    /// Drops whoever holds `name`, as an expiry would, without any event.
    pub fn expire(&self, name: &str) {
        self.inner.names.lock().unwrap().remove(name);
    }
}

/// One client's engine on a [`MemoryStore`].
#[derive(Clone)]
pub struct MemoryBackend {
    store: Arc<Store>,
    hub: WakeHub,
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend").finish_non_exhaustive()
    }
}

impl Store {
    /// Counts a request; an error when a test asked for failures.
    fn request(&self) -> Result<(), LockError> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let failing = self
            .failing
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        match failing {
            Ok(_) => Err(LockError::new(
                ErrorKind::Connection,
                "the memory store was told to fail this request",
            )),
            Err(_) => Ok(()),
        }
    }

    /// Tells every backend's waiters of `name` that something was released.
    fn tell(&self, name: &str) {
        for hub in self.hubs.lock().unwrap().iter() {
            hub.notify(name);
        }
    }

    fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        let now = self.clock.now();
        let mut names = self.names.lock().unwrap();
        let name = names.entry(req.name.to_owned()).or_default();
        name.purge(now);
        let token = req.token.as_str();
        if let Some(i) = name.position(token) {
            // A resend: ours already, counted from now.
            let h = &mut name.holders[i];
            h.deadline = now + req.ttl;
            return Ok(Attempt::Acquired {
                fence: Some(h.fence),
            });
        }
        let fits = match (req.kind, name.holders.first().map(|h| h.kind)) {
            (_, None) => true,
            (LeaseKind::Permit { permits }, Some(LeaseKind::Permit { permits: theirs })) => {
                if permits != theirs {
                    return Err(kind_conflict(
                        req.name,
                        req.kind,
                        LeaseKind::Permit { permits: theirs },
                    ));
                }
                name.holders.len() < permits as usize
            }
            (LeaseKind::Permit { .. }, Some(theirs))
            | (_, Some(theirs @ LeaseKind::Permit { .. })) => {
                return Err(kind_conflict(req.name, req.kind, theirs));
            }
            (LeaseKind::Shared, Some(LeaseKind::Shared)) => true,
            _ => false,
        };
        if !fits {
            let left = name
                .holders
                .iter()
                .map(|h| h.deadline.saturating_duration_since(now))
                .min();
            return Ok(Attempt::Busy { holder_ttl: left });
        }
        let fence = match req.kind {
            // A reader's fence is the last writer's.
            LeaseKind::Shared => name.fence,
            _ => {
                name.fence += 1;
                name.fence
            }
        };
        name.holders.push(Holder {
            token: token.to_owned(),
            kind: req.kind,
            value: HolderValue::now(token, req.owner).encode(),
            fence,
            deadline: now + req.ttl,
        });
        Ok(Attempt::Acquired { fence: Some(fence) })
    }

    /// Applies `f` to our holder of `lease`, if it is still there and ours.
    fn with_holder<T>(
        &self,
        lease: &LeaseRef<'_>,
        f: impl FnOnce(&mut Name, usize, Instant) -> T,
    ) -> Result<T, LeaseCheck> {
        let now = self.clock.now();
        let mut names = self.names.lock().unwrap();
        let Some(name) = names.get_mut(lease.name) else {
            return Err(LeaseCheck::Missing);
        };
        name.purge(now);
        match name.position(lease.token.as_str()) {
            Some(i) => Ok(f(name, i, now)),
            None if name.holders.iter().any(|h| h.kind == LeaseKind::Exclusive) => {
                Err(LeaseCheck::Foreign)
            }
            None => Err(LeaseCheck::Missing),
        }
    }

    fn status(&self, key: &str) -> LockStatus {
        let now = self.clock.now();
        let mut names = self.names.lock().unwrap();
        let Some(name) = names.get_mut(key) else {
            return LockStatus::free();
        };
        name.purge(now);
        let holders: Vec<HolderStatus> = name
            .holders
            .iter()
            .map(|h| {
                let value = HolderValue::parse(&h.value);
                HolderStatus::new(h.kind)
                    .token(Some(h.token.clone()))
                    .owner(Some(value.label()))
                    .fence((h.fence > 0).then_some(h.fence))
                    .ttl(Some(h.deadline.saturating_duration_since(now)))
            })
            .collect();
        let last = (name.fence > 0).then_some(name.fence);
        if holders.is_empty() {
            return LockStatus::free().with_last_fence(last);
        }
        LockStatus::held_by(holders).with_last_fence(last)
    }
}

fn check(result: Result<(), LeaseCheck>) -> LeaseCheck {
    result.err().unwrap_or(LeaseCheck::Ours)
}

#[distlock_core::engine::async_trait]
impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Monotonic, true)
            .with_shared()
            .with_permits()
            .no_list_because("the memory store is for tests, which know their names")
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        self.store.request()?;
        self.store.acquire(req)
    }

    async fn renew(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        self.store.request()?;
        Ok(check(self.store.with_holder(lease, |name, i, now| {
            name.holders[i].deadline = now + ttl;
        })))
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        self.store.request()?;
        let done = check(self.store.with_holder(lease, |name, i, _| {
            name.holders.remove(i);
        }));
        self.store.tell(lease.name);
        Ok(done)
    }

    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        self.store.request()?;
        Ok(self.store.status(key))
    }

    distlock_core::capability_getters!(
        wake_source: WakeSource,
        breaker: Breaker,
        downgrade: Downgrade,
        relabel: Relabel,
    );
}

#[distlock_core::engine::async_trait]
impl WakeSource for MemoryBackend {
    async fn subscribe(
        &self,
        name: &str,
        _who: Listener<'_>,
    ) -> Result<Option<Subscription>, LockError> {
        let sub = self.hub.subscribe(name);
        self.hub.set_confirmed(name, true);
        Ok(Some(sub))
    }

    /// An expiry tells nobody.
    fn hears_every_release(&self) -> bool {
        false
    }
}

#[distlock_core::engine::async_trait]
impl Breaker for MemoryBackend {
    async fn break_once(&self, key: &str) -> Result<BreakOutcome, LockError> {
        self.store.request()?;
        let status = self.store.status(key);
        match status.holders.first().map(|h| h.kind) {
            None => return Ok(BreakOutcome::Free),
            Some(LeaseKind::Shared) => return Err(shares_unbreakable(key, "readers")),
            Some(LeaseKind::Permit { .. }) => {
                return Err(shares_unbreakable(key, "a semaphore's permits"));
            }
            Some(_) => {}
        }
        {
            // Broken only if the holder read is still the one there (as an engine's
            // compare-and-delete): another may have taken the name in between.
            let mut names = self.store.names.lock().unwrap();
            let name = names.entry(key.to_owned()).or_default();
            let read = status.holders.iter().map(|h| h.token.as_deref());
            if !name.holders.iter().map(|h| Some(h.token.as_str())).eq(read) {
                return Ok(BreakOutcome::Changed);
            }
            name.holders.clear();
        }
        self.store.tell(key);
        Ok(BreakOutcome::Broken(status))
    }
}

#[distlock_core::engine::async_trait]
impl Downgrade for MemoryBackend {
    async fn downgrade(
        &self,
        lease: &LeaseRef<'_>,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        self.store.request()?;
        let done = check(self.store.with_holder(lease, |name, i, now| {
            let h = &mut name.holders[i];
            h.kind = LeaseKind::Shared;
            h.deadline = now + ttl;
        }));
        // Readers waiting behind the writer may come in.
        self.store.tell(lease.name);
        Ok(done)
    }
}

#[distlock_core::engine::async_trait]
impl Relabel for MemoryBackend {
    async fn relabel(&self, lease: &LeaseRef<'_>, owner: &str) -> Result<LeaseCheck, LockError> {
        self.store.request()?;
        Ok(check(self.store.with_holder(lease, |name, i, _| {
            let h = &mut name.holders[i];
            h.value = HolderValue::parse(&h.value).relabelled(owner).encode();
        })))
    }
}
