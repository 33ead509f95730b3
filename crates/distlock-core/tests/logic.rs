//! Pure logic of the core, on an in-memory fake engine (no network): deadlines, resends,
//! cleanup, watchdog outcomes. Real engines are tested against real servers elsewhere.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::engine::{
    AcquireRequest, Attempt, BatchRenew, Capabilities, Fencing, LeaseCheck, LeaseRef, Linger,
    RenewItem, SessionEnd, SessionWatch, Sessions,
};
use distlock_core::{
    Backend, ErrorKind, LockClient, LockError, LockOptions, LockStatus, LostReason, ManualClock,
    Released,
};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Renew {
    Ok,
    Missing,
    /// Missing, once: the lease ran out (the fake forgets it, and answers later acquisitions
    /// as taken now); then `Ok`.
    MissingOnce,
    Foreign,
    Fail,
}

#[derive(Default)]
struct State {
    locks: HashMap<String, (String, u64)>,
    fences: HashMap<String, u64>,
    tokens_seen: Vec<String>,
    released: Vec<String>,
}

/// A fake engine whose faults are set by the test.
struct Fake {
    state: Mutex<State>,
    /// Acquires that are applied but answered with a timeout (a lost reply).
    lose_replies: AtomicU32,
    /// Acquires that fail with a timeout before being applied.
    fail_acquires: AtomicU32,
    /// From this attempt on (counting from 1; 0: never), acquires are refused outright (a
    /// clear error, nothing applied).
    refuse_from_attempt: AtomicU32,
    renew: Mutex<Renew>,
    extends: AtomicU32,
    /// Calls of `extend_many` (one per watchdog batch).
    batches: AtomicU32,
    attempts: AtomicU32,
    clock: Option<Arc<ManualClock>>,
    /// How far the manual clock moves while an acquire is in flight.
    latency: Duration,
    /// Set: the engine tells of lost leases itself (`loss_events`), when this says so.
    loss: Option<SessionEnd>,
    /// The session a renewal to more than a minute moves a lease to (as etcd moves a key to
    /// a lease of the longer TTL), and the names moved there.
    longer: SessionEnd,
    moved: Mutex<Vec<String>>,
    /// Set: acquisitions are answered as taken this long ago (`AcquiredEarlier`).
    taken_ago: Mutex<Option<Duration>>,
    /// Set: leases can be left to run out by themselves (`Linger`); `Some(true)`: leaving one
    /// fails with a connection error.
    linger: Option<bool>,
    /// The leases left, with the time each was left for.
    lingered: Mutex<Vec<(String, Duration)>>,
    /// The leases of one renewal call.
    max_batch: usize,
    /// From this renewal call on (counting from 1; 0: never), calls never answer.
    hang_batches_from: AtomicU32,
    /// Set: no batch command (one renewal a lease, as memcached), each answered this late.
    per_lease: Option<Duration>,
    /// Renewals in flight now, and the most at once.
    renewing: AtomicU32,
    most_renewing: AtomicU32,
}

impl Fake {
    fn new() -> Self {
        Fake {
            state: Mutex::default(),
            lose_replies: AtomicU32::new(0),
            fail_acquires: AtomicU32::new(0),
            refuse_from_attempt: AtomicU32::new(0),
            renew: Mutex::new(Renew::Ok),
            extends: AtomicU32::new(0),
            batches: AtomicU32::new(0),
            attempts: AtomicU32::new(0),
            clock: None,
            latency: Duration::ZERO,
            loss: None,
            longer: SessionEnd::new(),
            moved: Mutex::default(),
            taken_ago: Mutex::new(None),
            linger: None,
            lingered: Mutex::default(),
            max_batch: 1024,
            hang_batches_from: AtomicU32::new(0),
            per_lease: None,
            renewing: AtomicU32::new(0),
            most_renewing: AtomicU32::new(0),
        }
    }
    fn timeout() -> LockError {
        LockError::new(ErrorKind::Timeout, "no reply")
    }
}

#[derive(Clone)]
struct FakeEngine(Arc<Fake>);

