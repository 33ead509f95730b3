//! The conformance suite: engine-independent behaviour that every engine must show.
//!
//! Each engine's test file instantiates it with a setup expression that yields a client factory
//! (`Fn(LockOptions) -> Future<Output = LockClient>`), or `None` to skip outside CI. For an
//! engine on a server the test kit starts, [`clients_on`] makes the factory:
//!
//! ```text
//! fn setup() -> Option<impl MakeClient> {
//!     let etcd = Etcd::start()?;
//!     let url = etcd.url("");
//!     Some(clients_on(etcd, url, |url| async move { EtcdBackend::connect(&url).await }))
//! }
//!
//! distlock_testkit::conformance_tests!(setup());
//! ```
//!
//! Every client made by one factory must talk to the same lock namespace, as separate processes
//! would. Keys are unique per case, so cases may run in parallel.

use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use distlock_core::engine::Fencing;
use distlock_core::{
    Backoff, ErrorKind, LeaseEnd, LockClient, LockOptions, LostReason, Released, Wait,
};

mod election;
mod group;
mod kinds;
mod linger;
mod list;
mod many;
pub use election::*;
pub use group::*;
pub use kinds::*;
pub use linger::*;
pub use list::*;
pub use many::*;

/// Declares one `#[tokio::test]` per conformance case, each calling `$setup` for its own fixture.
#[macro_export]
macro_rules! conformance_tests {
    ($setup:expr) => {
        $crate::conformance_tests!(@cases $setup;
            exclusive_and_release,
            fences_strictly_increase,
            acquire_waits_for_release,
            acquire_times_out,
            no_wait_is_busy,
            with_lock_returns_and_releases,
            with_lock_releases_on_panic,
            dropped_guard_is_released,
            cancelled_acquire_leaves_nothing,
            status_reports_holder,
            local_deadline_ends_lease,
            watchdog_keeps_lease,
            expired_lease_is_taken_over,
            mutual_exclusion_counter,
            force_release_breaks_the_lock,
            bad_keys_are_refused,
            readers_share_and_writers_exclude,
            a_waiting_writer_holds_back_new_readers,
            a_dead_reader_frees_only_its_share,
            a_writer_downgrades_without_a_gap,
            status_lists_every_holder,
            every_kind_is_renewed,
            a_semaphore_admits_n,
            permits_never_exceed_n,
            a_dead_holders_permit_comes_back,
            a_waiter_that_gives_up_leaves_no_trace,
            an_election_has_one_leader_and_rising_epochs,
            a_silent_leader_steps_down_before_the_next_leads,
            observers_see_each_leader_once,
            a_lead_loop_campaigns_again_after_a_loss,
            a_leader_proclaims_a_new_value,
            listing_shows_what_is_held,
            a_lease_left_runs_out_by_itself,
            lock_many_takes_the_names_or_says_why
        );
    };
    // The run-time (URL) path of an engine whose own crate runs the whole suite: `open_backend`
    // picks the engine by the URL's scheme, and a few cases show that the client it makes
    // holds, fences, reports and lists as the engine does. (Every client holds its engine as
    // `Arc<dyn Backend>`: the whole suite through this path ran the same code a second time.)
    (@url $setup:expr) => {
        $crate::conformance_tests!(@cases $setup;
            exclusive_and_release,
            fences_strictly_increase,
            dropped_guard_is_released,
            status_reports_holder,
            listing_shows_what_is_held
        );
    };
    (@cases $setup:expr; $($case:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some(make) = $setup else { return };
                $crate::conformance::$case(&make).await;
            }
        )+
    };
}

/// Makes a new client with the given options, as a separate process would have; implemented for
/// every `Fn(LockOptions) -> impl Future<Output = LockClient>`.
pub trait MakeClient {
    /// A new client.
    fn client(&self, options: LockOptions) -> impl Future<Output = LockClient>;
}

impl<F, Fut> MakeClient for F
where
    F: Fn(LockOptions) -> Fut,
    Fut: Future<Output = LockClient>,
{
    fn client(&self, options: LockOptions) -> impl Future<Output = LockClient> {
        self(options)
    }
}

/// The client factory of an engine on `server` (which lives as long as the factory or a client
/// being made): each client gets its own backend, `connect(url)`, as a separate process would.
///
/// # Panics
/// A client that cannot connect panics, naming the URL and the error.
pub fn clients_on<S, B, C, Fut, E>(server: S, url: String, connect: C) -> impl MakeClient
where
    S: 'static,
    B: distlock_core::IntoBackend,
    C: Fn(String) -> Fut,
    Fut: Future<Output = Result<B, E>>,
    E: std::fmt::Display,
{
    let server = Arc::new(server);
    move |options: LockOptions| {
        let (server, connecting) = (server.clone(), connect(url.clone()));
        let url = url.clone();
        async move {
            let backend = connecting
                .await
                .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
            drop(server);
            LockClient::builder(backend).options(options).build()
        }
    }
}

