//! Waking waiters, on a real redis-server: a release wakes a waiter at once, keyspace
//! notifications wake it on a foreign `DEL` (and the fallback cap bounds the wait without them),
//! only the head of the local queue asks the server, and a subscription lingers between waits,
//! then goes, with nothing left behind by a dropped acquire.

use std::time::{Duration, Instant};

use distlock_core::{LockClient, Released};
use distlock_redis::RedisBackend;
use distlock_testkit::RedisServer;

use super::common::{calls, client, event_only, redis, spawn_acquire, ttl};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_at_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    release_wakes_a_waiter_at_once(&server, &server.url(), "").await;
}

/// The pub/sub connection logs in and listens in the URL's database like the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_at_once_with_a_password_in_database_3() {
    let Some(server) = RedisServer::start_with(&["--requirepass", "s3cret"]) else {
        return;
    };
    let url = format!("redis://:s3cret@127.0.0.1:{}/3", server.port());
    release_wakes_a_waiter_at_once(&server, &url, "3").await;
}

async fn release_wakes_a_waiter_at_once(server: &RedisServer, url: &str, db: &str) {
    // A long lease and a long fallback: only the release event can wake the waiter early.
    let opts = event_only(10);
    let connect = || async {
        let backend = RedisBackend::connect(url).await.expect("connect");
        LockClient::builder(backend).options(opts).build()
    };
    let holder = connect().await;
    let waiter = connect().await;
    let g = holder.acquire("evt").await.unwrap();
    let channel = redis(&waiter).wake_channel();
    let keyspace = format!(
        "__keyspace@{}__:{}",
        if db.is_empty() { "0" } else { db },
        redis(&waiter).lock_key("evt")
    );
    let w = tokio::spawn(async move {
        let g = waiter.acquire("evt").await.unwrap();
        let at = Instant::now();
        assert_eq!(g.release().await.unwrap(), Released::Held);
        at
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    for chan in [&channel, &keyspace] {
        assert_eq!(
            server.cli(&["PUBSUB", "NUMSUB", chan]),
            format!("{chan}\n1"),
            "the waiter subscribed"
        );
    }
    let released = Instant::now();
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let got = tokio::time::timeout(Duration::from_secs(5), w)
        .await
        .unwrap()
        .unwrap();
    assert!(
        got.duration_since(released) < Duration::from_millis(100),
        "woke {:?} after the release",
        got.duration_since(released)
    );
}

/// Another client's plain lock (no publish on release) is deleted while a distlock client
/// waits: how long after the `DEL` did the waiter get the lock?
async fn wake_after_foreign_del(server: &RedisServer, fallback: Duration) -> Duration {
    let opts = ttl(30_000).wake_fallback(fallback).build().unwrap();
    let c = client(server, opts).await;
    let key = redis(&c).lock_key("foreign");
    assert_eq!(
        server.cli(&["SET", &key, "theirs", "NX", "PX", "60000"]),
        "OK"
    );
    let w = tokio::spawn(async move {
        let g = c.acquire("foreign").await.unwrap();
        let at = Instant::now();
        assert_eq!(g.release().await.unwrap(), Released::Held);
        at
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let deleted = Instant::now();
    assert_eq!(server.cli(&["DEL", &key]), "1");
    let got = tokio::time::timeout(Duration::from_secs(5), w)
        .await
        .unwrap()
        .unwrap();
    got.duration_since(deleted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_del_wakes_a_waiter_within_the_fallback_cap() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // Keyspace events are off: only the fallback cap bounds the wait.
    let after = wake_after_foreign_del(&server, Duration::from_millis(300)).await;
    assert!(
        after <= Duration::from_millis(300 + 100),
        "woke {after:?} after a foreign DEL, with a 300 ms cap"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyspace_notifications_wake_a_waiter_on_a_foreign_del() {
    let Some(server) = RedisServer::start_with(&["--notify-keyspace-events", "Kgx"]) else {
        return;
    };
    let after = wake_after_foreign_del(&server, Duration::from_secs(10)).await;
    assert!(
        after < Duration::from_millis(200),
        "woke {after:?} after a foreign DEL with keyspace events on"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_acquire_mid_wait_leaves_no_residue() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let opts = ttl(30_000).build().unwrap();
    let holder = client(&server, opts).await;
    let waiter = client(&server, opts).await;
    let g = holder.acquire("residue").await.unwrap();
    // The per-lock channel (keyspace events); the waiter's own wake channel is per client and
    // lives as long as the client.
    let channel = format!("__keyspace@0__:{}", redis(&holder).lock_key("residue"));
    let wake_channel = redis(&waiter).wake_channel();
    for _ in 0..3 {
        let gave_up =
            tokio::time::timeout(Duration::from_millis(300), waiter.acquire("residue")).await;
        assert!(gave_up.is_err(), "the lock was held");
    }
    // The subscription goes a second or so after the last waiter (it lingers for the next).
    let t0 = Instant::now();
    loop {
        let subs = server.cli(&["PUBSUB", "NUMSUB", &channel]);
        if subs == format!("{channel}\n0") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "still subscribed: {subs}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(server.cli(&["PUBSUB", "CHANNELS"]), wake_channel);
    // Only the held lock and its metadata exist.
    let mut keys: Vec<String> = server
        .cli(&["KEYS", "*"])
        .lines()
        .map(str::to_owned)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        vec![
            redis(&holder).lock_key("residue"),
            redis(&holder).fence_key("residue"),
        ]
    );
    assert!(
        server
            .cli(&["GET", &redis(&holder).lock_key("residue")])
            .starts_with(&format!("{} ", g.token().as_str()))
    );
    // And the waiter's local queue is clean: the next acquire is not stuck behind ghosts.
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let again = tokio::time::timeout(Duration::from_secs(1), waiter.acquire("residue"))
        .await
        .expect("not stuck")
        .unwrap();
    assert_eq!(again.release().await.unwrap(), Released::Held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_head_of_the_local_queue_asks_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let opts = ttl(30_000).build().unwrap();
    let holder = client(&server, opts).await;
    let waiters = client(&server, opts).await;
    let g = holder.acquire("hot").await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let c = waiters.clone();
        tasks.push(tokio::spawn(async move {
            let g = c.acquire("hot").await.unwrap();
            assert_eq!(g.release().await.unwrap(), Released::Held);
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = server.calls("evalsha");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let during = server.calls("evalsha") - before;
    // One head, woken by the 1 s fallback at most twice: not 50 pollers.
    assert!(during <= 4, "{during} scripts while 50 local tasks waited");
    let before = server.calls("evalsha");
    assert_eq!(g.release().await.unwrap(), Released::Held);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .unwrap()
            .unwrap();
    }
    // 1 release + 50 × (acquire + release), plus a few attempts that lost a race.
    let used = server.calls("evalsha") - before;
    assert!(used <= 101 + 5, "{used} scripts for 50 acquisitions");
}

/// A client that takes turns on a lock stops waiting at each acquisition and waits again soon
/// after: its subscription to the lock's channel stays between the two waits instead of being
/// closed and reopened (an `UNSUBSCRIBE`, a `leave` script and a `SUBSCRIBE` per turn), and it
/// goes about a second after the last wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_lingers_between_waits_and_then_goes() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let opts = event_only(10);
    let a = client(&server, opts).await;
    let b = client(&server, opts).await;
    let channel = format!("__keyspace@0__:{}", redis(&a).lock_key("linger"));
    let mut g = a.acquire("linger").await.unwrap();
    let mut subscribes = None;
    for turn in 0..6 {
        // The other client waits while this one holds, and gets the lock at its release.
        let waiter = if turn % 2 == 0 { &b } else { &a };
        let w = spawn_acquire(waiter, "linger");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(g.release().await.unwrap(), Released::Held, "turn {turn}");
        g = tokio::time::timeout(Duration::from_secs(2), w)
            .await
            .expect("handed over at once")
            .unwrap();
        if turn == 1 {
            // Both clients have waited once: each channel is subscribed.
            subscribes = Some(calls(&server, "subscribe"));
        }
    }
    assert_eq!(
        Some(calls(&server, "subscribe")),
        subscribes,
        "a client subscribed again between its waits"
    );
    assert_eq!(
        calls(&server, "unsubscribe"),
        0,
        "a client unsubscribed between its waits"
    );
    assert_eq!(
        server.cli(&["PUBSUB", "NUMSUB", &channel]),
        format!("{channel}\n2")
    );
    assert_eq!(g.release().await.unwrap(), Released::Held);
    // Nobody waits any more: both subscriptions go, a second or so later.
    let t0 = Instant::now();
    while server.cli(&["PUBSUB", "NUMSUB", &channel]) != format!("{channel}\n0") {
        assert!(t0.elapsed() < Duration::from_secs(3), "still subscribed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(t0.elapsed() > Duration::from_millis(500), "gone at once");
    assert_eq!(calls(&server, "unsubscribe"), 2);
}
