//! ZooKeeper-specific behaviour on real servers: FIFO order, protection mode, a session that
//! expires under a held lock, and a server of an ensemble killed under one.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_core::engine::{
    AcquireMode, AcquireRequest, Attempt, Clock, LeaseCheck, LeaseKind, LeaseRef, RenewItem,
};
use distlock_core::{Backend, ErrorKind, LockClient, LostReason, Released, SystemClock, Token};
use distlock_testkit::{ZooKeeper, client_of};
use distlock_zookeeper::ZkBackend;

async fn client(url: &str) -> LockClient {
    let backend = ZkBackend::connect(url).await.expect("connect");
    client_of(
        backend,
        Duration::from_secs(10),
        Some(Duration::from_secs(30)),
    )
}

async fn children(zk: &zookeeper_client::Client, path: &str) -> Vec<String> {
    zk.list_children(path).await.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_queued_waiters_acquire_in_queue_order() {
    let Some(zk) = ZooKeeper::start() else { return };
    let url = zk.url("");
    let raw = zookeeper_client::Client::connect(&url["zk://".len()..])
        .await
        .unwrap();
    let holder = client(&url).await;
    let parent = holder
        .engine::<ZkBackend>()
        .expect("the engine")
        .lock_path("fifo");
    let g = holder.acquire("fifo").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..10 {
        let c = client(&url).await;
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let g = c.acquire("fifo").await.expect("acquired in turn");
            order.lock().unwrap().push((i, g.fence().unwrap()));
            assert_eq!(g.release().await.unwrap(), Released::Held);
        }));
        // Queued for good: its node stays (a first attempt's node is deleted at once).
        let t0 = Instant::now();
        loop {
            let before = children(&raw, &parent).await;
            tokio::time::sleep(Duration::from_millis(150)).await;
            if before.len() == i + 2 && children(&raw, &parent).await == before {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "never queued");
        }
    }
    assert_eq!(g.release().await.unwrap(), Released::Held);
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let who: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(who, (0..10).collect::<Vec<_>>(), "FIFO");
    assert!(
        order.windows(2).all(|w| w[0].1 < w[1].1),
        "fences (czxid) increase with the queue: {order:?}"
    );
    assert!(
        children(&raw, &parent).await.is_empty(),
        "nothing left behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_create_finds_its_own_node_and_leaves_no_orphan() {
    let Some(zk) = ZooKeeper::start() else { return };
    let url = zk.url("");
    let backend = ZkBackend::connect(&url).await.unwrap();
    let token = Token::generate();
    // The first create reached the server, its reply was lost: the node exists, with our
    // token in its name (protection mode), and we never learnt its sequence number.
    let parent = backend.lock_path("protect");
    let raw = zookeeper_client::Client::connect(&url["zk://".len()..])
        .await
        .unwrap();
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    raw.mkdir(&parent, &persistent).await.unwrap();
    let ephemeral = zookeeper_client::CreateMode::EphemeralSequential
        .with_acls(zookeeper_client::Acls::anyone_all());
    let (stat, _) = raw
        .create(
            &format!("{parent}/_c_{}-lock-", token.as_str()),
            b"lost reply",
            &ephemeral,
        )
        .await
        .unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let req = AcquireRequest::new("protect", &token, Duration::from_secs(10), "test", &clock)
        .mode(AcquireMode::Resend { wait: false });
    match backend.acquire(&req).await.unwrap() {
        Attempt::Acquired { fence } => assert_eq!(fence, Some(stat.czxid as u64)),
        other => panic!("the resend did not adopt its node: {other:?}"),
    }
    assert_eq!(children(&raw, &parent).await.len(), 1, "no second node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_expires_under_a_held_lock_fires_lost() {
    let Some(zk) = ZooKeeper::start() else { return };
    let url = zk.url("?session_timeout=1s&response_timeout=500ms");
    let a = client(&url).await;
    let g = a.acquire("session").await.unwrap();
    let session = a.engine::<ZkBackend>().expect("the engine").session_id();
    zk.servers()[0].pause();
    let t0 = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost fires while the server is frozen");
    assert!(
        matches!(reason, LostReason::Unreachable | LostReason::Expired),
        "{reason:?}"
    );
    assert!(!g.is_held());
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    // Past the session timeout, then thawed: the server expires the session, the client
    // opens a new one, and the lock is free for anyone.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    zk.servers()[0].resume();
    let b = client(&url).await;
    let t0 = Instant::now();
    let g2 = loop {
        if let Some(g2) = b.try_acquire("session").await.unwrap() {
            break g2;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the expired session's node stayed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(g2.release().await.unwrap(), Released::Held);
    assert!(matches!(g.release().await.unwrap(), Released::Lost(_)));
    let t0 = Instant::now();
    while a.engine::<ZkBackend>().expect("the engine").session_id() == session {
        assert!(t0.elapsed() < Duration::from_secs(10), "no new session");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let g3 = a.try_acquire("session").await.unwrap().expect("free");
    assert_eq!(g3.release().await.unwrap(), Released::Held);
}

/// A request whose connection stops answering fails as the connection's loss, which a wait
/// tries again (the create may have happened, and is looked for), not as an unexpected reply:
/// the client fails such requests with the connection's own error ("no response from
/// connection in 800ms"), and a `distlock lead` paused past it gave up campaigning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_on_a_connection_that_stopped_answering_fails_as_a_connection_error() {
    let Some(zk) = ZooKeeper::start() else { return };
    let url = zk.url("?session_timeout=6s&connect_timeout=800ms&response_timeout=5s");
    let a = client(&url).await;
    zk.servers()[0].pause();
    let err = a
        .try_acquire("frozen")
        .await
        .expect_err("no answer while the server is frozen");
    zk.servers()[0].resume();
    assert!(
        err.is_retryable(),
        "{err} ({:?}): a connection that stopped answering",
        err.kind()
    );
    assert_ne!(err.kind(), ErrorKind::Protocol, "{err}");
    // Thawed: the client talks to the server again and takes the lock.
    let t0 = Instant::now();
    let g = loop {
        match a.try_acquire("frozen").await {
            Ok(Some(g)) => break g,
            Ok(None) => {}
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "never taken");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_a_holder_talks_to_killed_in_an_ensemble_of_three() {
    let Some(mut zk) = ZooKeeper::start_ensemble(3) else {
        return;
    };
    let url = zk.url("?session_timeout=4s");
    let a = client(&url).await;
    let b = client(&url).await;
    let g = a.acquire("ensemble").await.unwrap();
    let fence = g.fence();
    let mine = zk
        .servers()
        .iter()
        .position(|s| s.serves_session(a.engine::<ZkBackend>().expect("the engine").session_id()))
        .expect("a server holds A's connection");
    zk.servers_mut()[mine].kill();
    // The connection drop suspends the session: A stops trusting the lock at once.
    let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost fires");
    assert_eq!(reason, LostReason::Unreachable);
    // A reconnects to a live server within the session timeout: its node (and so the lock)
    // still exists, and nobody else may take it until A lets it go.
    let t0 = Instant::now();
    let status = loop {
        match a.status("ensemble").await {
            Ok(s) => break s,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "A never reconnected"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(status.held);
    assert_eq!(status.fence, fence);
    let t0 = Instant::now();
    loop {
        match b.try_acquire("ensemble").await {
            Ok(None) => break,
            Ok(Some(_)) => panic!("taken while A's node still exists"),
            Err(e) => assert!(t0.elapsed() < Duration::from_secs(10), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A's release deletes its node (it reports the lease lost, as it was).
    let released = g.release().await.unwrap();
    assert!(matches!(released, Released::Lost(_)), "{released:?}");
    let t0 = Instant::now();
    let g2 = loop {
        if let Ok(Some(g2)) = b.try_acquire("ensemble").await {
            break g2;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "never freed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(g2.fence() > fence, "{:?} after {fence:?}", g2.fence());
    assert_eq!(g2.release().await.unwrap(), Released::Held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_across_500_holders() {
    let Some(zk) = ZooKeeper::start() else { return };
    let url = zk.url("");
    let clients = [client(&url).await, client(&url).await];
    let mut last = 0;
    for i in 0..500 {
        let g = clients[i % 2].acquire("fences500").await.unwrap();
        let fence = g.fence().expect("ZooKeeper gives fences");
        assert!(fence > last, "holder {i}: fence {fence} after {last}");
        last = fence;
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
}

/// The packets a server has received so far (`mntr`'s `zk_packets_received`).
fn packets_received(zk: &ZooKeeper) -> u64 {
    zk.servers()[0]
        .four_letter("mntr")
        .lines()
        .find_map(|l| l.strip_prefix("zk_packets_received"))
        .and_then(|v| v.trim().parse().ok())
        .expect("mntr answers with zk_packets_received")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_renewal_checks_2100_locks_in_three_requests() {
    let Some(zk) = ZooKeeper::start() else { return };
    let url = zk.url("?response_timeout=10s");
    let backend = Arc::new(ZkBackend::connect(&url).await.unwrap());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let tokens: Vec<Token> = (0..2100).map(|_| Token::generate()).collect();
    let names: Vec<String> = (0..2100).map(|i| format!("batch{i}")).collect();
    let pairs: Vec<(&String, &Token)> = names.iter().zip(&tokens).collect();
    for group in pairs.chunks(10) {
        let attempts = group.iter().map(|(name, token)| {
            let (backend, clock) = (&backend, &clock);
            async move {
                let req = AcquireRequest::new(name, token, Duration::from_secs(10), "test", clock);
                backend.acquire(&req).await.unwrap()
            }
        });
        for attempt in futures_util::future::join_all(attempts).await {
            assert!(matches!(attempt, Attempt::Acquired { .. }), "{attempt:?}");
        }
    }
    // Someone deletes lock 1500's node; lock 1700's node is deleted and created again by
    // another session (same path, another owner).
    let raw = zookeeper_client::Client::connect(&zk.url("")["zk://".len()..])
        .await
        .unwrap();
    let node_of = |i: usize| {
        let (raw, parent) = (&raw, backend.lock_path(&names[i]));
        async move {
            let child = children(raw, &parent).await.pop().expect("one node");
            format!("{parent}/{child}")
        }
    };
    let gone = node_of(1500).await;
    raw.delete(&gone, None).await.unwrap();
    let replaced = node_of(1700).await;
    raw.delete(&replaced, None).await.unwrap();
    let ephemeral =
        zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    raw.create(&replaced, b"another session", &ephemeral)
        .await
        .unwrap();
    let unknown = Token::generate();
    let mut items: Vec<RenewItem<'_>> = names
        .iter()
        .zip(&tokens)
        .map(|(n, t)| RenewItem::new(LeaseRef::new(n, t, LeaseKind::Exclusive), Duration::ZERO))
        .collect();
    items.push(RenewItem::new(
        LeaseRef::new("batch0", &unknown, LeaseKind::Exclusive),
        Duration::ZERO,
    ));
    let batch = backend.batch_renew().expect("ZooKeeper renews in batches");
    let before = packets_received(&zk);
    let checks = batch.renew_many(&items).await;
    let requests = packets_received(&zk) - before - 1; // the second mntr is a packet too
    assert_eq!(checks.len(), items.len());
    for (i, check) in checks.iter().enumerate() {
        let want = match i {
            1500 | 2100 => LeaseCheck::Missing,
            1700 => LeaseCheck::Foreign,
            _ => LeaseCheck::Ours,
        };
        assert_eq!(check.as_ref().unwrap(), &want, "lock {i}");
    }
    assert!(
        (1..=3).contains(&requests),
        "{requests} requests for 2,100 checks"
    );
}

/// A wait budget rides through the loss of the server a client talks to: an acquire with a
/// budget, started as that server dies, gets the lock through another one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_budget_rides_through_a_server_kill() {
    let Some(mut zk) = ZooKeeper::start_ensemble(3) else {
        return;
    };
    let url = zk.url("?session_timeout=4s");
    let c = client(&url).await;
    let g = c.acquire("ride").await.unwrap();
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let mine = zk
        .servers()
        .iter()
        .position(|s| s.serves_session(c.engine::<ZkBackend>().expect("the engine").session_id()))
        .expect("a server holds the connection");
    zk.servers_mut()[mine].kill();
    let t0 = Instant::now();
    // The client's default options wait 30 s at most.
    let g = c.acquire("ride").await.expect("rode through");
    eprintln!("taken {:?} after the kill", t0.elapsed());
    // Not `is_held()` here: the guard may already be marked lost (below), at once.
    match g.release().await.unwrap() {
        Released::Held => {}
        // Taken on the new server before the engine had counted the disconnection from the
        // old one: a lock whose node predates a connection loss is no longer trusted (the
        // conservative reading of a suspended session), and is reported lost. The next one,
        // after the reconnection, holds.
        Released::Lost(_) => {
            let g = c.acquire("ride").await.expect("after the reconnection");
            assert_eq!(g.release().await.unwrap(), Released::Held);
        }
    }
}

/// The fence is the lock node's `czxid`: the transaction log keeps the zxid across a kill -9
/// and a restart, and a new leader epoch (the high 32 bits) only grows, so the next fence is
/// above every fence before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_rising_across_a_kill_and_restart() {
    let Some(mut zk) = ZooKeeper::start() else {
        return;
    };
    let url = zk.url("?session_timeout=4s");
    let c = client(&url).await;
    let before = distlock_testkit::failover::fences_of(&c, "crash", 5).await;
    let top = *before.iter().max().unwrap();
    drop(c);
    tokio::task::block_in_place(|| zk.servers_mut()[0].restart());
    let fresh = client(&url).await;
    let g =
        distlock_testkit::failover::acquire_within(&fresh, "crash", Duration::from_secs(20)).await;
    assert!(g.fence().unwrap() > top, "{:?} after {top}", g.fence());
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

/// A leader cut off from ZooKeeper until its session expires on the server (its node goes,
/// and a follower leads) ends its leadership at once, long before its 30 s lease: it stops
/// trusting the session when the connection is lost, and after the partition it finds the
/// session expired. It never leads alongside the follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_session_expires_steps_down_at_once() {
    use distlock_testkit::{FaultProxy, LinkMode};
    let Some(zk) = ZooKeeper::start() else { return };
    let proxy = FaultProxy::start(([127, 0, 0, 1], zk.servers()[0].port()).into())
        .await
        .unwrap();
    let params = "?session_timeout=1s&response_timeout=500ms";
    let leader = client_of(
        ZkBackend::connect(&format!("zk://127.0.0.1:{}{params}", proxy.port()))
            .await
            .unwrap(),
        Duration::from_secs(30),
        None,
    );
    let follower = client(&zk.url(params)).await;
    let leading = leader
        .election("zk-leader")
        .value("a")
        .campaign()
        .await
        .unwrap();
    let next = tokio::spawn(async move {
        let l = follower
            .election("zk-leader")
            .value("b")
            .ttl(Duration::from_secs(30))
            .campaign()
            .await
            .unwrap();
        (l, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    proxy.set(LinkMode::Blackhole);
    let why = tokio::time::timeout(Duration::from_secs(10), leading.lost())
        .await
        .expect("leadership ends");
    let ended = Instant::now();
    assert!(!leading.is_leading(), "{why}");
    assert!(
        ended.duration_since(t0) < Duration::from_secs(2),
        "ended {:?} after the partition",
        ended.duration_since(t0)
    );
    let (new, led) = tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("the follower leads once the session expired")
        .unwrap();
    assert!(
        led > ended,
        "the follower led before the old leader stepped down"
    );
    assert!(new.epoch() > leading.epoch());
    proxy.set(LinkMode::Pass);
    assert!(new.resign().await.unwrap().was_held());
}

/// A single-name waiter queued behind a multi-name holder's node watches it, and takes the
/// name as soon as the holder releases, with a fence (`czxid`) above the holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_name_waiter_wakes_when_a_multi_name_holder_releases() {
    let Some(zk) = ZooKeeper::start() else { return };
    let url = zk.url("");
    let raw = zookeeper_client::Client::connect(&url["zk://".len()..])
        .await
        .unwrap();
    let holder = client(&url).await;
    let waiter = client(&url).await;
    let parent = holder
        .engine::<ZkBackend>()
        .expect("the engine")
        .lock_path("mwake-b");
    let g = holder
        .lock_many(["mwake-a", "mwake-b"])
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    let held_fence = g.fence("mwake-b").expect("a fence");
    assert_eq!(g.fence("mwake-a"), Some(held_fence), "one multi, one zxid");
    let task = tokio::spawn(async move {
        let got = waiter
            .lock("mwake-b")
            .wait_timeout(Duration::from_secs(30))
            .acquire()
            .await;
        (got, Instant::now())
    });
    // Queued for good: the holder's node and the waiter's.
    let t0 = Instant::now();
    loop {
        let before = children(&raw, &parent).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        if before.len() == 2 && children(&raw, &parent).await == before {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "never queued");
    }
    assert!(
        !task.is_finished(),
        "took a name the multi-name holder held"
    );
    let released = Instant::now();
    assert_eq!(g.release().await.unwrap(), Released::Held);
    let (got, at) = task.await.unwrap();
    let got = got.expect("the name after the release");
    let woke = at.saturating_duration_since(released);
    assert!(
        woke < Duration::from_secs(2),
        "woke {woke:?} after the release"
    );
    assert!(got.fence().unwrap() > held_fence);
    assert_eq!(got.release().await.unwrap(), Released::Held);
    assert!(
        children(&raw, &parent).await.is_empty(),
        "nothing left behind"
    );
}

/// A multi-name attempt that finds one name held deletes every node it made, in one `multi`,
/// before it answers busy: no queue keeps a node of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_multi_name_attempt_leaves_no_node() {
    let Some(zk) = ZooKeeper::start() else { return };
    let url = zk.url("");
    let raw = zookeeper_client::Client::connect(&url["zk://".len()..])
        .await
        .unwrap();
    let a = client(&url).await;
    let b = client(&url).await;
    let engine = b.engine::<ZkBackend>().expect("the engine");
    let names = ["mbusy-a", "mbusy-b", "mbusy-c"];
    let held = a.acquire("mbusy-b").await.unwrap();
    assert!(b.lock_many(names).try_acquire().await.unwrap().is_none());
    for (i, name) in names.iter().enumerate() {
        let left = children(&raw, &engine.lock_path(name)).await;
        assert_eq!(left.len(), usize::from(i == 1), "{name}: {left:?}");
    }
    assert_eq!(held.release().await.unwrap(), Released::Held);
    let g = b
        .lock_many(names)
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    assert_eq!(g.release().await.unwrap(), Released::Held);
}
