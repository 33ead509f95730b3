//! Every URL form the Redis engine accepts, against real servers.

use std::process::Command;
use std::time::Duration;

use distlock_core::{ErrorKind, LockClient, Released};
use distlock_redis::RedisBackend;
use distlock_testkit::{RedisServer, free_port, require_binary};

async fn lock_once(url: &str, name: &str) -> Option<u64> {
    let c = LockClient::new(
        RedisBackend::connect(url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}")),
    );
    let g = c.try_acquire(name).await.unwrap().expect("free");
    let fence = g.fence();
    assert_eq!(g.release().await.unwrap(), Released::Held);
    fence
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_reaches_the_same_locks_as_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("redis.sock");
    let sock_s = sock.to_str().unwrap();
    let Some(server) =
        RedisServer::start_with(&["--unixsocket", sock_s, "--unixsocketperm", "700"])
    else {
        return;
    };
    assert_eq!(lock_once(&server.url(), "u").await, Some(1));
    assert_eq!(
        lock_once(&format!("redis+unix://{sock_s}"), "u").await,
        Some(2)
    );
    assert_eq!(lock_once(&format!("unix://{sock_s}"), "u").await, Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_number_and_acl_user() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = format!("{}/3", server.url());
    let c = LockClient::new(RedisBackend::connect(&url).await.unwrap());
    let g = c.try_acquire("db").await.unwrap().expect("free");
    let key = c.backend().lock_key("db");
    assert_eq!(server.cli(&["-n", "3", "EXISTS", &key]), "1");
    assert_eq!(server.cli(&["-n", "0", "EXISTS", &key]), "0");
    assert_eq!(g.release().await.unwrap(), Released::Held);

    assert_eq!(
        server.cli(&[
            "ACL",
            "SETUSER",
            "locker",
            "on",
            ">pw1",
            "~distlock:*",
            "+@all"
        ]),
        "OK"
    );
    let port = server.port();
    assert_eq!(
        lock_once(&format!("redis://locker:pw1@127.0.0.1:{port}"), "acl").await,
        Some(1)
    );
    // No channel rights (Redis 7 gives none by default): release still works, and a waiter,
    // whose subscription is refused, falls back to polling every `wake_fallback`.
    let locker = format!("redis://locker:pw1@127.0.0.1:{port}");
    let opts = distlock_core::LockOptions::builder()
        .wake_fallback(Duration::from_millis(200))
        .build()
        .unwrap();
    let holder = LockClient::new(RedisBackend::connect(&locker).await.unwrap());
    let waiter = LockClient::builder(RedisBackend::connect(&locker).await.unwrap())
        .options(opts)
        .build();
    let g = holder.acquire("acl-wait").await.unwrap();
    let w = tokio::spawn(async move {
        let g = waiter.acquire("acl-wait").await.unwrap();
        let at = std::time::Instant::now();
        assert_eq!(g.release().await.unwrap(), Released::Held);
        at
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = std::time::Instant::now();
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let got = tokio::time::timeout(Duration::from_secs(5), w)
        .await
        .expect("the waiter got the lock")
        .unwrap();
    assert!(
        got.duration_since(released) < Duration::from_millis(200 + 150),
        "{:?}",
        got.duration_since(released)
    );
    let e = RedisBackend::connect(&format!("redis://locker:nope@127.0.0.1:{port}"))
        .await
        .expect_err("bad password");
    assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
    // A user whose ACL does not allow our keys: an Auth error, and nothing taken.
    assert_eq!(
        server.cli(&[
            "ACL", "SETUSER", "narrow", "on", ">pw2", "~other:*", "+@all"
        ]),
        "OK"
    );
    let c = LockClient::new(
        RedisBackend::connect(&format!("redis://narrow:pw2@127.0.0.1:{port}"))
            .await
            .unwrap(),
    );
    let e = c
        .try_acquire("acl2")
        .await
        .expect_err("no permission on the key");
    assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
    assert!(
        e.to_string().contains("no permissions to access"),
        "the server's words: {e}"
    );
    assert_eq!(server.cli(&["EXISTS", &c.backend().lock_key("acl2")]), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_rediss() {
    if !require_binary("openssl", "rediss:// (certificate generation)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(out.status.success(), "openssl: {out:?}");
    let tls_port = free_port().to_string();
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let Some(_server) = RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        c,
        "--tls-key-file",
        k,
        "--tls-ca-cert-file",
        c,
        "--tls-auth-clients",
        "no",
    ]) else {
        return;
    };
    // `#insecure`: the test's certificate is self-signed.
    let url = format!("rediss://127.0.0.1:{tls_port}/#insecure");
    assert_eq!(lock_once(&url, "tls").await, Some(1));
    // Plain TCP to the TLS port fails with a typed error, quickly.
    let plain =
        format!("redis://127.0.0.1:{tls_port}?connect_timeout=500ms&response_timeout=500ms");
    let t0 = std::time::Instant::now();
    let e = RedisBackend::connect(&plain).await.expect_err("not TLS");
    assert!(
        matches!(
            e.kind(),
            ErrorKind::Connection | ErrorKind::Timeout | ErrorKind::Protocol
        ),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_key_prefix_with_a_space_is_refused_before_connecting() {
    // Nothing listens on port 1: the prefix is checked first.
    for url in [
        "redis://127.0.0.1:1/?prefix=my%20app:",
        "redis://127.0.0.1:1/?prefix=app%0A",
    ] {
        let err = RedisBackend::connect(url).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
    }
}
