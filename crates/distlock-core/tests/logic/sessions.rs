//! The lost signal from an engine's sessions: every lease on a session that ends hears it at
//! once, a lease that left the session does not, and one moved by an `extend` hears its new
//! session's end.

use super::*;

#[tokio::test]
async fn an_engine_that_tells_of_a_loss_ends_the_lease_at_once() {
    let end = SessionEnd::new();
    let mut fake = Fake::new();
    fake.loss = Some(end.clone());
    let client = LockClient::builder(FakeEngine(Arc::new(fake)))
        .options(ttl_opts(60_000).build().unwrap())
        .build();
    let g = client.try_acquire("k").await.unwrap().expect("free");
    let other = client.try_acquire("k2").await.unwrap().expect("free");
    let moved = client.try_acquire("moved").await.unwrap().expect("free");
    assert!(g.is_held());
    // The engine says so (a ZooKeeper session suspended): no renewal is due for 20 s.
    end.end(LostReason::Unreachable);
    let reason = tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("lost fires at once");
    assert_eq!(reason, LostReason::Unreachable);
    assert!(!g.is_held());
    assert!(matches!(g.release().await.unwrap(), Released::Lost(_)));
    assert!(!other.is_held(), "every lease on the session hears it");
    // The engine says the lease had left the session: it is still held.
    assert!(moved.is_held());
    assert!(matches!(moved.release().await.unwrap(), Released::Held));
}

/// A renewal to a longer TTL that moves the lease to another session (etcd's shared session
/// of that TTL): the lease hears the new session's end, and no longer the old one's.
#[tokio::test]
async fn a_lease_extended_onto_another_session_hears_that_session_end() {
    let first = SessionEnd::new();
    let mut fake = Fake::new();
    fake.loss = Some(first.clone());
    let fake = Arc::new(fake);
    let client = LockClient::builder(FakeEngine(fake.clone()))
        .options(ttl_opts(60_000).build().unwrap())
        .build();
    let stays = client.try_acquire("stays").await.unwrap().expect("free");
    let g = client.try_acquire("k").await.unwrap().expect("free");
    g.extend(Duration::from_secs(120)).await.unwrap();
    first.end(LostReason::Unreachable);
    let reason = tokio::time::timeout(Duration::from_secs(2), stays.lost())
        .await
        .expect("the lease left on the first session hears its end");
    assert_eq!(reason, LostReason::Unreachable);
    assert!(g.is_held(), "the moved lease does not");
    fake.longer.end(LostReason::Stolen);
    let reason = tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("the moved lease hears the end of the session it is on now");
    assert_eq!(reason, LostReason::Stolen);
}

/// The same when the renewal that moved the lease then failed (etcd moves the key, then its
/// keep-alive of the new session fails): the lease is watched where it is now.
#[tokio::test]
async fn a_lease_moved_by_a_failed_extend_hears_its_new_session_end() {
    let mut fake = Fake::new();
    fake.loss = Some(SessionEnd::new());
    let fake = Arc::new(fake);
    let client = LockClient::builder(FakeEngine(fake.clone()))
        .options(ttl_opts(60_000).build().unwrap())
        .build();
    let g = client.try_acquire("k").await.unwrap().expect("free");
    *fake.renew.lock().unwrap() = Renew::Fail;
    assert!(g.extend(Duration::from_secs(120)).await.is_err());
    *fake.renew.lock().unwrap() = Renew::Ok;
    fake.longer.end(LostReason::Stolen);
    let reason = tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("the moved lease hears the end of the session it is on now");
    assert_eq!(reason, LostReason::Stolen);
}
