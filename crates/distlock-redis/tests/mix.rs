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
                        client.write_lock("mix")
                    } else {
                        client.read_lock("mix")
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
