//! Replicated Redis on real servers: `WAIT` for replicas, and Sentinel following a failover.

use std::time::{Duration, Instant};

use distlock_core::{ErrorKind, LockClient, LockOptions, Released};
use distlock_redis::{RedisBackend, SentinelBackend};
use distlock_testkit::failover::{acquire_within, fences_of};
use distlock_testkit::{RedisServer, Sentinels};

fn opts(ttl: Duration) -> LockOptions {
    LockOptions::builder().ttl(ttl).build().unwrap()
}

async fn redis_client(url: &str) -> LockClient {
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
        .lock("unreplicated-a")
        .options(opts(Duration::from_secs(10)))
        .acquire()
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
    // A second for the replica's acknowledgement: on a loaded machine (tests side by side on
    // two CPUs) 200 ms was sometimes too short for a replica that is there.
    let url = format!("{}?wait_replicas=1&wait_timeout=1s", master.url());
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

/// A fail-over to a replica that had not received the last acquisitions (paused, its link
/// cut, while the master went on alone): the new master's counter is behind, yet every fence
/// after it is above every fence before, for the client that saw them and for a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_rising_across_a_sentinel_fail_over_to_a_replica_that_lagged() {
    let Some(mut master) = RedisServer::start() else {
        return;
    };
    let replica = RedisServer::replica_of(&master).expect("replica");
    let sentinels = Sentinels::start(3, &master).expect("sentinels");
    let url = sentinels.url("");
    let backend = SentinelBackend::connect(&url).await.expect("connect");
    let fence_key = RedisBackend::connect(&master.url())
        .await
        .unwrap()
        .fence_key("lagged");
    let c = LockClient::builder(backend)
        .options(opts(Duration::from_secs(5)))
        .build();
    let mut fences = fences_of(&c, "lagged", 3).await;
    assert_eq!(master.cli(&["WAIT", "1", "2000"]), "1", "replicated so far");

    replica.pause();
    master.cli(&["CLIENT", "KILL", "TYPE", "replica"]);
    fences.extend(fences_of(&c, "lagged", 10).await);
    let top = *fences.iter().max().unwrap();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    let old_port = master.port();
    master.kill();
    replica.resume();
    let new_port = sentinels.wait_for_failover(old_port, Duration::from_secs(20));
    assert_eq!(new_port, replica.port());
    let kept = score(&replica.cli(&["ZSCORE", &fence_key, "f"]));
    assert!(
        kept < top,
        "the promoted replica lagged: its counter is {kept}, the last fence was {top}"
    );

    let g = acquire_within(&c, "lagged", Duration::from_secs(20)).await;
    let after = g.fence().unwrap();
    assert!(after > top, "{after} after {top}");
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let fresh = LockClient::builder(SentinelBackend::connect(&url).await.unwrap())
        .options(opts(Duration::from_secs(5)))
        .build();
    let g = acquire_within(&fresh, "lagged", Duration::from_secs(20)).await;
    assert!(
        g.fence().unwrap() > after,
        "a new client's fence is above too"
    );
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

/// A sorted set's score as redis-cli prints it.
fn score(text: &str) -> u64 {
    text.parse::<f64>()
        .unwrap_or_else(|_| panic!("a score, not {text:?}")) as u64
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

/// A wait budget rides through a fail-over: started as the master dies (the sentinels still
/// name it), an acquire with a budget gets the lock once they name the replica, where
/// `try_acquire` at that moment fails at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_budget_rides_through_a_sentinel_fail_over() {
    let Some(mut master) = RedisServer::start() else {
        return;
    };
    let replica = RedisServer::replica_of(&master).expect("replica");
    let sentinels = Sentinels::start(3, &master).expect("sentinels");
    let url = sentinels.url("?response_timeout=300ms&connect_timeout=300ms");
    let c = LockClient::builder(SentinelBackend::connect(&url).await.expect("connect"))
        .options(opts(Duration::from_secs(5)))
        .build();
    fences_of(&c, "ride", 1).await;
    let old_port = master.port();
    master.kill();
    let t0 = Instant::now();
    let e = c.try_acquire("ride").await.expect_err("the master is gone");
    assert!(e.is_retryable(), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let budget = LockOptions::builder()
        .ttl(Duration::from_secs(5))
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let g = c
        .lock("ride")
        .options(budget)
        .acquire()
        .await
        .expect("rode through");
    assert_eq!(
        sentinels.wait_for_failover(old_port, Duration::from_secs(5)),
        replica.port()
    );
    eprintln!("taken {:?} after the kill", t0.elapsed());
    assert!(g.is_held());
    assert_eq!(g.release().await.unwrap(), Released::Held);
}
