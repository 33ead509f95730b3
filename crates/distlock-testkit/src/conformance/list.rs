//! The conformance case of listing: an engine that can list shows every lock held or waited
//! for under a prefix, of every kind it holds, and nothing else; one that cannot says why.

use std::collections::BTreeMap;
use std::time::Duration;

use distlock_core::engine::LeaseKind;
use distlock_core::{ErrorKind, LockClient, LockGuard, LockStatus};

use super::{MakeClient, key, opts};

/// The listing of `prefix` as a map from name to status (every status read must succeed).
async fn listed(c: &LockClient, prefix: &str) -> BTreeMap<String, LockStatus> {
    let listing = c.list(prefix, 100).await.expect("list");
    assert!(!listing.more, "a short listing said there is more");
    listing
        .locks
        .into_iter()
        .map(|l| (l.name, l.status.expect("a listed lock's status")))
        .collect()
}

/// Held locks of each kind the engine holds, and a queued waiter, are listed with their
/// holders; a released lock and one outside the prefix are not; `--limit` bounds the listing.
pub async fn listing_shows_what_is_held(make: &impl MakeClient) {
    let o = opts().build().unwrap();
    let (a, b) = (make.client(o).await, make.client(o).await);
    let caps = a.backend().capabilities();
    if a.backend().lister().is_none() {
        let e = a
            .list("", 10)
            .await
            .expect_err("an engine without a lister listed");
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        assert!(
            e.to_string()
                .split_once(": ")
                .is_some_and(|(_, r)| r.len() > 10),
            "the refusal does not say why: {e}"
        );
        return;
    }
    let p = key("list");
    let name = |what: &str| format!("{p}-{what}");
    let mut guards: Vec<LockGuard> = Vec::new();
    let mutex = a.acquire(&name("mutex")).await.unwrap();
    // A waiter for the mutex, from another client.
    let waiting = {
        let (b, k) = (b.clone(), name("mutex"));
        tokio::spawn(async move {
            b.lock(&k)
                .wait_timeout(Duration::from_secs(20))
                .acquire()
                .await
        })
    };
    let mut expected = BTreeMap::from([(name("mutex"), (LeaseKind::Exclusive, 1))]);
    if caps.supports(LeaseKind::Shared) {
        guards.push(a.read_lock(&name("rw")).acquire().await.unwrap().into());
        guards.push(b.read_lock(&name("rw")).acquire().await.unwrap().into());
        expected.insert(name("rw"), (LeaseKind::Shared, 2));
    }
    let permits = LeaseKind::Permit { permits: 3 };
    if caps.supports(permits) {
        guards.push(a.semaphore(&name("sem"), 3).acquire().await.unwrap().into());
        expected.insert(name("sem"), (permits, 1));
    }
    // Released, and outside the prefix: neither is listed.
    let gone = a.acquire(&name("gone")).await.unwrap();
    assert!(gone.release().await.unwrap().was_held());
    let outside = a.acquire(&key("other")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;

    let shown = listed(&b, &p).await;
    assert_eq!(
        shown.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "{shown:#?}"
    );
    // The file engine's shared flock does not tell its holders apart.
    let counted = a.backend().name() != "file";
    for (n, (kind, holders)) in &expected {
        let st = &shown[n];
        assert!(st.held, "{n}: {st:?}");
        assert!(st.holders.iter().all(|h| h.kind == *kind), "{n}: {st:?}");
        if counted {
            assert_eq!(st.holders.len(), *holders, "{n}: {st:?}");
        }
    }
    let m = &shown[&name("mutex")];
    // As `status` reads it: the holder's fence, or (taken on a fast path that does not
    // record it) at most the last one issued.
    match (m.fence, mutex.fence().filter(|f| *f > 0)) {
        (Some(shown), own) => assert_eq!(Some(shown), own, "{m:?}"),
        (None, Some(own)) => assert!(m.last_fence >= Some(own), "{m:?}"),
        (None, None) => {}
    }
    if let Some(owner) = m.owner.as_deref() {
        assert!(owner.contains(a.owner()), "{owner:?}");
    }
    if caps.ordered {
        assert_eq!(m.waiters, Some(1), "the queued waiter: {m:?}");
    }
    // The limit bounds the listing, and says so.
    let one = b.list(&p, 1).await.unwrap();
    assert_eq!(one.locks.len(), 1);
    assert_eq!(one.more, expected.len() > 1, "{one:?}");
    assert_eq!(
        b.list(&p, 0).await.expect_err("a zero limit").kind(),
        ErrorKind::Config
    );

    assert!(mutex.release().await.unwrap().was_held());
    let next = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the waiter got the mutex")
        .unwrap()
        .expect("the waiter got the mutex");
    assert!(next.release().await.unwrap().was_held());
    for g in guards {
        assert!(g.release().await.unwrap().was_held());
    }
    assert!(outside.release().await.unwrap().was_held());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(listed(&a, &p).await.is_empty(), "released locks are listed");
}
