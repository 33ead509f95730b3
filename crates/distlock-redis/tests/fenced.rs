//! Fenced writes on the protected resource: a holder paused past its TTL writes after a newer
//! holder did, and the write is refused.

use std::time::Duration;

use distlock_core::ErrorKind;
use distlock_core::{LockClient, LockOptions, Released};
use distlock_redis::{RedisBackend, fenced_get, fenced_set, lock_error, resource_connection};
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
    let mut data = resource_connection(&server.url()).await.unwrap();

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

#[tokio::test]
async fn a_resource_connection_gives_the_librarys_errors() {
    let e = resource_connection("redis://:secret@[not-a-url")
        .await
        .expect_err("a malformed URL");
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(!e.to_string().contains("secret"), "{e}");
    // Nothing listens on a port just freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = resource_connection(&format!("redis://127.0.0.1:{port}"))
        .await
        .expect_err("a refused connection");
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    let Some(server) = RedisServer::start() else {
        return;
    };
    let mut data = resource_connection(&server.url()).await.unwrap();
    // A program's own call, its error the library's: a command on the wrong type.
    let _: () = redis::cmd("SET")
        .arg("plain")
        .arg("x")
        .query_async(&mut data)
        .await
        .unwrap();
    let e = redis::cmd("HGET")
        .arg("plain")
        .arg("f")
        .query_async::<Option<String>>(&mut data)
        .await
        .map_err(lock_error)
        .expect_err("a string is not a hash");
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
}
