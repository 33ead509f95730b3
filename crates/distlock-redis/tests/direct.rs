//! The direct connection that a request uses when no other request is on it.

use std::time::Duration;

use distlock_core::{LockClient, LockOptions, Released};
use distlock_redis::RedisBackend;
use distlock_testkit::RedisServer;

fn client_lines(server: &RedisServer) -> Vec<String> {
    server
        .cli(&["CLIENT", "LIST"])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The lane logs in and selects the URL's database like the shared connection: the scripts
/// run on it, in database 3, on a server that wants a password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_direct_connection_logs_in_and_selects_the_database() {
    let Some(server) = RedisServer::start_with(&["--requirepass", "s3cret"]) else {
        return;
    };
    let url = format!("redis://:s3cret@127.0.0.1:{}/3", server.port());
    let c = LockClient::builder(RedisBackend::connect(&url).await.unwrap())
        .options(LockOptions::default())
        .build();
    let g = c.acquire("db3").await.unwrap();
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let lines = client_lines(&server);
    let ran_release: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains(" db=3 ") && l.contains(" cmd=evalsha"))
        .collect();
    assert_eq!(ran_release.len(), 1, "{lines:#?}");
    // And the shared connection (which checked the login and loaded the scripts).
    assert_eq!(
        lines.iter().filter(|l| l.contains(" db=3 ")).count(),
        2,
        "{lines:#?}"
    );
    assert_eq!(
        server.cli(&[
            "-n",
            "3",
            "EXISTS",
            &c.engine::<RedisBackend>()
                .expect("the engine")
                .fence_key("db3")
        ]),
        "1"
    );
}

/// A request whose future is dropped half way (its reply not read) must not leave that reply
/// for the next request to read as its own: the connection is closed with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_mid_flight_leaves_no_reply_for_the_next() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let c = LockClient::builder(RedisBackend::connect(&server.url()).await.unwrap())
        .options(LockOptions::default())
        .build();
    // The dropped attempt's fence reply would be above 8e15; a fresh key's first fence is the
    // server's clock in microseconds (about 1.8e15 in 2027).
    const HIGH: u64 = 8_000_000_000_000_000;
    server.cli(&[
        "ZADD",
        &c.engine::<RedisBackend>()
            .expect("the engine")
            .fence_key("dropped"),
        &HIGH.to_string(),
        "f",
    ]);
    server.pause();
    let cut = tokio::time::timeout(Duration::from_millis(100), c.try_acquire("dropped")).await;
    assert!(cut.is_err(), "the paused server answered");
    server.resume();
    for round in 0..3 {
        let key = format!("fresh{round}");
        let g = c.try_acquire(&key).await.unwrap().expect("free");
        assert!(
            g.fence().is_some_and(|f| f < HIGH),
            "round {round} read another request's reply: {:?}",
            g.fence()
        );
        assert_eq!(g.release().await.unwrap(), Released::Held);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The dropped attempt reached the server after all; the client undid it (or its TTL
    // will): never a lock without expiry.
    let key = c
        .engine::<RedisBackend>()
        .expect("the engine")
        .lock_key("dropped");
    let pttl: i64 = server.cli(&["PTTL", &key]).parse().unwrap();
    assert!(pttl == -2 || pttl > 0, "PTTL {pttl}");
}
