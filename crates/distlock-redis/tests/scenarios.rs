//! The source articles' failure scenarios, on a real redis-server.

use std::time::{Duration, Instant};

use std::sync::Arc;

use distlock_core::engine::{
    AcquireMode, AcquireRequest, Attempt, Clock, LeaseCheck, LeaseKind, LeaseRef,
};
use distlock_core::{
    Backend, Backoff, ErrorKind, LockClient, LockOptions, LostReason, Released, SystemClock, Token,
};
use distlock_redis::RedisBackend;
use distlock_testkit::{RedisServer, free_port};

/// The exclusive lease of `token` on `name`, as the engine names it.
fn lease<'a>(name: &'a str, token: &'a Token) -> LeaseRef<'a> {
    LeaseRef::new(name, token, LeaseKind::Exclusive)
}

fn opts() -> distlock_core::LockOptionsBuilder {
    LockOptions::builder()
        .ttl(Duration::from_secs(30))
        .backoff(Backoff::new(Duration::from_millis(1), Duration::from_millis(10)).unwrap())
}

async fn client(server: &RedisServer, options: LockOptions) -> LockClient {
    let backend = RedisBackend::connect(&server.url()).await.expect("connect");
    LockClient::builder(backend).options(options).build()
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server
        .cli(&["PTTL", key])
        .parse()
        .expect("PTTL is an integer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lock_key_ever_exists_without_a_ttl() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let c = client(
        &server,
        opts().ttl(Duration::from_millis(400)).build().unwrap(),
    )
    .await;
    let g = c.acquire("ttl").await.unwrap();
    let key = c
        .engine::<RedisBackend>()
        .expect("the engine")
        .lock_key("ttl");
    for _ in 0..12 {
        let p = pttl(&server, &key);
        assert!(p > 0 && p <= 400, "lock key PTTL {p}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(g.is_held(), "the watchdog kept the lease");
    // The fence counter never expires.
    assert_eq!(
        pttl(
            &server,
            &c.engine::<RedisBackend>()
                .expect("the engine")
                .fence_key("ttl")
        ),
        -1
    );
    assert_eq!(g.release().await.unwrap(), Released::Held);
    assert_eq!(pttl(&server, &key), -2, "release deletes the key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_lock_frees_after_its_ttl() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let a = client(
        &server,
        opts().ttl(Duration::from_millis(600)).build().unwrap(),
    )
    .await;
    let b = client(
        &server,
        opts().wait_timeout(Duration::from_secs(5)).build().unwrap(),
    )
    .await;
    // A crash: no release, no renewal.
    let leaked = a.acquire("crash").await.unwrap().leak();
    let t0 = Instant::now();
    let g = b.acquire("crash").await.expect("freed by the TTL");
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(450),
        "freed before the TTL: {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(1500),
        "freed long after the TTL: {waited:?}"
    );
    assert!(g.fence() > leaked.fence);
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_and_extend_never_touch_another_owners_lock() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let key = backend.lock_key("foreign");
    assert_eq!(
        server.cli(&["SET", &key, "someone-else", "PX", "30000"]),
        "OK"
    );
    let ours = Token::generate();
    assert_eq!(
        backend.release(&lease("foreign", &ours)).await.unwrap(),
        LeaseCheck::Foreign
    );
    assert_eq!(
        backend
            .renew(&lease("foreign", &ours), Duration::from_secs(60))
            .await
            .unwrap(),
        LeaseCheck::Foreign
    );
    assert_eq!(server.cli(&["GET", &key]), "someone-else");
    assert!(
        pttl(&server, &key) <= 30_000,
        "the foreign TTL was not extended"
    );

    // And through guards: a holder whose lease expired and was taken over.
    let a = client(
        &server,
        opts()
            .ttl(Duration::from_millis(200))
            .auto_renew(false)
            .build()
            .unwrap(),
    )
    .await;
    let b = client(&server, opts().build().unwrap()).await;
    let g1 = a.acquire("takeover").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let g2 = b.acquire("takeover").await.unwrap();
    assert_eq!(
        g1.release().await.unwrap(),
        Released::Lost(LostReason::Expired)
    );
    let value = server.cli(&[
        "GET",
        &b.engine::<RedisBackend>()
            .expect("the engine")
            .lock_key("takeover"),
    ]);
    assert!(
        value.starts_with(&format!("{} ", g2.token().as_str())),
        "{value:?}"
    );
    assert_eq!(g2.release().await.unwrap(), Released::Held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_can_be_neither_extended_nor_released() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let c = client(
        &server,
        opts()
            .ttl(Duration::from_millis(200))
            .auto_renew(false)
            .build()
            .unwrap(),
    )
    .await;
    let g = c.acquire("expired").await.unwrap();
    let token = g.token().clone();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The server's answer, not only the local deadline:
    let backend = c.backend();
    assert_eq!(
        backend
            .renew(&lease("expired", &token), Duration::from_secs(30))
            .await
            .unwrap(),
        LeaseCheck::Missing
    );
    assert_eq!(
        backend.release(&lease("expired", &token)).await.unwrap(),
        LeaseCheck::Missing
    );
    assert_eq!(
        pttl(
            &server,
            &c.engine::<RedisBackend>()
                .expect("the engine")
                .lock_key("expired")
        ),
        -2,
        "extend resurrected the lock"
    );
    assert_eq!(
        g.extend(Duration::from_secs(30))
            .await
            .map_err(|e| e.kind()),
        Err(ErrorKind::Lost)
    );
    assert_eq!(
        g.release().await.unwrap(),
        Released::Lost(LostReason::Expired)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_acquire_succeeds_once_and_counts_the_fence_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let token = Token::generate();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let req = AcquireRequest::new("retry", &token, Duration::from_secs(5), "test/1", &clock);
    let first = backend.acquire(&req).await.unwrap();
    let Attempt::Acquired { fence: Some(f1) } = first else {
        panic!("{first:?}")
    };
    // The reply was "lost": the client sends the same request again, later, with a longer TTL.
    // The first went out on the fast path, which records no holder fence: the resend takes a
    // new one while the lock is ours (it still orders holders), and keeps it from then on.
    let req2 = AcquireRequest::new("retry", &token, Duration::from_secs(20), "test/1", &clock)
        .mode(AcquireMode::Resend { wait: false });
    let again = backend.acquire(&req2).await.unwrap();
    let Attempt::Acquired { fence: Some(f2) } = again else {
        panic!("{again:?}")
    };
    assert!(f2 > f1, "{f2} after {f1}");
    let third = backend.acquire(&req2).await.unwrap();
    assert_eq!(third, again, "same acquisition, same fence");
    assert_eq!(
        server.cli(&["ZSCORE", &backend.fence_key("retry"), "f"]),
        f2.to_string(),
        "counted once per fence handed out"
    );
    // Without the resend flag, a first attempt never takes a lock it already holds twice.
    assert_eq!(
        backend.acquire(&req).await.unwrap(),
        Attempt::Busy { holder_ttl: None }
    );
    assert!(
        pttl(&server, &backend.lock_key("retry")) > 5_000,
        "the retry re-armed the TTL"
    );
    // Another token is still refused.
    let other = Token::generate();
    let busy = backend
        .acquire(
            &AcquireRequest::new("retry", &other, Duration::from_secs(5), "x", &clock)
                .mode(AcquireMode::Wait),
        )
        .await
        .unwrap();
    assert!(matches!(busy, Attempt::Busy { holder_ttl: Some(t) } if t > Duration::from_secs(5)));
    assert_eq!(
        backend.release(&lease("retry", &token)).await.unwrap(),
        LeaseCheck::Ours
    );
    let next = backend
        .acquire(&AcquireRequest::new(
            "retry",
            &other,
            Duration::from_secs(5),
            "x",
            &clock,
        ))
        .await
        .unwrap();
    // The next holder's fence is above the resent one's (the busy first attempt above used up
    // a number; the counter is this fence now).
    let Attempt::Acquired { fence: Some(f3) } = next else {
        panic!("{next:?}")
    };
    assert!(f3 > f2, "{f3} after {f2}");
    assert_eq!(
        server.cli(&["ZSCORE", &backend.fence_key("retry"), "f"]),
        f3.to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_strictly_increases_over_1000_holders() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clients = [
        client(&server, opts().build().unwrap()).await,
        client(&server, opts().build().unwrap()).await,
        client(&server, opts().build().unwrap()).await,
    ];
    let mut last = 0;
    for i in 0..1000 {
        let g = clients[i % 3]
            .try_acquire("fence1000")
            .await
            .unwrap()
            .expect("free");
        let f = g.fence().expect("redis gives fences");
        assert!(f > last, "holder {i}: fence {f} after {last}");
        last = f;
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
    // Each fence was written back as the counter: the last one is the counter now.
    assert_eq!(
        server.cli(&[
            "ZSCORE",
            &clients[0]
                .engine::<RedisBackend>()
                .expect("the engine")
                .fence_key("fence1000"),
            "f"
        ]),
        last.to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_tasks_times_200_lose_no_update() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let make = |options: LockOptions| {
        let url = server.url();
        async move {
            let backend = RedisBackend::connect(&url).await.expect("connect");
            LockClient::builder(backend).options(options).build()
        }
    };
    distlock_testkit::conformance::counter_under_lock(&make, 8, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interop_with_plain_set_nx_px_both_ways() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // Default layout: the other client locks our key name.
    let c = client(&server, opts().build().unwrap()).await;
    let key = c
        .engine::<RedisBackend>()
        .expect("the engine")
        .lock_key("shared");
    assert_eq!(server.cli(&["SET", &key, "v", "NX", "PX", "30000"]), "OK");
    assert!(
        c.try_acquire("shared").await.unwrap().is_none(),
        "their lock must exclude ours"
    );
    let st = c.status("shared").await.unwrap();
    assert!(st.held && st.fence.is_none());
    assert!(st.ttl.is_some_and(|t| t > Duration::from_secs(25)));
    assert_eq!(server.cli(&["DEL", &key]), "1");
    let g = c.try_acquire("shared").await.unwrap().expect("free again");
    assert_eq!(
        server.cli(&["SET", &key, "v", "NX", "PX", "30000"]),
        "",
        "ours must exclude theirs"
    );
    assert_eq!(g.release().await.unwrap(), Released::Held);

    // Plain naming: exactly the key another library uses.
    let url = format!("{}?prefix=&hash_tag=false", server.url());
    let plain = LockClient::new(RedisBackend::connect(&url).await.unwrap());
    assert_eq!(server.cli(&["SET", "k", "v", "NX", "PX", "30000"]), "OK");
    assert!(plain.try_acquire("k").await.unwrap().is_none());
    assert_eq!(server.cli(&["DEL", "k"]), "1");
    let g = plain.try_acquire("k").await.unwrap().expect("free");
    // The value: our token, then when and who (for `status` and for people reading the key).
    let value = server.cli(&["GET", "k"]);
    let parts: Vec<&str> = value.splitn(3, ' ').collect();
    assert_eq!(parts[0], g.token().as_str(), "{value:?}");
    assert!(parts[1].parse::<u64>().is_ok(), "{value:?}");
    assert_eq!(parts[2], plain.owner(), "{value:?}");
    assert_eq!(server.cli(&["SET", "k", "v", "NX", "PX", "30000"]), "");
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gives_typed_errors_and_takes_nothing() {
    // Zero TTL and malformed URLs need no server.
    let e = LockOptions::builder()
        .ttl(Duration::ZERO)
        .build()
        .expect_err("zero ttl");
    assert_eq!(e.kind(), ErrorKind::Config);
    for bad in [
        "redis//nope",
        "redis://",
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:6379?response_timeout=x",
    ] {
        let e = RedisBackend::connect(bad).await.expect_err(bad);
        assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
    }
    // Refused connection: fast, typed, retryable.
    let t0 = Instant::now();
    let e = RedisBackend::connect(&format!("redis://127.0.0.1:{}", free_port()))
        .await
        .expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    assert!(e.is_retryable());
    assert!(
        std::error::Error::source(&e).is_some(),
        "the driver error is chained"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "refusal took {:?}",
        t0.elapsed()
    );

    // Wrong password, and no password, on a server that wants one.
    let Some(secure) = RedisServer::start_with(&["--requirepass", "s3cret"]) else {
        return;
    };
    let port = secure.port();
    for (url, says) in [
        // redis-rs answers WRONGPASS with its own words ("Password authentication failed").
        (
            format!("redis://:wrong@127.0.0.1:{port}"),
            "authentication failed",
        ),
        (format!("redis://127.0.0.1:{port}"), "NOAUTH"),
    ] {
        let e = RedisBackend::connect(&url).await.expect_err("bad auth");
        assert_eq!(e.kind(), ErrorKind::Auth, "{url}: {e}");
        assert!(e.to_string().contains(says), "the server's words: {e}");
        assert!(!e.is_retryable());
    }
    assert!(RedisBackend::connect(&secure.url()).await.is_ok());

    // A key holding a hash instead of a lock string.
    let Some(server) = RedisServer::start() else {
        return;
    };
    let c = client(&server, opts().build().unwrap()).await;
    let key = c
        .engine::<RedisBackend>()
        .expect("the engine")
        .lock_key("typed");
    server.cli(&["HSET", &key, "f", "v"]);
    // A first attempt (SET NX) finds the key taken: busy, like any foreign lock. A waiting
    // attempt reads the key and reports what it is.
    assert!(c.try_acquire("typed").await.unwrap().is_none());
    let waiting = opts().wait_timeout(Duration::from_secs(2)).build().unwrap();
    let e = c
        .lock("typed")
        .options(waiting)
        .acquire()
        .await
        .expect_err("wrong type");
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
    assert_eq!(
        c.status("typed").await.map_err(|e| e.kind()).err(),
        Some(ErrorKind::Protocol)
    );
    // Nothing half taken: at most the fence counter moved (a busy first attempt uses up a
    // number), and no holder was recorded.
    assert_eq!(
        server.cli(&[
            "TYPE",
            &c.engine::<RedisBackend>()
                .expect("the engine")
                .fence_key("typed")
        ]),
        "zset"
    );
    assert_eq!(
        server.cli(&[
            "EXISTS",
            &c.engine::<RedisBackend>()
                .expect("the engine")
                .meta_key("typed")
        ]),
        "0",
        "nothing half taken"
    );
    assert_eq!(server.cli(&["TYPE", &key]), "hash");
    // A fence key of the wrong type: the lock key must not be left set.
    let fence_key = c
        .engine::<RedisBackend>()
        .expect("the engine")
        .fence_key("typed2");
    server.cli(&["SET", &fence_key, "not-a-sorted-set"]);
    let e = c
        .try_acquire("typed2")
        .await
        .expect_err("wrong fence key type");
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
    assert_eq!(
        server.cli(&[
            "EXISTS",
            &c.engine::<RedisBackend>()
                .expect("the engine")
                .lock_key("typed2")
        ]),
        "0",
        "lock half taken"
    );
    // Several names, one of them the hash: refused as it is, the other name not taken, the
    // hash not replaced.
    let e = c
        .lock_many(["typed3", "typed"])
        .try_acquire()
        .await
        .expect_err("a lock key of another type");
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
    assert_eq!(
        server.cli(&["TYPE", &key]),
        "hash",
        "another tool's data replaced"
    );
    assert_eq!(
        server.cli(&[
            "EXISTS",
            &c.engine::<RedisBackend>()
                .expect("the engine")
                .lock_key("typed3")
        ]),
        "0",
        "a name taken while another was refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_gives_timeouts_and_leaves_only_expiring_keys() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = format!("{}?response_timeout=200ms", server.url());
    let c = LockClient::builder(RedisBackend::connect(&url).await.unwrap())
        .options(opts().ttl(Duration::from_secs(2)).build().unwrap())
        .build();
    server.pause();
    let t0 = Instant::now();
    let e = c.try_acquire("paused").await.expect_err("server paused");
    let took = t0.elapsed();
    server.resume();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    // One try and two resends with the same token, 200 ms each.
    assert!(took < Duration::from_secs(2), "took {took:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let key = c
        .engine::<RedisBackend>()
        .expect("the engine")
        .lock_key("paused");
    let p = pttl(&server, &key);
    assert!(
        p == -2 || (0..=2000).contains(&p),
        "a key without TTL was left behind (PTTL {p})"
    );
    let b = LockClient::builder(RedisBackend::connect(&server.url()).await.unwrap())
        .options(opts().wait_timeout(Duration::from_secs(5)).build().unwrap())
        .build();
    let g = b.acquire("paused").await.expect("the lock frees");
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_reconnects_after_a_server_restart() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let c = client(&server, opts().build().unwrap()).await;
    // Holders from three clients, then the last one keeps its lock as the server dies.
    let others = [
        client(&server, opts().build().unwrap()).await,
        client(&server, opts().build().unwrap()).await,
    ];
    let mut before = 0;
    for i in 0..30 {
        let g = others[i % 2].acquire("restart").await.unwrap();
        before = before.max(g.fence().expect("a fence"));
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
    let g = c.acquire("restart").await.unwrap();
    before = before.max(g.fence().expect("a fence"));
    let _ = g.leak();
    // kill -9, without persistence: the lock and its fence counter are lost.
    server.kill();
    let e = c.try_acquire("restart").await.expect_err("server down");
    assert!(e.is_retryable(), "{e}");
    server.restart();
    let mut got = None;
    for _ in 0..50 {
        match c.try_acquire("restart").await {
            Ok(Some(g)) => {
                got = Some(g);
                break;
            }
            Ok(None) => panic!("a restarted empty server cannot hold the lock"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let g = got.expect("reconnected within 5 s");
    // The fence still rises: the new counter starts from the server's clock, above every fence
    // the old one gave.
    let after = g.fence().expect("a fence");
    assert!(after > before, "fence {after} after {before}: it went back");
    assert_eq!(g.release().await.unwrap(), Released::Held);
    // A client that saw none of them gets a higher one too: the floor is the server's clock,
    // not this client's memory.
    let fresh = client(&server, opts().build().unwrap()).await;
    let g = fresh.acquire("restart").await.unwrap();
    assert!(g.fence().expect("a fence") > after);
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

/// A server that lost the counter and whose clock is behind the fences it gave (here: a
/// counter that ran ahead of the clock, then lost): the client's memory keeps its own fences
/// rising, and a client without that memory gets a lower one (what the docs warn of).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_s_memory_keeps_its_fences_rising_when_the_server_s_clock_is_behind() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let c = client(&server, opts().build().unwrap()).await;
    let fence_key = c
        .engine::<RedisBackend>()
        .expect("the engine")
        .fence_key("behind");
    // An hour ahead of the server's clock, in microseconds.
    let ahead = (distlock_core::recipes::unix_ms() as u64 + 3_600_000) * 1000;
    server.cli(&["ZADD", &fence_key, &ahead.to_string(), "f"]);
    let g = c.acquire("behind").await.unwrap();
    let seen = g.fence().expect("a fence");
    assert_eq!(seen, ahead + 1);
    assert_eq!(g.release().await.unwrap(), Released::Held);
    // The counter is lost; the server's clock is an hour behind the last fence.
    server.cli(&["DEL", &fence_key]);
    let g = c.acquire("behind").await.unwrap();
    assert_eq!(
        g.fence(),
        Some(seen + 1),
        "raised above the fence this client saw"
    );
    assert_eq!(g.release().await.unwrap(), Released::Held);
    // Another client with no memory of it: the counter now holds the raised fence, so it too
    // gets a higher one.
    let other = client(&server, opts().build().unwrap()).await;
    let g = other.acquire("behind").await.unwrap();
    assert!(g.fence().expect("a fence") > seen + 1);
    assert_eq!(g.release().await.unwrap(), Released::Held);
    // Lost again, and asked by a client that never saw it: lower than before. The resource's
    // fence check refuses that holder's writes; this is the caveat docs/fencing.md states.
    server.cli(&["DEL", &fence_key]);
    let g = other.acquire("behind").await.unwrap();
    assert!(
        g.fence().expect("a fence") > seen + 1,
        "this client saw the raised one"
    );
    assert_eq!(g.release().await.unwrap(), Released::Held);
    server.cli(&["DEL", &fence_key]);
    let stranger = client(&server, opts().build().unwrap()).await;
    let g = stranger.acquire("behind").await.unwrap();
    assert!(g.fence().expect("a fence") < seen, "the clock floor alone");
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_is_two_plain_commands_release_one_evalsha_and_both_survive_script_flush() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let c = client(&server, opts().auto_renew(false).build().unwrap()).await;
    // Warm up: the first call loads the scripts (NOSCRIPT, SCRIPT LOAD, EVALSHA).
    let g = c.acquire("rt").await.unwrap();
    assert_eq!(g.release().await.unwrap(), Released::Held);
    server.cli(&["CONFIG", "RESETSTAT"]);
    for _ in 0..100 {
        let g = c.acquire("rt").await.unwrap();
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
    let stats = server.commandstats();
    let calls = |name: &str| stats.get(name).copied().unwrap_or(0);
    // Commands the server executed inside scripts are counted too (get, del, exists…). An
    // uncontended acquire is a pipelined SET NX PX and ZADD GT CH of the proposed fence (one
    // round trip, no script; a second one, ZINCRBY, only when the wall clock did not move past
    // the last fence, which a step of the clock could make happen once); a release is one
    // EVALSHA.
    assert_eq!(calls("evalsha"), 100, "{stats:?}");
    assert_eq!(calls("set"), 100, "{stats:?}");
    assert_eq!(calls("zadd"), 100, "{stats:?}");
    assert!(calls("zincrby") <= 1, "{stats:?}");
    assert_eq!(calls("eval"), 0, "scripts are sent by SHA, not by body");
    assert_eq!(calls("script|load"), 0);

    // A flushed script cache is reloaded transparently.
    server.cli(&["SCRIPT", "FLUSH"]);
    let g = c.acquire("rt").await.expect("NOSCRIPT is handled");
    assert_eq!(g.release().await.unwrap(), Released::Held);
}
