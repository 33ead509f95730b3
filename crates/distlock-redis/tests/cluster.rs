//! A three-master Redis Cluster of real servers: locks in different slots, renewals across
//! slots, and hand-overs whose wake-up crosses nodes.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use distlock_core::{LockClient, LockOptions, Released};
use distlock_redis::RedisBackend;
use distlock_testkit::RedisCluster;

async fn client(url: &str, ttl: Duration) -> (LockClient<RedisBackend>, RedisBackend) {
    let backend = RedisBackend::connect(url).await.expect("connect");
    let c = LockClient::builder(backend.clone())
        .options(LockOptions::builder().ttl(ttl).build().unwrap())
        .build();
    (c, backend)
}

const KEYS: [&str; 8] = [
    "orders", "invoices", "users", "carts", "stock", "mail", "audit", "jobs",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_in_different_slots_live_on_their_own_masters_with_their_counters() {
    let Some(cluster) = RedisCluster::start(3) else {
        return;
    };
    let url = cluster.url("");
    let (a, backend) = client(&url, Duration::from_secs(10)).await;
    let (b, _) = client(&url, Duration::from_secs(10)).await;
    let mut ports = HashSet::new();
    let mut guards = Vec::new();
    for key in KEYS {
        let g = a.try_acquire(key).await.unwrap().expect("free");
        let lock_key = backend.lock_key(key);
        let node = cluster.node_for(&lock_key);
        ports.insert(node.port());
        assert!(
            !node.cli(&["GET", &lock_key]).is_empty(),
            "{key} is on its slot's master"
        );
        // The fence counter is in the same slot, so on the same node.
        assert_eq!(cluster.node_for(&backend.meta_key(key)).port(), node.port());
        let status = b.status(key).await.unwrap();
        assert!(status.held);
        assert_eq!(status.last_fence, g.fence());
        assert!(
            b.try_acquire(key).await.unwrap().is_none(),
            "{key} is exclusive"
        );
        guards.push(g);
    }
    assert_eq!(ports.len(), 3, "the keys are spread over all three masters");
    for g in guards {
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
    for key in KEYS {
        let g = b.try_acquire(key).await.unwrap().expect("released");
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_renews_locks_in_every_slot() {
    let Some(cluster) = RedisCluster::start(3) else {
        return;
    };
    let (a, backend) = client(&cluster.url(""), Duration::from_millis(600)).await;
    let mut guards = Vec::new();
    for key in KEYS {
        guards.push(a.try_acquire(key).await.unwrap().expect("free"));
    }
    // Several TTLs: only renewals (one pipeline per slot, per tick) keep them.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    for (key, g) in KEYS.iter().zip(&guards) {
        assert!(g.is_held(), "{key} was renewed");
        let lock_key = backend.lock_key(key);
        let pttl: i64 = cluster
            .node_for(&lock_key)
            .cli(&["PTTL", &lock_key])
            .parse()
            .unwrap();
        assert!(pttl > 0, "{key} is still on its master: {pttl}");
    }
    for g in guards {
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_a_waiter_whose_wake_up_crosses_nodes() {
    let Some(cluster) = RedisCluster::start(3) else {
        return;
    };
    let url = cluster.url("");
    let (a, backend) = client(&url, Duration::from_secs(10)).await;
    let (b, _) = client(&url, Duration::from_secs(10)).await;
    // A lock whose slot is not on the seed node, where waiters listen.
    let seed = cluster.nodes()[0].port();
    let key = KEYS
        .iter()
        .find(|k| cluster.node_for(&backend.lock_key(k)).port() != seed)
        .expect("a key on another node");
    for round in 0..5 {
        let held = a.try_acquire(key).await.unwrap().expect("free");
        let waiter = {
            let b = b.clone();
            let key = key.to_string();
            tokio::spawn(async move {
                let g = b.acquire(&key).await.expect("handed over");
                let at = Instant::now();
                assert_eq!(g.release().await.unwrap(), Released::Held);
                at
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let released = Instant::now();
        assert_eq!(held.release().await.unwrap(), Released::Held);
        let got = waiter.await.unwrap();
        let waited = got.duration_since(released);
        // The waiter's fallback poll is 1 s: only the release's message wakes it this soon.
        assert!(
            waited < Duration::from_millis(300),
            "round {round}: the waiter took the lock {waited:?} after the release"
        );
    }
    // Each release handed the lock over on the waiter's sharded channel in the lock's slot.
    let node = cluster.node_for(&backend.lock_key(key));
    assert!(node.calls("spublish") >= 5, "{:?}", node.commandstats());
    assert_eq!(node.calls("publish"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_or_refusing_cluster_is_a_clear_error() {
    use distlock_core::ErrorKind;
    let port = distlock_testkit::free_port();
    let e = RedisBackend::connect(&format!(
        "redis+cluster://127.0.0.1:{port}?connect_timeout=300ms"
    ))
    .await
    .expect_err("nobody listens");
    assert!(
        matches!(e.kind(), ErrorKind::Connection | ErrorKind::Timeout),
        "{e}"
    );
    // A plain server is not a Cluster.
    let Some(plain) = distlock_testkit::RedisServer::start() else {
        return;
    };
    let e = RedisBackend::connect(&format!("redis+cluster://127.0.0.1:{}", plain.port()))
        .await
        .expect_err("not a Cluster");
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
    assert!(e.to_string().contains("cluster support disabled"), "{e}");
}

/// `rediss+cluster://`: nodes that speak TLS to clients and on their bus, demanding client
/// certificates; locks in several slots (so on several nodes, found through `CLUSTER SLOTS`
/// over TLS), and a waiter woken across nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls() {
    let pki = distlock_testkit::Pki::generate();
    let Some(cluster) = RedisCluster::start_tls(3, &pki) else {
        return;
    };
    let url = cluster.url(&format!(
        "?tls_ca={}&tls_cert={}&tls_key={}",
        pki.ca.display(),
        pki.client.cert.display(),
        pki.client.key.display()
    ));
    assert!(url.starts_with("rediss+cluster://"), "{url}");
    let (a, _) = client(&url, Duration::from_secs(10)).await;
    let (b, _) = client(&url, Duration::from_secs(10)).await;
    for name in ["tls-a", "tls-b", "tls-c", "tls-d", "tls-e"] {
        let g = a.try_acquire(name).await.unwrap().expect("free");
        assert!(g.fence().is_some());
        assert!(b.try_acquire(name).await.unwrap().is_none());
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
    let held = a.acquire("tls-wake").await.unwrap();
    let waiter = tokio::spawn(async move { b.acquire("tls-wake").await.map(|g| g.fence()) });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(held.release().await.unwrap(), Released::Held);
    let fence = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken")
        .unwrap()
        .unwrap();
    assert!(fence.is_some());
}