#[async_trait::async_trait]
impl Backend for FakeEngine {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Monotonic, true)
    }
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        let f = &self.0;
        let attempt = f.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        let refuse_from = f.refuse_from_attempt.load(Ordering::SeqCst);
        if refuse_from > 0 && attempt >= refuse_from {
            return Err(LockError::new(ErrorKind::Protocol, "refused"));
        }
        if let Some(c) = &f.clock {
            c.advance(f.latency);
        }
        if f.fail_acquires.load(Ordering::SeqCst) > 0 {
            f.fail_acquires.fetch_sub(1, Ordering::SeqCst);
            return Err(Fake::timeout());
        }
        let mut st = f.state.lock().unwrap();
        st.tokens_seen.push(req.token.as_str().to_owned());
        let outcome = match st.locks.get(req.name).cloned() {
            None => {
                let fence = st.fences.entry(req.name.to_owned()).or_default();
                *fence += 1;
                let fence = *fence;
                st.locks
                    .insert(req.name.to_owned(), (req.token.as_str().to_owned(), fence));
                Attempt::Acquired { fence: Some(fence) }
            }
            Some((t, fence)) if t == req.token.as_str() => Attempt::Acquired { fence: Some(fence) },
            Some(_) => Attempt::Busy {
                holder_ttl: Some(Duration::from_millis(5)),
            },
        };
        if f.lose_replies.load(Ordering::SeqCst) > 0 {
            f.lose_replies.fetch_sub(1, Ordering::SeqCst);
            return Err(Fake::timeout());
        }
        Ok(match (outcome, *f.taken_ago.lock().unwrap()) {
            (Attempt::Acquired { fence }, Some(age)) => Attempt::AcquiredEarlier {
                fence,
                age: Some(age),
                ttl: req.ttl,
            },
            (outcome, _) => outcome,
        })
    }
    async fn renew(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        self.0.extends.fetch_add(1, Ordering::SeqCst);
        if ttl > Duration::from_secs(60) {
            self.0.moved.lock().unwrap().push(lease.name.to_owned());
        }
        if let Some(late) = self.0.per_lease {
            let now = self.0.renewing.fetch_add(1, Ordering::SeqCst) + 1;
            self.0.most_renewing.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(late).await;
            self.0.renewing.fetch_sub(1, Ordering::SeqCst);
        }
        tokio::task::yield_now().await;
        let mut renew = self.0.renew.lock().unwrap();
        match *renew {
            Renew::Ok => Ok(LeaseCheck::Ours),
            Renew::Missing => Ok(LeaseCheck::Missing),
            Renew::MissingOnce => {
                *renew = Renew::Ok;
                *self.0.taken_ago.lock().unwrap() = None;
                self.0.state.lock().unwrap().locks.remove(lease.name);
                Ok(LeaseCheck::Missing)
            }
            Renew::Foreign => Ok(LeaseCheck::Foreign),
            Renew::Fail => Err(LockError::new(ErrorKind::Connection, "down")),
        }
    }
    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        let mut st = self.0.state.lock().unwrap();
        st.released.push(lease.token.as_str().to_owned());
        match st.locks.get(lease.name) {
            Some((t, _)) if t == lease.token.as_str() => {
                st.locks.remove(lease.name);
                Ok(LeaseCheck::Ours)
            }
            Some(_) => Ok(LeaseCheck::Foreign),
            None => Ok(LeaseCheck::Missing),
        }
    }
    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        let st = self.0.state.lock().unwrap();
        Ok(match st.locks.get(key) {
            Some((_, f)) => LockStatus::held(None, Some(*f), None),
            None => LockStatus::free(),
        })
    }
    fn batch_renew(&self) -> Option<&dyn BatchRenew> {
        self.0
            .per_lease
            .is_none()
            .then_some(self as &dyn BatchRenew)
    }
    fn sessions(&self) -> Option<&dyn Sessions> {
        self.0.loss.is_some().then_some(self as &dyn Sessions)
    }
    fn linger(&self) -> Option<&dyn Linger> {
        self.0.linger.is_some().then_some(self as &dyn Linger)
    }
}