fn opts() -> distlock_core::LockOptionsBuilder {
    LockOptions::builder()
        .ttl(Duration::from_secs(10))
        .backoff(Backoff::new(Duration::from_millis(1), Duration::from_millis(20)).unwrap())
}

fn key(case: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "conf-{case}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// One holder excludes another; release reports `Held` and frees the lock.
pub async fn exclusive_and_release(make: &impl MakeClient) {
    let (a, b) = (
        make.client(opts().build().unwrap()).await,
        make.client(opts().build().unwrap()).await,
    );
    let k = key("excl");
    let g = a.try_acquire(&k).await.unwrap().expect("free lock");
    assert!(g.is_held());
    assert_eq!(g.key(), k);
    assert!(
        b.try_acquire(&k).await.unwrap().is_none(),
        "a second client got a held lock"
    );
    assert!(
        a.try_acquire(&k).await.unwrap().is_none(),
        "the same client got a held lock twice"
    );
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let g2 = b
        .try_acquire(&k)
        .await
        .unwrap()
        .expect("released lock is free");
    assert_eq!(g2.release().await.unwrap(), Released::Held);
}

/// Every new holder gets a strictly greater fence (engines with fencing), or none at all; a
/// fenced client (`LockClient::fenced`) is made only where fences are given.
pub async fn fences_strictly_increase(make: &impl MakeClient) {
    let clients = [
        make.client(opts().build().unwrap()).await,
        make.client(opts().build().unwrap()).await,
    ];
    let k = key("fence");
    let fencing = clients[0].backend().capabilities().fencing;
    let mut last = 0u64;
    for i in 0..60 {
        let g = clients[i % 2]
            .try_acquire(&k)
            .await
            .unwrap()
            .expect("free lock");
        match fencing {
            Fencing::Monotonic => {
                let f = g.fence().expect("a fencing engine gives a fence");
                assert!(f > last, "fence went from {last} to {f}");
                last = f;
            }
            Fencing::Unavailable(_) => assert_eq!(g.fence(), None),
        }
        assert!(g.release().await.unwrap().was_held());
        // A fenced client's guards carry a `Fence` on this engine, rising with the others'; on
        // an engine without fences, neither the client nor a fenced request can be made.
        match (fencing, clients[i % 2].fenced()) {
            (Fencing::Monotonic, Ok(fenced)) if i % 3 == 0 => {
                let g = fenced
                    .lock(&k)
                    .try_acquire()
                    .await
                    .unwrap()
                    .expect("free lock");
                assert!(g.fence().get() > last, "fence {} after {last}", g.fence());
                last = g.fence().get();
                assert_eq!(g.deref().fence(), Some(last), "the guard inside has it too");
                assert!(g.release().await.unwrap().was_held());
            }
            (Fencing::Monotonic, Ok(_)) => {}
            (Fencing::Unavailable(why), Err(e)) => {
                assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
                assert!(e.to_string().contains(why), "{e}");
                let e = clients[0]
                    .lock(&k)
                    .fenced()
                    .try_acquire()
                    .await
                    .unwrap_err();
                assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            }
            (f, made) => panic!("{f:?}, yet a fenced client: {made:?}"),
        }
    }
}

/// A waiting acquire gets the lock soon after the holder releases it.
pub async fn acquire_waits_for_release(make: &impl MakeClient) {
    let a = make.client(opts().build().unwrap()).await;
    let b = make
        .client(
            opts()
                .wait_timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        )
        .await;
    let k = key("wait");
    let g = a.acquire(&k).await.unwrap();
    let k2 = k.clone();
    let waiter = tokio::spawn(async move {
        let g = b.acquire(&k2).await.unwrap();
        let at = Instant::now();
        assert!(g.release().await.unwrap().was_held());
        at
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let released_at = Instant::now();
    assert!(g.release().await.unwrap().was_held());
    let got_at = waiter.await.unwrap();
    let lag = got_at.duration_since(released_at);
    assert!(
        lag < Duration::from_secs(2),
        "the waiter took {lag:?} after the release"
    );
}

/// A wait timeout ends `acquire` with `Timeout`, on time.
pub async fn acquire_times_out(make: &impl MakeClient) {
    let a = make.client(opts().build().unwrap()).await;
    let b = make
        .client(
            opts()
                .wait_timeout(Duration::from_millis(300))
                .build()
                .unwrap(),
        )
        .await;
    let k = key("timeout");
    let g = a.acquire(&k).await.unwrap();
    let t0 = Instant::now();
    let err = b.acquire(&k).await.expect_err("the lock is held");
    let took = t0.elapsed();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(err.is_retryable());
    assert!(
        took >= Duration::from_millis(290),
        "gave up early: {took:?}"
    );
    assert!(took < Duration::from_secs(3), "gave up late: {took:?}");
    assert!(g.release().await.unwrap().was_held());
}

/// `Wait::No` makes `acquire` fail with `Busy` on a held lock; `try_acquire` says `None`.
pub async fn no_wait_is_busy(make: &impl MakeClient) {
    let a = make.client(opts().build().unwrap()).await;
    let b = make.client(opts().wait(Wait::No).build().unwrap()).await;
    let k = key("busy");
    let g = a.acquire(&k).await.unwrap();
    let err = b.acquire(&k).await.expect_err("held");
    assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
    assert!(b.try_acquire(&k).await.unwrap().is_none());
    assert!(g.release().await.unwrap().was_held());
    let g = b.acquire(&k).await.expect("free now");
    assert!(g.release().await.unwrap().was_held());
}

/// `with_lock` returns the body's value and releases the lock.
pub async fn with_lock_returns_and_releases(make: &impl MakeClient) {
    let a = make.client(opts().build().unwrap()).await;
    let b = make.client(opts().build().unwrap()).await;
    let k = key("with");
    let b2 = b.clone();
    let k2 = k.clone();
    let v = a
        .with_lock(&k, |lease| async move {
            assert!(lease.is_held());
            assert!(
                b2.try_acquire(&k2).await.unwrap().is_none(),
                "held during the body"
            );
            lease.fence().unwrap_or(0) + 1
        })
        .await
        .unwrap();
    assert!(v >= 1);
    let g = b
        .try_acquire(&k)
        .await
        .unwrap()
        .expect("released after with_lock");
    assert!(g.release().await.unwrap().was_held());
}

/// A panicking body still releases the lock, and the panic reaches the caller.
pub async fn with_lock_releases_on_panic(make: &impl MakeClient) {
    let a = make.client(opts().build().unwrap()).await;
    let b = make.client(opts().build().unwrap()).await;
    let k = key("panic");
    let k2 = k.clone();
    let joined = tokio::spawn(async move {
        a.with_lock(&k2, |_lease| async move {
            panic!("body failed");
        })
        .await
    })
    .await;
    let err = joined.expect_err("the panic must propagate");
    assert!(err.is_panic());
    let g = b
        .try_acquire(&k)
        .await
        .unwrap()
        .expect("released after the panic");
    assert!(g.release().await.unwrap().was_held());
}

async fn eventually_free(c: &LockClient, k: &str, within: Duration) {
    let t0 = Instant::now();
    loop {
        if let Some(g) = c.try_acquire(k).await.unwrap() {
            assert!(g.release().await.unwrap().was_held());
            return;
        }
        assert!(
            t0.elapsed() < within,
            "lock {k} still taken after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Dropping a guard releases the lock in the background, promptly.
pub async fn dropped_guard_is_released(make: &impl MakeClient) {
    let a = make.client(opts().build().unwrap()).await;
    let b = make.client(opts().build().unwrap()).await;
    let k = key("drop");
    let g = a.acquire(&k).await.unwrap();
    let h = g.handle();
    drop(g);
    assert!(!h.is_held());
    assert_eq!(h.ended().await, LeaseEnd::Released);
    eventually_free(&b, &k, Duration::from_secs(2)).await;
}

/// Acquires cancelled at random points leave nothing taken.
pub async fn cancelled_acquire_leaves_nothing(make: &impl MakeClient) {
    let a = make.client(opts().build().unwrap()).await;
    let b = make.client(opts().build().unwrap()).await;
    let k = key("cancel");
    for i in 0..30u64 {
        let budget = Duration::from_micros(i * 37);
        let _ = tokio::time::timeout(budget, a.acquire(&k)).await;
    }
    // Thirty clean-ups in the background, on a CI machine running other servers' tests: within
    // half the 10 s TTL, which a lock left behind would keep to its end.
    eventually_free(&b, &k, Duration::from_secs(5)).await;
}

/// `status` names the holder and its fence, and says free after release.
pub async fn status_reports_holder(make: &impl MakeClient) {
    let a = make.client(opts().build().unwrap()).await;
    let b = make.client(opts().build().unwrap()).await;
    let k = key("status");
    assert!(!b.status(&k).await.unwrap().held);
    let g = a.acquire(&k).await.unwrap();
    let st = b.status(&k).await.unwrap();
    assert!(st.held);
    // The holder's own fence, or (engines that do not record it on their fast path) the
    // highest fence issued so far, which is at least the holder's.
    match (st.fence, st.last_fence, g.fence()) {
        (Some(f), _, held) => assert_eq!(Some(f), held),
        (None, Some(last), Some(held)) => assert!(last >= held, "{last} < {held}"),
        // An engine that cannot give a correct fence gives none, anywhere.
        (None, None, None)
            if matches!(b.backend().capabilities().fencing, Fencing::Unavailable(_)) => {}
        other => panic!("status fences {other:?}"),
    }
    let owner = st.owner.expect("holder label");
    assert!(
        owner.contains(a.owner()),
        "owner {owner:?} does not name {:?}",
        a.owner()
    );
    if b.backend().capabilities().expiring {
        let ttl = st.ttl.expect("an expiring engine reports the TTL");
        assert!(
            ttl <= Duration::from_secs(10) && ttl > Duration::from_secs(5),
            "{ttl:?}"
        );
    }
    assert!(g.release().await.unwrap().was_held());
    assert!(!b.status(&k).await.unwrap().held);
}

/// An operator's forced release frees a held lock for another client (with a higher fence),
/// names the holder it removed, and leaves the old holder unable to release the new holder's
/// lock. A free lock is left alone.
pub async fn force_release_breaks_the_lock(make: &impl MakeClient) {
    let holder = make.client(opts().build().unwrap()).await;
    let breaker = make.client(opts().build().unwrap()).await;
    let next = make.client(opts().build().unwrap()).await;
    let k = key("force");
    assert_eq!(
        breaker.force_release(&k).await.unwrap(),
        None,
        "a free lock"
    );
    let g = holder.try_acquire(&k).await.unwrap().expect("free lock");
    let removed = breaker
        .force_release(&k)
        .await
        .unwrap()
        .expect("the holder was removed");
    assert!(removed.held);
    let owner = removed.owner.expect("the removed holder's label");
    assert!(owner.contains(holder.owner()), "removed {owner:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let g2 = loop {
        if let Some(g2) = next.try_acquire(&k).await.unwrap() {
            break g2;
        }
        assert!(Instant::now() < deadline, "the broken lock never came free");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    if let (Some(old), Some(new)) = (g.fence(), g2.fence()) {
        assert!(new > old, "fence {new} after the broken holder's {old}");
    }
    assert!(
        matches!(g.release().await, Ok(Released::Lost(_)) | Err(_)),
        "the broken holder's release said it still held the lock"
    );
    let st = breaker.status(&k).await.unwrap();
    assert!(
        st.held,
        "the old holder's release freed the new holder's lock"
    );
    assert!(
        st.owner
            .as_deref()
            .is_some_and(|o| o.contains(next.owner())),
        "{st:?}"
    );
    assert_eq!(g2.release().await.unwrap(), Released::Held);
}

/// Without renewal, the local deadline ends the lease: `is_held` turns false, `lost()` fires,
/// and `extend` refuses.
pub async fn local_deadline_ends_lease(make: &impl MakeClient) {
    let ttl = Duration::from_millis(300);
    let a = make
        .client(opts().ttl(ttl).auto_renew(false).build().unwrap())
        .await;
    let k = key("deadline");
    let t0 = Instant::now();
    let g = a.acquire(&k).await.unwrap();
    assert!(
        g.valid_until() <= t0 + ttl,
        "validity counted from after the request was sent"
    );
    let reason = tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("lost fires");
    assert_eq!(reason, LostReason::Expired);
    assert!(
        t0.elapsed() >= Duration::from_millis(280),
        "lost too early: {:?}",
        t0.elapsed()
    );
    assert!(!g.is_held());
    let err = g
        .extend(ttl)
        .await
        .expect_err("an ended lease cannot be extended");
    assert_eq!(err.kind(), ErrorKind::Lost);
    assert!(matches!(g.release().await.unwrap(), Released::Lost(_)));
}

/// The watchdog keeps a short lease alive well past its TTL, and others stay out.
pub async fn watchdog_keeps_lease(make: &impl MakeClient) {
    let a = make
        .client(opts().ttl(Duration::from_millis(300)).build().unwrap())
        .await;
    let b = make.client(opts().build().unwrap()).await;
    let k = key("watchdog");
    let g = a.acquire(&k).await.unwrap();
    let first = g.valid_until();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(g.is_held(), "the watchdog let the lease lapse");
    assert!(g.valid_until() > first, "the deadline never moved");
    match b.try_acquire(&k).await.unwrap() {
        None => assert_eq!(g.release().await.unwrap(), Released::Held),
        // Only if this process stalled longer than the lease between the check above and
        // b's request (a loaded machine; the VM paused): the lease must have ended by then.
        Some(other) => {
            assert!(
                !g.is_held(),
                "b took the lock while a's lease was still held"
            );
            eprintln!("watchdog_keeps_lease: the lease ran out during a stall");
            assert!(other.release().await.unwrap().was_held());
        }
    }
}

/// On expiring engines, an abandoned lease frees after its TTL and the late holder learns it
/// lost; its release never deletes the new holder's lock.
pub async fn expired_lease_is_taken_over(make: &impl MakeClient) {
    let a = make
        .client(
            opts()
                .ttl(Duration::from_millis(200))
                .auto_renew(false)
                .build()
                .unwrap(),
        )
        .await;
    if !a.backend().capabilities().expiring {
        return; // Session engines free a lock when its holder dies, not after a TTL.
    }
    // The waiter's budget covers the slowest expiry: memcached keeps an item the TTL rounded up
    // to a second and two seconds more, on a clock its event loop ticks once a second, late
    // when the server is short of CPU (a CI run with every suite's servers on 2 CPUs saw this
    // 200 ms lease outlast a 3 s budget). The others free it after about 200 ms.
    let b = make
        .client(
            opts()
                .wait_timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        )
        .await;
    let k = key("takeover");
    let g = a.acquire(&k).await.unwrap();
    let t0 = Instant::now();
    let g2 = b.acquire(&k).await.expect("the abandoned lease expires");
    assert!(
        t0.elapsed() >= Duration::from_millis(150),
        "taken over early: {:?}",
        t0.elapsed()
    );
    assert!(!g.is_held());
    assert_eq!(
        g.release().await.unwrap(),
        Released::Lost(LostReason::Expired)
    );
    let st = b.status(&k).await.unwrap();
    // Engines that do not record each holder's fence (a lock on a shared database session)
    // report the highest one issued.
    let same_holder = match st.fence {
        Some(f) => Some(f) == g2.fence(),
        None => st.last_fence >= g2.fence(),
    };
    assert!(
        st.held && same_holder,
        "the stale release touched the new lock: {st:?}"
    );
    assert_eq!(g2.release().await.unwrap(), Released::Held);
}

/// 8 clients × 50 acquisitions around a non-atomic read-modify-write lose no update.
pub async fn mutual_exclusion_counter(make: &impl MakeClient) {
    counter_under_lock(make, 8, 50).await;
}

/// `tasks` clients, each taking the lock `rounds` times around a read → yield → write of a
/// shared counter; any overlap of two holders loses an update.
pub async fn counter_under_lock(make: &impl MakeClient, tasks: u64, rounds: u64) {
    let k = key("counter");
    let counter = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let c = make.client(opts().build().unwrap()).await;
        let (k, counter) = (k.clone(), counter.clone());
        handles.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let g = c.acquire(&k).await.unwrap();
                let v = counter.load(Ordering::SeqCst); // read
                tokio::task::yield_now().await; // let the others run in between
                counter.store(v + 1, Ordering::SeqCst); // write
                assert!(g.release().await.unwrap().was_held());
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    assert_eq!(
        counter.load(Ordering::SeqCst),
        tasks * rounds,
        "lost updates"
    );
}

/// Empty and oversized keys are refused with `InvalidKey` and take nothing.
pub async fn bad_keys_are_refused(make: &impl MakeClient) {
    let a = make.client(opts().build().unwrap()).await;
    for k in [
        String::new(),
        "k".repeat(distlock_core::MAX_KEY_LEN + 1),
        "a\0b".into(),
    ] {
        let e = a.try_acquire(&k).await.expect_err("bad key");
        assert_eq!(e.kind(), ErrorKind::InvalidKey);
        let e = a.acquire(&k).await.expect_err("bad key");
        assert_eq!(e.kind(), ErrorKind::InvalidKey);
        assert_eq!(
            a.status(&k).await.map_err(|e| e.kind()).err(),
            Some(ErrorKind::InvalidKey)
        );
    }
    // The longest accepted key works.
    let long = "k".repeat(distlock_core::MAX_KEY_LEN);
    let g = a.try_acquire(&long).await.unwrap().expect("free");
    assert!(g.release().await.unwrap().was_held());
}
