//! Redlock over five real redis-server masters: dead, frozen and foreign-held masters.

use std::time::{Duration, Instant};

use distlock_core::{Backoff, ErrorKind, LockClient, LockOptions, Released};
use distlock_redis::{RedlockBackend, RedlockConfig};
use distlock_testkit::RedisServer;

fn masters(n: usize) -> Option<Vec<RedisServer>> {
    (0..n).map(|_| RedisServer::start()).collect()
}

fn url(masters: &[RedisServer], params: &str) -> String {
    let hosts: Vec<String> = masters
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port()))
        .collect();
    format!("redlock://{}{params}", hosts.join(","))
}

async fn client(url: &str, options: LockOptions) -> LockClient {
    let backend = RedlockBackend::with_config(RedlockConfig::from_url(url).expect("url"))
        .await
        .expect("connect");
    LockClient::builder(backend).options(options).build()
}

fn opts() -> distlock_core::LockOptionsBuilder {
    LockOptions::builder()
        .ttl(Duration::from_secs(10))
        .backoff(Backoff::new(Duration::from_millis(1), Duration::from_millis(10)).unwrap())
}

fn holds(master: &RedisServer, key: &str) -> bool {
    !master.cli(&["GET", key]).trim().is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dead_masters_of_five_do_not_stop_acquisitions() {
    let Some(mut ms) = masters(5) else { return };
    let c = client(&url(&ms, ""), opts().build().unwrap()).await;
    ms[1].kill();
    ms[3].kill();
    for i in 0..5 {
        let g = c
            .try_acquire(&format!("two-dead-{i}"))
            .await
            .expect("three of five answer")
            .expect("free lock");
        assert!(g.is_held());
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_dead_masters_of_five_fail_the_acquire_and_leave_no_key() {
    let Some(mut ms) = masters(5) else { return };
    let c = client(&url(&ms, ""), opts().build().unwrap()).await;
    for m in &mut ms[..3] {
        m.kill();
    }
    let e = c.try_acquire("three-dead").await.expect_err("no majority");
    assert_eq!(
        e.kind(),
        ErrorKind::QuorumNotReached { got: 2, needed: 3 },
        "{e}"
    );
    let key = c
        .engine::<RedlockBackend>()
        .expect("the engine")
        .lock_key("three-dead");
    for m in &ms[3..] {
        assert!(
            !holds(m, &key),
            "a live master kept the failed attempt's key"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_costs_at_most_the_node_timeout() {
    let Some(ms) = masters(5) else { return };
    let c = client(&url(&ms, "?node_timeout=100ms"), opts().build().unwrap()).await;
    // Warm every connection first.
    let warm = c
        .try_acquire("frozen-warm")
        .await
        .unwrap()
        .expect("free lock");
    assert_eq!(warm.release().await.unwrap(), Released::Held);
    ms[2].pause();
    let mut worst = Duration::ZERO;
    for i in 0..5 {
        let t = Instant::now();
        let g = c
            .try_acquire(&format!("frozen-{i}"))
            .await
            .expect("four of five answer")
            .expect("free lock");
        worst = worst.max(t.elapsed());
        drop(g);
    }
    ms[2].resume();
    assert!(
        worst < Duration::from_millis(100) + Duration::from_millis(60),
        "{worst:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_validity_loses_the_lock_to_the_next() {
    let Some(ms) = masters(5) else { return };
    let u = url(&ms, "");
    let ttl = Duration::from_millis(400);
    let a = client(&u, opts().ttl(ttl).auto_renew(false).build().unwrap()).await;
    let b = client(&u, opts().ttl(ttl).build().unwrap()).await;
    let ga = a.try_acquire("paused").await.unwrap().expect("free");
    assert!(
        b.try_acquire("paused").await.unwrap().is_none(),
        "held by a"
    );
    // a "pauses" (no renewal) beyond its validity.
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let gb = b
        .try_acquire("paused")
        .await
        .unwrap()
        .expect("a's lease ran out");
    assert!(
        !ga.is_held(),
        "the paused holder's guard still claims the lock"
    );
    tokio::time::timeout(Duration::from_millis(10), ga.lost())
        .await
        .expect("lost() has fired");
    assert!(!ga.release().await.unwrap().was_held());
    assert!(gb.is_held(), "a's late release must not touch b's lock");
    assert_eq!(gb.release().await.unwrap(), Released::Held);
}

/// Catches the seeded bug `half-quorum`: a foreign majority must keep us out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_a_foreign_majority_keeps_the_lock() {
    let Some(ms) = masters(5) else { return };
    let c = client(&url(&ms, ""), opts().build().unwrap()).await;
    let key = c
        .engine::<RedlockBackend>()
        .expect("the engine")
        .lock_key("foreign");
    for m in &ms[..3] {
        m.cli(&["SET", &key, "someone-else", "PX", "30000"]);
    }
    assert!(
        c.try_acquire("foreign").await.unwrap().is_none(),
        "acquired with two masters of five"
    );
}

/// Catches the seeded bug `keep-partial`: a failed attempt takes back its copies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_a_failed_attempt_leaves_no_copy_behind() {
    let Some(ms) = masters(5) else { return };
    let c = client(&url(&ms, ""), opts().build().unwrap()).await;
    let key = c
        .engine::<RedlockBackend>()
        .expect("the engine")
        .lock_key("partial");
    for m in &ms[2..] {
        m.cli(&["SET", &key, "someone-else", "PX", "30000"]);
    }
    assert!(c.try_acquire("partial").await.unwrap().is_none());
    for m in &ms[..2] {
        assert!(!holds(m, &key), "a copy of the failed attempt stayed");
    }
}

/// A wait budget rides through a majority of masters out for a while (a minority never
/// stops an acquire): `try_acquire` fails at once with the missed quorum, an acquire with a
/// budget gets the lock once they answer again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_budget_rides_through_a_majority_of_masters_paused() {
    let Some(ms) = masters(3) else { return };
    let c = client(&url(&ms, "?node_timeout=100ms"), opts().build().unwrap()).await;
    ms[0].pause();
    let g = c
        .try_acquire("minority")
        .await
        .unwrap()
        .expect("two of three answer");
    assert_eq!(g.release().await.unwrap(), Released::Held);
    ms[1].pause();
    let e = c.try_acquire("majority").await.expect_err("one of three");
    assert!(
        matches!(e.kind(), ErrorKind::QuorumNotReached { .. }),
        "{e}"
    );
    let t0 = Instant::now();
    let waiting = {
        let c = c.clone();
        tokio::spawn(async move {
            let budget = opts()
                .wait_timeout(Duration::from_secs(20))
                .build()
                .unwrap();
            c.lock("majority").options(budget).acquire().await
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!waiting.is_finished(), "no quorum yet");
    ms[0].resume();
    ms[1].resume();
    let g = waiting.await.unwrap().expect("rode through");
    assert!(t0.elapsed() >= Duration::from_millis(1500));
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

/// A name another client holds on a majority of masters makes `lock_many` fail, and the
/// attempt leaves every name free on every master: its copies on the masters where it got all
/// the names are taken back, and the other client's copies are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_held_on_a_majority_fails_lock_many_and_leaves_every_name_free() {
    let Some(ms) = masters(5) else { return };
    let u = url(&ms, "");
    let c = client(&u, opts().build().unwrap()).await;
    let other = client(&u, opts().build().unwrap()).await;
    let names = ["many-a", "many-b", "many-c"];
    let engine = c.engine::<RedlockBackend>().expect("the engine");
    let keys: Vec<String> = names.iter().map(|n| engine.lock_key(n)).collect();
    let held = other
        .try_acquire(names[1])
        .await
        .unwrap()
        .expect("a free name");
    // The other client keeps its copy on three masters of five only: a majority.
    for m in &ms[3..] {
        m.cli(&["DEL", &keys[1]]);
    }
    let theirs = ms[0].cli(&["GET", &keys[1]]);
    assert!(
        c.lock_many(names).try_acquire().await.unwrap().is_none(),
        "taken with a name held on a majority"
    );
    let busy = c.lock_many(names).no_wait().acquire().await;
    assert_eq!(busy.map(|_| ()).map_err(|e| e.kind()), Err(ErrorKind::Busy));
    for (i, m) in ms.iter().enumerate() {
        for (key, name) in keys.iter().zip(names) {
            let on_master = m.cli(&["GET", key]);
            if name == names[1] && i < 3 {
                assert_eq!(on_master, theirs, "master {i}: the holder's copy of {name}");
            } else {
                assert!(
                    on_master.trim().is_empty(),
                    "master {i} kept {name} for the failed attempt: {on_master:?}"
                );
            }
        }
    }
    assert_eq!(held.release().await.unwrap(), Released::Held);
    let g = c
        .lock_many(names)
        .try_acquire()
        .await
        .unwrap()
        .expect("every name free");
    for m in &ms {
        for key in &keys {
            assert!(holds(m, key), "a master without {key}");
        }
    }
    assert_eq!(g.release().await.unwrap(), Released::Held);
    for m in &ms {
        for key in &keys {
            assert!(!holds(m, key), "{key} stayed after the release");
        }
    }
}