#[async_trait::async_trait]
impl Linger for FakeEngine {
    async fn linger(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        if self.0.linger == Some(true) {
            return Err(LockError::new(ErrorKind::Connection, "down"));
        }
        let st = self.0.state.lock().unwrap();
        match st.locks.get(lease.name) {
            Some((t, _)) if t == lease.token.as_str() => {
                let left = (lease.name.to_owned(), ttl);
                self.0.lingered.lock().unwrap().push(left);
                Ok(LeaseCheck::Ours)
            }
            Some(_) => Ok(LeaseCheck::Foreign),
            None => Ok(LeaseCheck::Missing),
        }
    }
}

#[async_trait::async_trait]
impl BatchRenew for FakeEngine {
    fn max_batch(&self) -> usize {
        self.0.max_batch
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        let call = self.0.batches.fetch_add(1, Ordering::SeqCst) + 1;
        let hang_from = self.0.hang_batches_from.load(Ordering::SeqCst);
        if hang_from > 0 && call >= hang_from {
            return std::future::pending().await;
        }
        // A busy client: the batch leaves a little after the watchdog decided to send it.
        tokio::time::sleep(Duration::from_millis(1)).await;
        let mut out = Vec::new();
        for i in items {
            out.push(self.renew(&i.lease, i.ttl).await);
        }
        out
    }
}

impl Sessions for FakeEngine {
    /// Every lease on session 1, unless a longer renewal moved it to session 2.
    fn session_end(&self, lease: &LeaseRef<'_>) -> SessionWatch {
        let Some(end) = &self.0.loss else {
            return SessionWatch::Never;
        };
        if self.session_of(lease) == 2 {
            return SessionWatch::Shared {
                session: 2,
                end: self.0.longer.clone(),
            };
        }
        SessionWatch::Shared {
            session: 1,
            end: end.clone(),
        }
    }

    /// A lock named `moved` has left the session (as an etcd key moves to a lease of its own).
    fn still_on(&self, lease: &LeaseRef<'_>, session: u64) -> bool {
        session == self.session_of(lease) && lease.name != "moved"
    }
}

impl FakeEngine {
    fn session_of(&self, lease: &LeaseRef<'_>) -> u64 {
        let moved = self.0.moved.lock().unwrap();
        if moved.iter().any(|n| n == lease.name) {
            2
        } else {
            1
        }
    }
}

#[path = "logic/sessions.rs"]
mod sessions;

#[path = "logic/renewals.rs"]
mod renewals;

#[path = "logic/resends.rs"]
mod resends;

fn ttl_opts(ttl_ms: u64) -> distlock_core::LockOptionsBuilder {
    LockOptions::builder().ttl(Duration::from_millis(ttl_ms))
}

#[tokio::test]
async fn validity_counts_from_when_the_request_was_sent() {
    let clock = Arc::new(ManualClock::new());
    let mut fake = Fake::new();
    fake.clock = Some(clock.clone());
    fake.latency = Duration::from_millis(400); // the reply arrives 400 ms after the send
    let client = LockClient::builder(FakeEngine(Arc::new(fake)))
        .clock(clock.clone())
        .options(ttl_opts(10_000).auto_renew(false).build().unwrap())
        .build();
    let sent = distlock_core::Clock::now(&*clock);
    let g = client.try_acquire("k").await.unwrap().expect("free");
    // ttl − drift, where drift = 1% + 2 ms = 102 ms; the 400 ms in flight count against us.
    assert_eq!(g.valid_until(), sent + Duration::from_millis(10_000 - 102));
    assert!(g.is_held());
    clock.advance(Duration::from_millis(10_000 - 102 - 400 - 1));
    assert!(g.is_held());
    clock.advance(Duration::from_millis(1));
    assert!(!g.is_held(), "held past send + ttl − drift");
    let _ = g.leak();
}

