//! Replicated Redis on real servers: `WAIT` for replicas, and Sentinel following a failover.

use std::time::{Duration, Instant};

use distlock_core::{ErrorKind, LockClient, LockOptions, Released};
use distlock_redis::{RedisBackend, SentinelBackend};
use distlock_testkit::{RedisServer, Sentinels};

fn opts(ttl: Duration) -> LockOptions {
    LockOptions::builder().ttl(ttl).build().unwrap()
}

async fn redis_client(url: &str) -> LockClient<RedisBackend> {
    let backend = RedisBackend::connect(url).await.expect("connect");
    LockClient::builder(backend)
        .options(opts(Duration::from_secs(10)))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_no_replica_acknowledges_fails_and_leaves_no_key() {
    let Some(master) = RedisServer::start() else {
        return;
    };
    let url = format!("{}?wait_replicas=1&wait_timeout=50ms", master.url());
    let c = redis_client(&url).await;
    let backend = RedisBackend::connect(&url).await.unwrap();
    for key in ["unreplicated-a", "unreplicated-b"] {
        let started = Instant::now();
        let e = c
            .try_acquire(key)
            .await
            .expect_err("no replica to acknowledge");
        assert_eq!(
            e.kind(),
            ErrorKind::QuorumNotReached { got: 0, needed: 1 },
            "{e}"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(50),
            "WAIT blocked"
        );
        assert_eq!(master.cli(&["EXISTS", &backend.lock_key(key)]), "0");
    }
    // A waiting acquire takes the script path: the same.
    let e = c
        .acquire_with("unreplicated-a", &opts(Duration::from_secs(10)))
        .await
        .expect_err("no replica");
    assert!(
        matches!(e.kind(), ErrorKind::QuorumNotReached { .. }),
        "{e}"
    );
    assert_eq!(
        master.cli(&["EXISTS", &backend.lock_key("unreplicated-a")]),
        "0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_replica_the_lock_is_copied_before_it_is_reported_and_renewals_wait_too() {
    let Some(master) = RedisServer::start() else {
        return;
    };
    let replica = RedisServer::replica_of(&master).expect("replica");
    let url = format!("{}?wait_replicas=1&wait_timeout=200ms", master.url());
    let c = redis_client(&url).await;
    let backend = RedisBackend::connect(&url).await.unwrap();
    let key = backend.lock_key("copied");
    let g = c.try_acquire("copied").await.unwrap().expect("free");
    // WAIT returned 1: the replica has the lock already (no sleep, no retry).
    assert!(
        !replica.cli(&["GET", &key]).is_empty(),
        "the lock is on the replica"
    );
    g.extend(Duration::from_secs(20)).await.expect("renewed");
    let pttl: i64 = replica.cli(&["PTTL", &key]).parse().unwrap();
    assert!(pttl > 10_000, "the renewal reached the replica: {pttl}");

    // The replica stops answering: a renewal is not acknowledged, so it is not counted.
    replica.pause();
    let e = g
        .extend(Duration::from_secs(20))
        .await
        .expect_err("unacknowledged");
    assert!(
        matches!(e.kind(), ErrorKind::QuorumNotReached { got: 0, needed: 1 }),
        "{e}"
    );
    // And a new lock is not reported, nor left behind.
    let e = c.try_acquire("copied-2").await.expect_err("unacknowledged");
    assert!(
        matches!(e.kind(), ErrorKind::QuorumNotReached { .. }),
        "{e}"
    );
    assert_eq!(master.cli(&["EXISTS", &backend.lock_key("copied-2")]), "0");
    replica.resume();
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

/// Tries `key` until it is taken (errors and "busy" while the failover runs), for `limit`.
async fn acquire_within<B: distlock_core::Backend>(
    c: &LockClient<B>,
    key: &str,
    limit: Duration,
) -> distlock_core::LockGuard<B> {
    let deadline = Instant::now() + limit;
    loop {
        match c.try_acquire(key).await {
            Ok(Some(g)) => return g,
            Ok(None) => panic!("{key} is held by someone else"),
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "no acquire within {limit:?}: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_follows_a_failover_and_a_lock_taken_with_wait_survives_it() {
    let Some(mut master) = RedisServer::start() else {
        return;
    };
    let replicas = [
        RedisServer::replica_of(&master).expect("replica"),
        RedisServer::replica_of(&master).expect("replica"),
    ];
    let sentinels = Sentinels::start(3, &master).expect("sentinels");
    let old_port = master.port();
    assert_eq!(sentinels.master_port(), Some(old_port));

    let waited = SentinelBackend::connect(&sentinels.url("?wait_replicas=1&wait_timeout=500ms"))
        .await
        .expect("connect through the sentinels");
    assert_eq!(waited.master_addr(), format!("127.0.0.1:{old_port}"));
    let plain = SentinelBackend::connect(&sentinels.url("")).await.unwrap();
    let c = LockClient::builder(waited)
        .options(opts(Duration::from_secs(30)))
        .build();
    let other = LockClient::builder(plain.clone())
        .options(opts(Duration::from_secs(30)))
        .build();

    let held = c
        .try_acquire("before-failover")
        .await
        .unwrap()
        .expect("free");
    let fence = held.fence();
    let g = other.try_acquire("plain").await.unwrap().expect("free");
    assert_eq!(g.release().await.unwrap(), Released::Held);

    master.kill();
    let g = acquire_within(&other, "after-failover", Duration::from_secs(20)).await;
    let new_port = sentinels.wait_for_failover(old_port, Duration::from_secs(20));
    assert!(replicas.iter().any(|r| r.port() == new_port));
    assert_eq!(plain.master_addr(), format!("127.0.0.1:{new_port}"));
    assert_eq!(g.release().await.unwrap(), Released::Held);

    // The lock taken before the failover was acknowledged by a replica: the new master has
    // it, under our token, so nobody else can take it and our renewals and release work.
    let status = other.status("before-failover").await.unwrap();
    assert!(status.held, "the new master has the lock");
    assert_eq!(
        status.last_fence, fence,
        "the fence counter came across: {status:?}"
    );
    assert!(
        other
            .try_acquire("before-failover")
            .await
            .unwrap()
            .is_none(),
        "still exclusive after the failover"
    );
    // With WAIT(1), renewals on the new master need its remaining replica to have resynced.
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = held.extend(Duration::from_secs(30)).await {
        assert!(
            Instant::now() < deadline,
            "never renewed on the new master: {e}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(held.is_held());
    assert_eq!(held.release().await.unwrap(), Released::Held);
    assert!(!other.status("before-failover").await.unwrap().held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_errors_are_clear() {
    let Some(master) = RedisServer::start() else {
        return;
    };
    let sentinels = Sentinels::start(1, &master).expect("sentinel");
    let url = sentinels
        .url("")
        .replace(distlock_testkit::MASTER_NAME, "nobody");
    let e = SentinelBackend::connect(&url)
        .await
        .expect_err("unknown master");
    assert_eq!(e.kind(), ErrorKind::Connection);
    assert!(e.to_string().contains("does not know a master"), "{e}");
    let port = distlock_testkit::free_port();
    let e = SentinelBackend::connect(&format!("redis+sentinel://127.0.0.1:{port}/m"))
        .await
        .expect_err("nobody listens");
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
}
