//! Every URL form the Redis engine accepts, against real servers.

use std::time::Duration;

use distlock_core::{ErrorKind, LockClient, Released};
use distlock_redis::{RedisBackend, RedlockBackend, SentinelBackend};
use distlock_testkit::{Pki, RedisServer, Sentinels};

/// Takes and releases `name` through a new client; its fence.
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
    let fences = [
        lock_once(&server.url(), "u").await,
        lock_once(&format!("redis+unix://{sock_s}"), "u").await,
        lock_once(&format!("unix://{sock_s}"), "u").await,
    ];
    assert!(fences.is_sorted_by(|a, b| a < b), "{fences:?}");
    // One lock: its counter is the last fence given.
    assert_eq!(fences[2], Some(meta_fence(&server, "u").await));
}

/// The fence counter of `name` on `server` (database 0).
async fn meta_fence(server: &RedisServer, name: &str) -> u64 {
    let b = RedisBackend::connect(&server.url()).await.unwrap();
    let text = server.cli(&["ZSCORE", &b.fence_key(name), "f"]);
    text.parse()
        .unwrap_or_else(|_| panic!("fence counter {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_number_and_acl_user() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = format!("{}/3", server.url());
    let c = LockClient::new(RedisBackend::connect(&url).await.unwrap());
    let g = c.try_acquire("db").await.unwrap().expect("free");
    let key = c
        .engine::<RedisBackend>()
        .expect("the engine")
        .lock_key("db");
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
    assert!(
        lock_once(&format!("redis://locker:pw1@127.0.0.1:{port}"), "acl")
            .await
            .is_some()
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
    assert_eq!(
        server.cli(&[
            "EXISTS",
            &c.engine::<RedisBackend>()
                .expect("the engine")
                .lock_key("acl2")
        ]),
        "0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_ca_client_certificates_and_an_acl_user() {
    let pki = Pki::generate();
    let Some(server) = RedisServer::start_tls(&pki, true, &[]) else {
        return;
    };
    let tls_port = server.tls_port();
    let ca = pki.ca.display();
    let (ccert, ckey) = (pki.client.cert.display(), pki.client.key.display());
    let base = format!("rediss://127.0.0.1:{tls_port}/");
    let good = format!("{base}?tls_ca={ca}&tls_cert={ccert}&tls_key={ckey}");
    let first = lock_once(&good, "tls").await;
    assert!(first.is_some());
    // `#insecure` checks no certificate, and still shows ours.
    let second = lock_once(
        &format!("{base}?tls_cert={ccert}&tls_key={ckey}#insecure"),
        "tls",
    )
    .await;
    assert!(second > first, "{second:?} after {first:?}");
    let refused = |url: String, kind: ErrorKind, words: &'static str| async move {
        let e = RedisBackend::connect(&url)
            .await
            .map(|_| ())
            .expect_err(words);
        assert_eq!(e.kind(), kind, "{url}: {e}");
        assert!(e.to_string().contains(words), "{url}: {e}");
    };
    refused(
        format!("{base}?tls_cert={ccert}&tls_key={ckey}"),
        ErrorKind::Auth,
        "the server's certificate was refused",
    )
    .await;
    refused(
        format!("{base}?tls_ca={ca}"),
        ErrorKind::Auth,
        "refused our client certificate",
    )
    .await;
    let (scert, skey) = (pki.stranger.cert.display(), pki.stranger.key.display());
    refused(
        format!("{base}?tls_ca={ca}&tls_cert={scert}&tls_key={skey}"),
        ErrorKind::Auth,
        "refused our client certificate",
    )
    .await;
    refused(
        format!("{base}?tls_ca=/nonexistent/ca.pem"),
        ErrorKind::Config,
        "/nonexistent/ca.pem",
    )
    .await;
    refused(
        format!("redis://127.0.0.1:{}?tls_ca={ca}", server.port()),
        ErrorKind::Config,
        "rediss://",
    )
    .await;
    // An ACL user with a password, over TLS; a wrong password is refused.
    assert_eq!(
        server.cli(&["ACL", "SETUSER", "locker", "on", ">pw", "~*", "&*", "+@all"]),
        "OK"
    );
    let files = format!("tls_ca={ca}&tls_cert={ccert}&tls_key={ckey}");
    let third = lock_once(
        &format!("rediss://locker:pw@127.0.0.1:{tls_port}/?{files}"),
        "tls",
    )
    .await;
    assert!(third > second, "{third:?} after {second:?}");
    refused(
        format!("rediss://locker:nope@127.0.0.1:{tls_port}/?{files}"),
        ErrorKind::Auth,
        "",
    )
    .await;
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

/// `redlocks://` over three masters that demand client certificates: every master gets the
/// CA and the certificate of the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_over_tls_masters() {
    let pki = Pki::generate();
    let mut servers = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..3 {
        let Some(server) = RedisServer::start_tls(&pki, true, &[]) else {
            return;
        };
        ports.push(format!("127.0.0.1:{}", server.tls_port()));
        servers.push(server);
    }
    let files = format!(
        "tls_ca={}&tls_cert={}&tls_key={}",
        pki.ca.display(),
        pki.client.cert.display(),
        pki.client.key.display()
    );
    let url = format!("redlocks://{}/?{files}", ports.join(","));
    let c = LockClient::new(RedlockBackend::connect(&url).await.expect("redlocks://"));
    let g = c.try_acquire("tls-redlock").await.unwrap().expect("free");
    assert!(g.is_held());
    assert_eq!(g.release().await.unwrap(), Released::Held);
    // Without the client certificate, every master refuses.
    let e = RedlockBackend::connect(&format!(
        "redlocks://{}/?tls_ca={}",
        ports.join(","),
        pki.ca.display()
    ))
    .await
    .map(|_| ())
    .expect_err("no client certificate");
    assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
}

/// `rediss+sentinel://`: the sentinel and the master it names both speak TLS only to holders
/// of a client certificate; the URL's CA and certificate serve both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls() {
    let pki = Pki::generate();
    let Some(master) = RedisServer::start_tls(&pki, true, &[]) else {
        return;
    };
    let Some(sentinels) = Sentinels::start_tls(1, master.tls_port(), &pki) else {
        return;
    };
    let url = sentinels.url(&format!(
        "?tls_ca={}&tls_cert={}&tls_key={}",
        pki.ca.display(),
        pki.client.cert.display(),
        pki.client.key.display()
    ));
    assert!(url.starts_with("rediss+sentinel://"), "{url}");
    let c = LockClient::new(
        SentinelBackend::connect(&url)
            .await
            .expect("sentinel over TLS"),
    );
    let g = c.try_acquire("tls-sentinel").await.unwrap().expect("free");
    assert!(g.fence().is_some());
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let e = SentinelBackend::connect(&sentinels.url(&format!("?tls_ca={}", pki.ca.display())))
        .await
        .map(|_| ())
        .expect_err("no client certificate");
    assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
}