async fn lost_with(renew: Renew) -> (LostReason, Duration) {
    let fake = Arc::new(Fake::new());
    let client = LockClient::builder(FakeEngine(fake.clone()))
        .options(ttl_opts(300).build().unwrap())
        .build();
    let g = client.acquire("k").await.unwrap();
    *fake.renew.lock().unwrap() = renew;
    let t0 = std::time::Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("lost fires");
    assert!(!g.is_held());
    assert!(matches!(g.release().await.unwrap(), Released::Lost(_)));
    (reason, t0.elapsed())
}

#[tokio::test]
async fn the_watchdog_reports_why_a_lease_was_lost() {
    let (r, t) = lost_with(Renew::Foreign).await;
    assert_eq!(r, LostReason::Stolen);
    assert!(
        t < Duration::from_millis(250),
        "detected at the first renewal, took {t:?}"
    );
    // The key vanished while our lease was still running: somebody removed it.
    let (r, _) = lost_with(Renew::Missing).await;
    assert_eq!(r, LostReason::Stolen);
    // Unreachable: only when the local deadline passes, never before.
    let (r, t) = lost_with(Renew::Fail).await;
    assert_eq!(r, LostReason::Unreachable);
    assert!(
        t >= Duration::from_millis(180),
        "declared lost before the deadline: {t:?}"
    );
}

#[tokio::test]
async fn with_lock_fails_when_the_lease_was_lost_during_the_body() {
    let fake = Arc::new(Fake::new());
    let client = LockClient::builder(FakeEngine(fake.clone()))
        .options(ttl_opts(300).build().unwrap())
        .build();
    let f2 = fake.clone();
    let e = client
        .with_lock("k", |lease| async move {
            *f2.renew.lock().unwrap() = Renew::Foreign;
            lease.lost().await
        })
        .await
        .expect_err("lost during the body");
    assert_eq!(e.kind(), ErrorKind::Lost);
    assert!(!e.is_retryable());
}

