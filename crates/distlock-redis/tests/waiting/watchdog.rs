//! The watchdog and the lost signal, on a real redis-server: a lease renewed through a hold
//! five times its TTL, renewals in one batch answered lock by lock, none sent after a release,
//! and a lease lost by its deadline while the server is stopped or at the next renewal after
//! an external `DEL`.

use std::time::{Duration, Instant};

use distlock_core::engine::{BatchRenew, LeaseCheck, LeaseKind, LeaseRef, RenewItem};
use distlock_core::{LostReason, Released};
use distlock_testkit::RedisServer;

use super::common::{client, redis, ttl};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_by_the_local_deadline_while_redis_is_stopped() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let c = client(&server, ttl(900).build().unwrap()).await;
    let g = c.acquire("frozen").await.unwrap();
    server.pause();
    let deadline = g.valid_until();
    let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost() fired while the server was stopped");
    let now = Instant::now();
    server.resume();
    assert_eq!(reason, LostReason::Unreachable);
    assert!(!g.is_held());
    assert!(now >= deadline, "declared lost before the deadline");
    assert!(
        now <= deadline + Duration::from_millis(100),
        "declared lost {:?} after the deadline",
        now - deadline
    );
    assert!(matches!(g.release().await.unwrap(), Released::Lost(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_del_is_reported_stolen_at_the_next_renewal() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let c = client(&server, ttl(3000).build().unwrap()).await;
    let g = c.acquire("deleted").await.unwrap();
    let key = redis(&c).lock_key("deleted");
    let t0 = Instant::now();
    assert_eq!(server.cli(&["DEL", &key]), "1");
    let reason = tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("lost() fired");
    assert_eq!(reason, LostReason::Stolen);
    // The renew interval is 1 s: found at the next renewal, well before the 3 s lease ends.
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );
    assert!(!g.is_held());
    assert_eq!(
        g.release().await.unwrap(),
        Released::Lost(LostReason::Stolen)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_survives_a_5s_hold_with_a_1s_ttl() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let c = client(&server, ttl(1000).build().unwrap()).await;
    let g = c.acquire("long").await.unwrap();
    let key = redis(&c).lock_key("long");
    let fence = g.fence();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        assert!(g.is_held(), "lost after {:?}", t0.elapsed());
        let pttl: i64 = server.cli(&["PTTL", &key]).parse().unwrap();
        assert!(pttl > 0, "the key ran out after {:?}", t0.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(g.fence(), fence);
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_renewal_is_sent_after_release() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let opts = ttl(300)
        .renew_interval(Duration::from_millis(15))
        .build()
        .unwrap();
    let c = client(&server, opts).await;
    let mut renewed = 0;
    for i in 0..30 {
        let g = c.acquire("quiet").await.unwrap();
        let before = server.calls("pexpire");
        // Let renewals run, and release at varying points of the renewal cycle.
        tokio::time::sleep(Duration::from_millis(40 + i % 7)).await;
        renewed += server.calls("pexpire") - before;
        assert_eq!(g.release().await.unwrap(), Released::Held);
        let after_release = server.calls("evalsha");
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(
            server.calls("evalsha"),
            after_release,
            "a command went out after release() returned (cycle {i})"
        );
    }
    assert!(renewed >= 30, "the watchdog hardly ran: {renewed} renewals");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_renewals_answer_each_lock_in_order() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let c = client(&server, ttl(30_000).auto_renew(false).build().unwrap()).await;
    let a = c.acquire("b1").await.unwrap();
    let b = c.acquire("b2").await.unwrap();
    let gone = distlock_core::Token::generate();
    let (ta, tb) = (a.token(), b.token());
    server.cli(&["SET", &redis(&c).lock_key("b3"), "theirs", "PX", "60000"]);
    let item = |name, token| {
        RenewItem::new(
            LeaseRef::new(name, token, LeaseKind::Exclusive),
            Duration::from_secs(60),
        )
    };
    let items = [
        item("b1", &ta),
        item("b9", &gone),
        item("b3", &gone),
        item("b2", &tb),
    ];
    // After a script flush too: the pipeline reloads the script and resends.
    server.cli(&["SCRIPT", "FLUSH"]);
    let out: Vec<LeaseCheck> = redis(&c)
        .renew_many(&items)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        out,
        vec![
            LeaseCheck::Ours,
            LeaseCheck::Missing,
            LeaseCheck::Foreign,
            LeaseCheck::Ours
        ]
    );
    let pttl: i64 = server
        .cli(&["PTTL", &redis(&c).lock_key("b1")])
        .parse()
        .unwrap();
    assert!(pttl > 30_000, "not renewed: {pttl}");
    assert_eq!(a.release().await.unwrap(), Released::Held);
    assert_eq!(b.release().await.unwrap(), Released::Held);
}
