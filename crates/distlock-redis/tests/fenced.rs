//! Fenced writes on the protected resource: a holder paused past its TTL writes after a newer
//! holder did, and the write is refused.

use std::time::Duration;

use distlock_core::{LockClient, LockOptions, Released};
use distlock_redis::{RedisBackend, fenced_get, fenced_set};
use distlock_testkit::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_s_fenced_write_is_refused() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let ttl = Duration::from_millis(300);
    let old = LockClient::builder(RedisBackend::connect(&server.url()).await.unwrap())
        .options(
            LockOptions::builder()
                .ttl(ttl)
                .auto_renew(false)
                .build()
                .unwrap(),
        )
        .build();
    let new = LockClient::new(RedisBackend::connect(&server.url()).await.unwrap());
    let mut data = redis::Client::open(server.url().as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();

    let g1 = old.acquire("report").await.unwrap();
    let f1 = g1.fence().unwrap();
    assert!(
        fenced_set(&mut data, "report:data", f1, "v1")
            .await
            .unwrap()
    );
    // The old holder pauses past its TTL; a new holder takes the lock and writes.
    tokio::time::sleep(ttl * 2).await;
    let g2 = new.acquire("report").await.unwrap();
    let f2 = g2.fence().unwrap();
    assert!(f2 > f1);
    assert!(
        fenced_set(&mut data, "report:data", f2, "v2")
            .await
            .unwrap()
    );
    // The old holder wakes and writes: refused, and the new value stays.
    assert!(
        !fenced_set(&mut data, "report:data", f1, "stale")
            .await
            .unwrap()
    );
    assert_eq!(
        fenced_get(&mut data, "report:data").await.unwrap(),
        Some((b"v2".to_vec(), f2))
    );
    // The same fence may write again; big fences compare as numbers, not as doubles.
    assert!(
        fenced_set(&mut data, "report:data", f2, "v3")
            .await
            .unwrap()
    );
    let big = (1u64 << 60) + 1;
    assert!(fenced_set(&mut data, "big", big, "a").await.unwrap());
    assert!(!fenced_set(&mut data, "big", big - 1, "b").await.unwrap());
    assert!(fenced_set(&mut data, "big", u64::MAX, "c").await.unwrap());
    assert!(!fenced_set(&mut data, "big", 9, "d").await.unwrap());
    assert_eq!(fenced_get(&mut data, "missing").await.unwrap(), None);
    assert!(matches!(g1.release().await.unwrap(), Released::Lost(_)));
    assert_eq!(g2.release().await.unwrap(), Released::Held);
}