#[tokio::test]
async fn while_held_cancels_the_body_when_the_lease_is_lost() {
    let fake = Arc::new(Fake::new());
    let client = LockClient::builder(FakeEngine(fake.clone()))
        .options(ttl_opts(300).build().unwrap())
        .build();
    let f2 = fake.clone();
    let reached_the_end = Arc::new(AtomicU32::new(0));
    let end = reached_the_end.clone();
    let call = client.while_held("k", |_lease| async move {
        *f2.renew.lock().unwrap() = Renew::Foreign;
        // Never finishes by itself: only the loss ends the call.
        std::future::pending::<()>().await;
        end.fetch_add(1, Ordering::SeqCst);
    });
    let e = tokio::time::timeout(Duration::from_secs(3), call)
        .await
        .expect("the loss ended the body")
        .expect_err("lost during the body");
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    assert_eq!(reached_the_end.load(Ordering::SeqCst), 0);
    // A body that finishes first gives its value, and the lock was released.
    *fake.renew.lock().unwrap() = Renew::Ok;
    let v = client
        .lock("k")
        .run_while_held(|_lease| async { 7 })
        .await
        .unwrap();
    assert_eq!(v, 7);
    assert!(client.try_acquire("k").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_renewal_is_sent_after_release() {
    let fake = Arc::new(Fake::new());
    let client = LockClient::builder(FakeEngine(fake.clone()))
        .options(
            ttl_opts(30)
                .renew_interval(Duration::from_millis(2))
                .build()
                .unwrap(),
        )
        .build();
    for _ in 0..20 {
        let g = client.acquire("k").await.unwrap();
        tokio::time::sleep(Duration::from_millis(7)).await;
        assert_eq!(g.release().await.unwrap(), Released::Held);
        let after_release = fake.extends.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            fake.extends.load(Ordering::SeqCst),
            after_release,
            "renewed after release"
        );
    }
    assert!(
        fake.extends.load(Ordering::SeqCst) >= 20,
        "the watchdog never ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_of_many_leases_go_out_in_one_batch_per_tick() {
    let fake = Arc::new(Fake::new());
    let client = LockClient::builder(FakeEngine(fake.clone()))
        .options(
            ttl_opts(3000)
                .renew_interval(Duration::from_millis(100))
                .build()
                .unwrap(),
        )
        .build();
    let mut guards = Vec::new();
    for i in 0..200 {
        guards.push(client.try_acquire(&format!("k{i}")).await.unwrap().unwrap());
    }
    tokio::time::sleep(Duration::from_millis(1050)).await;
    let batches = fake.batches.load(Ordering::SeqCst);
    let extends = fake.extends.load(Ordering::SeqCst);
    // About 10 ticks of 200 renewals; one call per tick, not one per lease.
    assert!(extends >= 200 * 8, "{extends} renewals");
    assert!(
        batches <= 14,
        "{batches} batches for {extends} renewals: not batched"
    );
    for g in guards {
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
}

/// A batch goes out in chunks, one after another. The engine answers the first chunk and
/// never the second: the first chunk's leases are renewed (their answer came), the second's
/// are lost as unreachable when the batch runs out of time.
#[tokio::test]
async fn a_chunk_answered_before_the_batch_times_out_keeps_its_leases() {
    let mut fake = Fake::new();
    fake.max_batch = 2;
    fake.hang_batches_from = AtomicU32::new(2);
    let fake = Arc::new(fake);
    let client = LockClient::builder(FakeEngine(fake.clone()))
        .options(
            ttl_opts(3000)
                .renew_interval(Duration::from_millis(1000))
                .build()
                .unwrap(),
        )
        .build();
    let mut guards = Vec::new();
    for i in 0..4 {
        guards.push(client.try_acquire(&format!("c{i}")).await.unwrap().unwrap());
    }
    // One tick at about 1 s sends the four in two chunks; the second never comes back, and
    // the batch gives up at the leases' deadline (3 s, less drift).
    let lost = tokio::time::timeout(Duration::from_secs(5), guards[2].lost())
        .await
        .expect("the unanswered chunk's leases are lost");
    assert_eq!(lost, LostReason::Unreachable);
    assert_eq!(guards[3].lost().await, LostReason::Unreachable);
    assert!(
        guards[0].is_held() && guards[1].is_held(),
        "the answered chunk's leases were renewed, and are still held"
    );
    assert!(fake.batches.load(Ordering::SeqCst) >= 2);
    drop(guards);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_limits_let_the_lease_run_out() {
    let fake = Arc::new(Fake::new());
    let client = LockClient::new(FakeEngine(fake.clone()));
    let by_count = ttl_opts(300)
        .renew_interval(Duration::from_millis(50))
        .max_renewals(3)
        .build()
        .unwrap();
    let g = client
        .lock("count")
        .options(by_count)
        .acquire()
        .await
        .unwrap();
    let t0 = std::time::Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .unwrap();
    assert_eq!(reason, LostReason::Expired);
    assert_eq!(fake.extends.load(Ordering::SeqCst), 3);
    // 3 renewals 50 ms apart, then the 300 ms lease (less drift) runs out.
    assert!(
        t0.elapsed() >= Duration::from_millis(350),
        "{:?}",
        t0.elapsed()
    );
    drop(g);

    let by_time = ttl_opts(300)
        .renew_interval(Duration::from_millis(50))
        .max_hold(Duration::from_millis(400))
        .build()
        .unwrap();
    let t0 = std::time::Instant::now();
    let g = client
        .lock("time")
        .options(by_time)
        .acquire()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .unwrap();
    let held = t0.elapsed();
    assert!(
        held >= Duration::from_millis(300) && held <= Duration::from_millis(450),
        "held {held:?} with a 400 ms limit"
    );
}

/// A hold limit or a release period past what an instant holds (`Duration::MAX`) is as good as
/// none: the watchdog renews (its `acquired_at + max_hold` overflowed, a panic in its task) and
/// a cancelled `release_after` leaves the lock held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_of_duration_max_is_no_limit() {
    let fake = Arc::new(Fake::new());
    let client = LockClient::new(FakeEngine(fake.clone()));
    let opts = ttl_opts(200)
        .renew_interval(Duration::from_millis(40))
        .max_hold(Duration::MAX)
        .build()
        .unwrap();
    let g = client
        .lock("forever")
        .options(opts)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(g.is_held(), "renewed past its TTL");
    assert!(fake.extends.load(Ordering::SeqCst) >= 3);
    let waiting = tokio::time::timeout(Duration::from_millis(100), g.release_after(Duration::MAX));
    assert!(waiting.await.is_err(), "still waiting out the period");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_keeps_the_lock_for_the_period() {
    let fake = Arc::new(Fake::new());
    let client = LockClient::new(FakeEngine(fake.clone()));
    let other = LockClient::new(FakeEngine(fake.clone()));
    let opts = ttl_opts(200)
        .renew_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let t0 = std::time::Instant::now();
    let g = client.lock("job").options(opts).acquire().await.unwrap();
    let releasing = tokio::spawn(g.release_after(Duration::from_millis(500)));
    // The job is done, the period is not: the lock stays held past its TTL (renewed).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(other.try_acquire("job").await.unwrap().is_none());
    assert_eq!(releasing.await.unwrap().unwrap(), Released::Held);
    let held = t0.elapsed();
    assert!(
        held >= Duration::from_millis(500) && held < Duration::from_millis(800),
        "released after {held:?}"
    );
    assert!(other.try_acquire("job").await.unwrap().is_some());
    // Past the period already: at once.
    let g = client.lock("job2").options(opts).acquire().await.unwrap();
    let t1 = std::time::Instant::now();
    assert_eq!(
        g.release_after(Duration::ZERO).await.unwrap(),
        Released::Held
    );
    assert!(t1.elapsed() < Duration::from_millis(100));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_waiters_take_turns_in_fifo_order_and_only_the_head_asks() {
    let fake = Arc::new(Fake::new());
    let other = LockClient::new(FakeEngine(fake.clone()));
    let client = LockClient::new(FakeEngine(fake.clone()));
    let blocker = other.try_acquire("q").await.unwrap().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let c = client.clone();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let g = c.acquire("q").await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(2)).await;
            assert_eq!(g.release().await.unwrap(), Released::Held);
        }));
        // Join the queue in a known order.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = fake.attempts.load(Ordering::SeqCst);
    assert_eq!(blocker.release().await.unwrap(), Released::Held);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>());
    // After the foreign holder left, each waiter needed one attempt: the others waited locally.
    let after = fake.attempts.load(Ordering::SeqCst) - before;
    assert!(after <= 20 + 3, "{after} attempts for 20 acquisitions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_leaves_the_queue() {
    let fake = Arc::new(Fake::new());
    let client = LockClient::new(FakeEngine(fake.clone()));
    let g = client.try_acquire("d").await.unwrap().unwrap();
    let first = tokio::time::timeout(Duration::from_millis(50), client.acquire("d")).await;
    assert!(first.is_err(), "the lock is held");
    let c = client.clone();
    let second = tokio::spawn(async move { c.acquire("d").await.map(|g| g.fence()) });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let fence = tokio::time::timeout(Duration::from_secs(2), second)
        .await
        .expect("the dropped waiter did not block the queue")
        .unwrap()
        .unwrap();
    assert_eq!(fence, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_off_keeps_the_fence_and_is_bounded() {
    let fake = Arc::new(Fake::new());
    let opts = ttl_opts(2000)
        .handoff(true)
        .handoff_streak(3)
        .build()
        .unwrap();
    let client = LockClient::builder(FakeEngine(fake.clone()))
        .options(opts)
        .build();
    let first = client.acquire("h").await.unwrap();
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let c = client.clone();
        let fences = fences.clone();
        tasks.push(tokio::spawn(async move {
            let g = c.acquire("h").await.unwrap();
            fences.lock().unwrap().push(g.fence().unwrap());
            assert!(g.is_held());
            assert_eq!(g.release().await.unwrap(), Released::Held);
        }));
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let attempts_before = fake.attempts.load(Ordering::SeqCst);
    assert_eq!(first.release().await.unwrap(), Released::Held);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .unwrap()
            .unwrap();
    }
    let fences = fences.lock().unwrap().clone();
    assert_eq!(fences.len(), 10);
    // Runs of one fence: the first holder plus at most 3 hand-offs, then a real release.
    let mut all = vec![1];
    all.extend(&fences);
    let mut run = 1;
    for w in all.windows(2) {
        assert!(w[1] >= w[0], "fences went backwards: {all:?}");
        run = if w[1] == w[0] { run + 1 } else { 1 };
        assert!(run <= 4, "a streak longer than 3 hand-offs: {all:?}");
    }
    assert!(all.windows(2).any(|w| w[0] == w[1]), "no hand-off: {all:?}");
    // Hand-offs cost no acquire attempts: only the real releases do.
    let attempts = fake.attempts.load(Ordering::SeqCst) - attempts_before;
    assert!(
        attempts < 10,
        "{attempts} attempts for 10 acquisitions: {all:?}"
    );
    assert!(fake.state.lock().unwrap().locks.is_empty(), "left taken");
}

/// The watchdog sleeps until the earliest renewal it knows of; a lease whose first renewal is
/// due before that wakes it (new leases otherwise join without waking it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_taken_while_the_watchdog_sleeps_long_is_renewed_in_time() {
    let fake = Arc::new(Fake::new());
    let client = LockClient::new(FakeEngine(fake.clone()));
    let long = ttl_opts(30_000).build().unwrap();
    let short = ttl_opts(300).build().unwrap();
    let a = client
        .lock("long")
        .options(long)
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    // Let the watchdog take the long lease and go to sleep for its 10 s interval.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let b = client
        .lock("short")
        .options(short)
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(b.is_held(), "the short lease ran out: it was never renewed");
    assert!(fake.extends.load(Ordering::SeqCst) >= 3);
    assert_eq!(b.release().await.unwrap(), Released::Held);
    assert_eq!(a.release().await.unwrap(), Released::Held);
}

/// Options with a 5 s TTL and a wait budget of `d`.
fn budget(d: Duration) -> LockOptions {
    ttl_opts(5000).wait_timeout(d).build().unwrap()
}

/// A wait with a budget rides through an engine that fails for a while (a fail-over): the
/// failed attempts are tried again, with backoff, and the lock is taken once it answers.
/// `try_acquire` and a wait without a budget fail at once.
#[tokio::test]
async fn a_wait_budget_rides_through_engine_failures_and_names_the_last_cause() {
    let fake = Arc::new(Fake::new());
    let client = LockClient::builder(FakeEngine(fake.clone()))
        .options(ttl_opts(5000).build().unwrap())
        .build();
    // Every send fails (resends included) for a while.
    fake.fail_acquires.store(12, Ordering::SeqCst);
    let e = client.try_acquire("k").await.expect_err("failing");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    let e = client
        .lock("k")
        .options(ttl_opts(5000).build().unwrap())
        .acquire()
        .await
        .expect_err("no budget: an engine error ends the wait");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    let left = fake.fail_acquires.load(Ordering::SeqCst);
    assert!(left > 0, "the failures are not used up yet");
    let g = client
        .lock("k")
        .options(budget(Duration::from_secs(20)))
        .acquire()
        .await
        .expect("the budget rides through");
    assert_eq!(fake.fail_acquires.load(Ordering::SeqCst), 0);
    assert_eq!(g.release().await.unwrap(), Released::Held);

    // An engine that never comes back: after the budget, the error is the last cause's.
    fake.refuse_from_attempt.store(0, Ordering::SeqCst);
    fake.fail_acquires.store(u32::MAX, Ordering::SeqCst);
    let started = std::time::Instant::now();
    let e = client
        .lock("k")
        .options(budget(Duration::from_millis(400)))
        .acquire()
        .await
        .expect_err("never answers");
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(e.kind(), ErrorKind::Timeout);
    let text = e.to_string();
    assert!(
        text.contains("the last attempt failed") && text.contains("no reply"),
        "{text}"
    );
    fake.fail_acquires.store(0, Ordering::SeqCst);
}

/// `release_after` on an engine whose leases outlive their holder: the lease is left for the
/// time still to go and the call returns at once, with no release and no renewal after it;
/// when leaving it fails, or the engine cannot, the lock is kept until then and released.
#[tokio::test]
async fn release_after_leaves_the_lease_where_the_engine_can() {
    let hold = Duration::from_millis(600);
    for linger in [Some(false), Some(true), None] {
        let mut fake = Fake::new();
        fake.linger = linger;
        let fake = Arc::new(fake);
        let client = LockClient::builder(FakeEngine(fake.clone()))
            .options(ttl_opts(300).build().unwrap())
            .build();
        let g = client.try_acquire("k").await.unwrap().expect("free");
        assert_eq!(g.lingers(), linger.is_some());
        let t0 = std::time::Instant::now();
        assert_eq!(g.release_after(hold).await.unwrap(), Released::Held);
        let took = t0.elapsed();
        let left = fake.lingered.lock().unwrap().clone();
        let released = fake.state.lock().unwrap().released.len();
        if linger == Some(false) {
            assert!(took < Duration::from_millis(100), "{took:?}");
            assert_eq!(left.len(), 1);
            assert!(
                left[0].1 <= hold && left[0].1 > hold - Duration::from_millis(100),
                "{left:?}"
            );
            assert_eq!(released, 0, "a left lease was released");
            // No renewal crosses or follows it (the watchdog renews every 100 ms).
            let renewals = fake.extends.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(350)).await;
            assert_eq!(fake.extends.load(Ordering::SeqCst), renewals);
        } else {
            assert!(
                took >= hold - Duration::from_millis(20),
                "{linger:?}: {took:?}"
            );
            assert!(left.is_empty());
            assert_eq!(released, 1, "{linger:?}");
        }
    }
}

