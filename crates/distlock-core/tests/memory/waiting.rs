//! The core's waiting, hand-off, resends and lost signal, tested on the in-memory engine of the
//! test kit (no server): what these show is the core's, since the engine passes the same
//! conformance suite as the real ones (`conformance`). The store counts its requests, so a
//! test can say how many round trips a behaviour costs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use distlock_core::{LockClient, LockOptions, LostReason};
use distlock_testkit::MemoryStore;

fn client(store: &MemoryStore, options: LockOptions) -> LockClient {
    LockClient::builder(store.backend())
        .options(options)
        .build()
}

fn options(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::builder()
        .ttl(ttl)
        .wait_timeout(wait)
        .build()
        .unwrap()
}

/// Eight tasks of one client take one name in turn; the engine requests that cost.
async fn eight_tasks_in_turn(handoff: bool) -> u64 {
    let store = MemoryStore::new();
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(10))
        .wait_timeout(Duration::from_secs(10))
        .handoff(handoff)
        .build()
        .unwrap();
    let c = Arc::new(client(&store, options));
    let inside = Arc::new(AtomicU32::new(0));
    let before = store.requests();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (c, inside) = (c.clone(), inside.clone());
            tokio::spawn(async move {
                let g = c.acquire("in-turn").await.unwrap();
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(g.release().await.unwrap().was_held());
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let requests = store.requests() - before;
    assert!(!c.status("in-turn").await.unwrap().held);
    requests
}

/// Tasks of one client that want one name wait in its local queue, and only its head asks the
/// engine: eight tasks cost eight acquires and eight releases, none refused (no polling). With
/// hand-off on, the lock goes from each task to the next with one renewal instead of a release
/// and an acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_tasks_take_turns_without_polling_the_engine() {
    let requests = eight_tasks_in_turn(false).await;
    assert!(
        requests <= 16,
        "{requests} engine requests for 8 tasks in turn (8 acquires and 8 releases expected)"
    );
    let requests = eight_tasks_in_turn(true).await;
    assert!(
        requests <= 10,
        "{requests} engine requests with hand-off (an acquire, 7 renewals and a release expected)"
    );
}

/// A waiter on another client sleeps until the release event, not until its fallback
/// interval: it holds the lock soon after the holder lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_wakes_at_the_release() {
    let store = MemoryStore::new();
    let holder = client(
        &store,
        options(Duration::from_secs(30), Duration::from_secs(1)),
    );
    let waiter = client(
        &store,
        LockOptions::builder()
            .ttl(Duration::from_secs(30))
            .wait_timeout(Duration::from_secs(20))
            .wake_fallback(Duration::from_secs(10))
            .build()
            .unwrap(),
    );
    let g = holder.acquire("wake").await.unwrap();
    let waiting = tokio::spawn(async move {
        let g = waiter.acquire("wake").await.unwrap();
        (Instant::now(), g)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert!(g.release().await.unwrap().was_held());
    let (got, g) = waiting.await.unwrap();
    let after = got.duration_since(released);
    assert!(
        after < Duration::from_secs(2),
        "took {after:?} after the release"
    );
    assert!(g.release().await.unwrap().was_held());
}

/// A lease the engine no longer has (its key gone: an expiry, a flush) is found at the next
/// renewal and reported lost, with the reason, to the guard's `lost()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_the_engine_dropped_is_reported_lost() {
    let store = MemoryStore::new();
    let c = client(
        &store,
        options(Duration::from_millis(600), Duration::from_secs(1)),
    );
    let g = c.acquire("dropped").await.unwrap();
    store.expire("dropped");
    let reason = tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("the loss is reported within a renewal or two");
    assert!(
        matches!(reason, LostReason::Stolen | LostReason::Expired),
        "{reason:?}"
    );
    assert!(!g.is_held());
}

/// An acquire whose request fails with a connection error (the reply lost) is sent again with
/// the same token, and the engine finds it one holder, not two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_resent_with_the_same_token() {
    let store = MemoryStore::new();
    let c = client(
        &store,
        options(Duration::from_secs(10), Duration::from_secs(1)),
    );
    store.fail_next(1);
    let g = c.acquire("resent").await.unwrap();
    let status = c.status("resent").await.unwrap();
    assert_eq!(status.holders.len(), 1, "{status:?}");
    assert_eq!(
        status.holders[0].token.as_deref(),
        Some(g.token().as_str()),
        "{status:?}"
    );
    assert!(g.release().await.unwrap().was_held());
}
