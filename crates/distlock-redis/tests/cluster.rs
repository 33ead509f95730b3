//! A three-master Redis Cluster of real servers: locks in different slots, renewals across
//! slots, and hand-overs whose wake-up crosses nodes.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use distlock_core::{LockClient, LockOptions, Released};
use distlock_redis::RedisBackend;
use distlock_testkit::RedisCluster;
use distlock_testkit::failover::{acquire_within, fences_of};

async fn client(url: &str, ttl: Duration) -> (LockClient, RedisBackend) {
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

/// A master fail-over to a replica that had not received the last acquisitions (paused, its
/// link cut, while the master went on alone): the promoted replica's counter is behind, yet
/// every fence after it is above every fence before, for the client that saw them and for a
/// new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_rising_across_a_fail_over_to_a_replica_that_lagged() {
    let Some(mut cluster) = RedisCluster::start_with_replicas(3, 1) else {
        return;
    };
    let url = cluster.url("");
    let (c, backend) = client(&url, Duration::from_secs(5)).await;
    let key = "orders";
    let fence_key = backend.fence_key(key);
    let mut fences = fences_of(&c, key, 3).await;
    let m = cluster.index_for(&fence_key);
    let r = *cluster.replicas_of(m).first().expect("a replica");
    assert_eq!(
        cluster.nodes()[m].cli(&["WAIT", "1", "2000"]),
        "1",
        "replicated so far"
    );

    cluster.nodes()[r].pause();
    cluster.nodes()[m].cli(&["CLIENT", "KILL", "TYPE", "replica"]);
    fences.extend(fences_of(&c, key, 10).await);
    let top = *fences.iter().max().unwrap();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    cluster.node_mut(m).kill();
    cluster.nodes()[r].resume();
    cluster.wait_for_promotion(r, Duration::from_secs(30));
    let kept = cluster.nodes()[r].cli(&["ZSCORE", &fence_key, "f"]);
    let kept = kept
        .parse::<f64>()
        .unwrap_or_else(|_| panic!("a score, not {kept:?}")) as u64;
    assert!(
        kept < top,
        "the promoted replica lagged: its counter is {kept}, the last fence was {top}"
    );

    let g = acquire_within(&c, key, Duration::from_secs(30)).await;
    let after = g.fence().unwrap();
    assert!(after > top, "{after} after {top}");
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let (fresh, _) = client(&url, Duration::from_secs(5)).await;
    let g = acquire_within(&fresh, key, Duration::from_secs(30)).await;
    assert!(
        g.fence().unwrap() > after,
        "a new client's fence is above too"
    );
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

/// A wait budget rides through a master fail-over: started as the lock's master dies, an
/// acquire with a budget gets the lock once its replica has taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_budget_rides_through_a_cluster_fail_over() {
    let Some(mut cluster) = RedisCluster::start_with_replicas(3, 1) else {
        return;
    };
    let url = cluster.url("?response_timeout=300ms&connect_timeout=300ms");
    let (c, backend) = client(&url, Duration::from_secs(5)).await;
    let key = "jobs";
    fences_of(&c, key, 1).await;
    let m = cluster.index_for(&backend.lock_key(key));
    let r = *cluster.replicas_of(m).first().expect("a replica");
    cluster.node_mut(m).kill();
    let t0 = Instant::now();
    let budget = LockOptions::builder()
        .ttl(Duration::from_secs(5))
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let g = c
        .lock(key)
        .options(budget)
        .acquire()
        .await
        .expect("rode through");
    eprintln!("taken {:?} after the kill", t0.elapsed());
    assert_eq!(
        cluster.index_for(&backend.lock_key(key)),
        r,
        "on the promoted replica"
    );
    assert!(g.is_held());
    assert_eq!(g.release().await.unwrap(), Released::Held);
}
