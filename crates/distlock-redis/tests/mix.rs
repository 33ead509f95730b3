//! A read-write lock under a 90 % read / 10 % write load from several clients, each with many
//! tasks: every task keeps getting the lock (no lease handed to a client that never uses it).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use distlock_core::{LockClient, LockOptions};
use distlock_redis::RedisBackend;
use distlock_testkit::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_mostly_load_from_four_clients_never_stalls() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let reads = Arc::new(AtomicU64::new(0));
    let writes = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let end = Instant::now() + Duration::from_secs(4);
    for c in 0..4u64 {
        let backend = RedisBackend::connect(&url).await.expect("connect");
        let client = LockClient::builder(backend)
            .options(
                LockOptions::builder()
                    .ttl(Duration::from_secs(10))
                    .build()
                    .unwrap(),
            )
            .build();
        for t in 0..16u64 {
            let (client, reads, writes) = (client.clone(), reads.clone(), writes.clone());
            tasks.push(tokio::spawn(async move {
                let mut x = c * 1000 + t + 1;
                let mut worst = Duration::ZERO;
                while Instant::now() < end {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let write = x % 10 == 0;
                    let t0 = Instant::now();
                    let req = if write {
                        client.lock("mix")
                    } else {
                        client.lock("mix").shared()
                    };
                    let g = req
                        .wait_timeout(Duration::from_secs(8))
                        .acquire()
                        .await
                        .expect("the lock within 8 s");
                    worst = worst.max(t0.elapsed());
                    if write {
                        writes.fetch_add(1, Ordering::Relaxed);
                    } else {
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                    assert!(g.release().await.unwrap().was_held());
                }
                worst
            }));
        }
    }
    let monitor = {
        let (reads, writes) = (reads.clone(), writes.clone());
        tokio::spawn(async move {
            let mut last = 0;
            let mut same = 0;
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let n = reads.load(Ordering::Relaxed) + writes.load(Ordering::Relaxed);
                if n == last {
                    same += 1
                } else {
                    same = 0
                }
                last = n;
                // A second with no acquisition, before the end: stalled.
                if same == 4 && Instant::now() < end {
                    return true;
                }
                if Instant::now() > end {
                    return false;
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    loop {
        if monitor.is_finished() {
            if !monitor.await.unwrap() {
                break;
            }
            // What the keys held when it stalled, to tell why.
            for cmd in [
                vec!["GET", "distlock:{mix}"],
                vec!["PTTL", "distlock:{mix}"],
                vec!["LRANGE", "distlock:{mix}:waiters", "0", "-1"],
                vec!["ZRANGE", "distlock:{mix}:readers", "0", "-1", "WITHSCORES"],
                vec!["HGETALL", "distlock:{mix}:meta"],
                vec!["KEYS", "*"],
            ] {
                eprintln!("{cmd:?} => {:?}", server.cli(&cmd));
            }
            break;
        }
        if Instant::now() > end + Duration::from_secs(9) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut worst = Duration::ZERO;
    for t in tasks {
        worst = worst.max(t.await.unwrap());
    }
    let (r, w) = (
        reads.load(Ordering::Relaxed),
        writes.load(Ordering::Relaxed),
    );
    eprintln!("{r} reads, {w} writes, longest wait {worst:?}");
    assert!(
        worst < Duration::from_secs(2),
        "a task waited {worst:?} ({r} reads, {w} writes)"
    );
}

/// Waits until `done` holds (5 s at most).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < give_up, "{what}: not within 5 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A release that lets in a client's readers leaves that client's writer queued behind them,
/// and the client must go on believing that its writer's registration is there. Readers were
/// told with the bare lock key, which also says "your registration left the queue": the client
/// forgot its writer's, the writer's next attempt queued its token a second time, and once it
/// had taken the lock by one registration, a release handed the lock to the other one, which
/// no task used. The test above failed that way: a client that stopped just then (the end of
/// the run) left the lock with nobody for its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_queued_behind_its_own_clients_readers_keeps_one_place() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    // Waiters also try every 100 ms: each such attempt would queue the writer again.
    let opts = LockOptions::builder()
        .ttl(Duration::from_secs(30))
        .wake_fallback(Duration::from_millis(100))
        .build()
        .unwrap();
    let connect = || async {
        let backend = RedisBackend::connect(&url).await.expect("connect");
        LockClient::builder(backend).options(opts).build()
    };
    let (holder, waiter) = (connect().await, connect().await);
    let queue = "distlock:{turn}:waiters";
    let queued = || server.cli(&["LLEN", queue]);
    let w = holder.write_lock("turn").acquire().await.unwrap();
    let reader = {
        let c = waiter.clone();
        tokio::spawn(async move { c.read_lock("turn").acquire().await.unwrap() })
    };
    until("the reader queued", || queued() == "1").await;
    let writer = {
        let c = waiter.clone();
        tokio::spawn(async move { c.write_lock("turn").acquire().await.unwrap() })
    };
    until("the writer queued behind it", || queued() == "2").await;
    // Lets the reader in; the writer stays at the head of the queue.
    assert!(w.release().await.unwrap().was_held());
    let r = tokio::time::timeout(Duration::from_secs(2), reader)
        .await
        .expect("the reader was let in")
        .unwrap();
    // The writer, woken with the reader and every 100 ms since, tried again: still one place.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let regs = server.cli(&["LRANGE", queue, "0", "-1"]);
    assert_eq!(regs.lines().count(), 1, "the writer queued twice: {regs}");
    // The reader's release hands the lock to the writer; the writer's leaves it free.
    assert!(r.release().await.unwrap().was_held());
    let g = tokio::time::timeout(Duration::from_secs(2), writer)
        .await
        .expect("the writer was handed the lock")
        .unwrap();
    assert!(g.release().await.unwrap().was_held());
    assert_eq!(queued(), "0");
    assert_eq!(server.cli(&["EXISTS", "distlock:{turn}"]), "0");
}