/// The log a writer in memory keeps (plain text).
#[derive(Clone, Default)]
struct LogText(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogText {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A wait that tries a failing engine again logs it once at WARN, and each later retry at
/// DEBUG, all under the target `distlock::retry`; the error after the budget names the cause's
/// kind once.
#[tokio::test]
async fn a_wait_warns_once_of_its_retries() {
    let fake = Arc::new(Fake::new());
    let client = LockClient::builder(FakeEngine(fake.clone()))
        .options(ttl_opts(5000).build().unwrap())
        .build();
    fake.fail_acquires.store(u32::MAX, Ordering::SeqCst);
    let text = LogText::default();
    let writer = text.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_target(true)
        .with_writer(move || writer.clone())
        .finish();
    let _log = tracing::subscriber::set_default(subscriber);
    let e = client
        .lock("k")
        .options(budget(Duration::from_millis(600)))
        .acquire()
        .await
        .expect_err("never answers");
    fake.fail_acquires.store(0, Ordering::SeqCst);
    let log = String::from_utf8(text.0.lock().unwrap().clone()).unwrap();
    let retries: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("distlock::retry"))
        .collect();
    assert!(retries.len() >= 3, "{log}");
    assert_eq!(
        retries.iter().filter(|l| l.contains(" WARN ")).count(),
        1,
        "{log}"
    );
    assert!(retries[0].contains(" WARN ") && retries[0].contains("attempt=1"));
    assert!(retries[1..].iter().all(|l| l.contains("DEBUG")), "{log}");
    let shown = distlock_core::error_chain(&e);
    assert_eq!(shown.matches("timed out").count(), 1, "{shown}");
    assert!(
        shown.starts_with("timed out: waited 600ms for lock \"k\"; the last attempt failed: "),
        "{shown}"
    );
}

/// An error that trying again cannot mend ends a wait at once, budget or not.
#[tokio::test]
async fn a_wait_budget_does_not_retry_what_cannot_pass() {
    let fake = Arc::new(Fake::new());
    let client = LockClient::builder(FakeEngine(fake.clone()))
        .options(ttl_opts(5000).build().unwrap())
        .build();
    fake.refuse_from_attempt.store(1, Ordering::SeqCst);
    let started = std::time::Instant::now();
    let e = client
        .lock("k")
        .options(budget(Duration::from_secs(20)))
        .acquire()
        .await
        .expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Protocol);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(fake.attempts.load(Ordering::SeqCst), 1);
}
