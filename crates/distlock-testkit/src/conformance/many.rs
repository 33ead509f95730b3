//! Cases of multi-name locks (`lock_many`), for the engines that take several names at once
//! ([`conformance_many_tests!`](crate::conformance_many_tests)), and the one case every engine
//! runs: it takes them, or says why it cannot.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_core::{ErrorKind, LockClient, Released};

use super::{MakeClient, key, opts};

/// Declares one `#[tokio::test]` per multi-name case, each calling `$setup` for its own
/// fixture (as [`conformance_tests!`](crate::conformance_tests)).
#[macro_export]
macro_rules! conformance_many_tests {
    ($setup:expr) => {
        $crate::conformance_many_tests!(@short $setup);
        $crate::conformance_tests!(@cases $setup; many_names_never_deadlock);
    };
    // The deadlock case for 5 s (`DISTLOCK_DEADLOCK_SECS` overrides it): the 30 s one runs on
    // Redis, and CI's time is shared.
    (@brief $setup:expr) => {
        $crate::conformance_many_tests!(@short $setup);
        $crate::conformance_tests!(@cases $setup; many_names_never_deadlock_briefly);
    };
    // Without the 30 s deadlock case (run on another setup of the same engine).
    (@short $setup:expr) => {
        $crate::conformance_tests!(@cases $setup;
            many_names_are_taken_all_or_none,
            many_names_fence_each_name_above_its_single_holders,
            a_many_name_waiter_holds_nothing_and_wakes_on_release,
            many_names_are_renewed_and_lost_together,
            many_names_refuse_bad_input
        );
    };
}

/// `n` fresh names of one case, with one hash tag (a Redis Cluster takes several names at once
/// only in one slot).
fn names(case: &str, n: usize) -> Vec<String> {
    let base = key(case);
    (0..n).map(|i| format!("{{{base}}}:{i}")).collect()
}

/// Every engine: `lock_many` takes the names, or is `Unsupported` and says why.
pub async fn lock_many_takes_the_names_or_says_why(make: &impl MakeClient) {
    let c = make.client(opts().build().unwrap()).await;
    let n = names("many-or-why", 2);
    match c.lock_many(n.clone()).try_acquire().await {
        Ok(Some(g)) => {
            assert_eq!(g.names(), n.as_slice());
            assert_eq!(g.release().await.unwrap(), Released::Held);
        }
        Ok(None) => panic!("two fresh names were busy"),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            assert!(
                e.to_string().contains("cannot take several names at once:"),
                "{e}"
            );
        }
    }
}

/// One busy name makes the attempt fail and leaves every other name free; once it is free,
/// all are taken, in sorted order, and each is busy for a single-name lock.
pub async fn many_names_are_taken_all_or_none(make: &impl MakeClient) {
    let a = make.client(opts().build().unwrap()).await;
    let b = make.client(opts().build().unwrap()).await;
    let n = names("many-all", 3);
    let held = a.try_acquire(&n[1]).await.unwrap().expect("a free name");
    let asked = vec![n[2].clone(), n[1].clone(), n[0].clone(), n[2].clone()];
    assert!(
        b.lock_many(asked.clone())
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "taken while one name was held"
    );
    let busy = b.lock_many(asked.clone()).no_wait().acquire().await;
    assert_eq!(busy.map(|_| ()).map_err(|e| e.kind()), Err(ErrorKind::Busy));
    for free in [&n[0], &n[2]] {
        let g = a.try_acquire(free).await.unwrap();
        let g = g.unwrap_or_else(|| panic!("{free} was left taken by a failed attempt"));
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
    assert_eq!(held.release().await.unwrap(), Released::Held);
    let g = b
        .lock_many(asked)
        .try_acquire()
        .await
        .unwrap()
        .expect("every name free");
    assert_eq!(g.names(), n.as_slice(), "distinct and sorted");
    assert_eq!(g.fences().len(), 3);
    for name in &n {
        assert!(a.try_acquire(name).await.unwrap().is_none(), "{name} free");
    }
    assert!(
        a.lock_many([n[0].clone(), n[2].clone()])
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(g.release().await.unwrap(), Released::Held);
    for name in &n {
        let g = a.try_acquire(name).await.unwrap();
        assert_eq!(
            g.expect("released").release().await.unwrap(),
            Released::Held
        );
    }
}

/// Each name's fence rises across single-name and multi-name holders alike.
pub async fn many_names_fence_each_name_above_its_single_holders(make: &impl MakeClient) {
    let c = make.client(opts().build().unwrap()).await;
    if c.backend().capabilities().fencing != distlock_core::Fencing::Monotonic {
        return;
    }
    let n = names("many-fence", 3);
    let mut last: HashMap<String, u64> = HashMap::new();
    let mut note = |name: &str, fence: Option<u64>| {
        let f = fence.unwrap_or_else(|| panic!("no fence for {name}"));
        if let Some(before) = last.insert(name.to_owned(), f) {
            assert!(f > before, "{name}: fence {f} after {before}");
        }
    };
    for round in 0..3 {
        let g = c.try_acquire(&n[round % 3]).await.unwrap().expect("free");
        note(&n[round % 3], g.fence());
        assert_eq!(g.release().await.unwrap(), Released::Held);
        let g = c
            .lock_many(n.clone())
            .try_acquire()
            .await
            .unwrap()
            .expect("free");
        for (name, fence) in g.names().iter().zip(g.fences()) {
            note(name, *fence);
            assert_eq!(g.fence(name), *fence);
        }
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
}

/// A waiter holds none of its names while one is busy, and takes them all soon after the
/// release.
pub async fn a_many_name_waiter_holds_nothing_and_wakes_on_release(make: &impl MakeClient) {
    let a = make.client(opts().build().unwrap()).await;
    let b = make.client(opts().build().unwrap()).await;
    let n = names("many-wait", 3);
    let held = a.try_acquire(&n[2]).await.unwrap().expect("free");
    let waiter = {
        let (b, n) = (b.clone(), n.clone());
        tokio::spawn(async move {
            b.lock_many(n)
                .wait_timeout(Duration::from_secs(20))
                .acquire()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "took the names while one was held");
    // Nothing held while waiting: the other names come and go.
    for name in &n[..2] {
        let g = a.try_acquire(name).await.unwrap();
        let g = g.unwrap_or_else(|| panic!("the waiter holds {name}"));
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
    let released = Instant::now();
    assert_eq!(held.release().await.unwrap(), Released::Held);
    let g = waiter.await.unwrap().expect("the names after the release");
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "woke {:?} after the release",
        released.elapsed()
    );
    assert_eq!(g.release().await.unwrap(), Released::Held);
}

/// The watchdog renews all the names as one lease, and breaking one loses the whole guard.
pub async fn many_names_are_renewed_and_lost_together(make: &impl MakeClient) {
    let short = opts().ttl(Duration::from_millis(1500)).build().unwrap();
    let c = make.client(short).await;
    let other = make.client(opts().build().unwrap()).await;
    let n = names("many-renew", 2);
    let g = c
        .lock_many(n.clone())
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(g.is_held(), "not renewed");
    for name in &n {
        assert!(
            other.try_acquire(name).await.unwrap().is_none(),
            "{name} ran out"
        );
    }
    if other.backend().breaker().is_none() {
        assert_eq!(g.release().await.unwrap(), Released::Held);
        return;
    }
    other.force_release(&n[1]).await.unwrap().expect("broken");
    let lost = tokio::time::timeout(Duration::from_secs(5), g.lost()).await;
    assert!(lost.is_ok(), "breaking one name did not lose the guard");
    assert!(!g.is_held());
    assert!(matches!(g.release().await, Ok(Released::Lost(_)) | Err(_)));
    // The release of a lost guard frees what was still ours.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(x) = other.try_acquire(&n[0]).await.unwrap() {
            assert_eq!(x.release().await.unwrap(), Released::Held);
            break;
        }
        assert!(Instant::now() < deadline, "{} stayed taken", n[0]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// No names, a bad name or too many: `InvalidKey`, with nothing taken; one name is a single
/// lock.
pub async fn many_names_refuse_bad_input(make: &impl MakeClient) {
    let c = make.client(opts().build().unwrap()).await;
    let none: Vec<String> = Vec::new();
    let e = c.lock_many(none).try_acquire().await.expect_err("no names");
    assert_eq!(e.kind(), ErrorKind::InvalidKey);
    let n = names("many-bad", 1);
    let e = c
        .lock_many([n[0].clone(), "bad\nname".to_owned()])
        .try_acquire()
        .await
        .expect_err("a control character");
    assert_eq!(e.kind(), ErrorKind::InvalidKey);
    let too_many = (0..=distlock_core::MAX_NAMES).map(|i| format!("{}-{i}", n[0]));
    let e = c
        .lock_many(too_many)
        .try_acquire()
        .await
        .expect_err("too many");
    assert_eq!(e.kind(), ErrorKind::InvalidKey);
    let one = c
        .lock_many([n[0].clone(), n[0].clone()])
        .try_acquire()
        .await;
    let one = one.unwrap().expect("one free name");
    assert_eq!(one.names().len(), 1);
    assert!(c.try_acquire(&n[0]).await.unwrap().is_none());
    assert_eq!(one.release().await.unwrap(), Released::Held);
}

/// A small generator of its own (the test kit takes no `rand`).
struct Xorshift(u64);

impl Xorshift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// How long the deadlock case runs: `DISTLOCK_DEADLOCK_SECS`, else `default` seconds.
fn deadlock_secs(default: u64) -> u64 {
    std::env::var("DISTLOCK_DEADLOCK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// [`many_names_never_deadlock`] for 5 s.
pub async fn many_names_never_deadlock_briefly(make: &impl MakeClient) {
    never_deadlock(make, deadlock_secs(5)).await;
}

/// 16 tasks on 4 clients take random overlapping sets of 2 to 5 of 8 names, each set in a
/// random order, for 30 s (`DISTLOCK_DEADLOCK_SECS` overrides it): every task keeps making
/// progress, no name ever has two holders, and each name's fences strictly increase.
pub async fn many_names_never_deadlock(make: &impl MakeClient) {
    never_deadlock(make, deadlock_secs(30)).await;
}

/// [`many_names_never_deadlock`] for `secs` seconds.
async fn never_deadlock(make: &impl MakeClient, secs: u64) {
    let base = names("many-deadlock", 8);
    let mut clients: Vec<LockClient> = Vec::new();
    for _ in 0..4 {
        clients.push(
            make.client(opts().ttl(Duration::from_secs(5)).build().unwrap())
                .await,
        );
    }
    let held: Arc<Vec<AtomicBool>> = Arc::new((0..8).map(|_| AtomicBool::new(false)).collect());
    let fences: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let end = Instant::now() + Duration::from_secs(secs);
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..16).map(|_| AtomicU64::new(0)).collect());
    let mut tasks = Vec::new();
    for t in 0..16usize {
        let (client, base) = (clients[t % 4].clone(), base.clone());
        let (held, fences, violations, counts) = (
            held.clone(),
            fences.clone(),
            violations.clone(),
            counts.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = Xorshift(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x1000_0001));
            while Instant::now() < end {
                let size = 2 + rng.below(4) as usize;
                let mut picked: Vec<usize> = Vec::new();
                while picked.len() < size {
                    let i = rng.below(8) as usize;
                    if !picked.contains(&i) {
                        picked.push(i);
                    }
                }
                let asked: Vec<String> = picked.iter().map(|&i| base[i].clone()).collect();
                let g = match client
                    .lock_many(asked)
                    .wait_timeout(Duration::from_secs(10))
                    .acquire()
                    .await
                {
                    Ok(g) => g,
                    Err(e) => {
                        violations
                            .lock()
                            .unwrap()
                            .push(format!("task {t} made no progress for 10 s: {e}"));
                        return;
                    }
                };
                for (name, fence) in g.names().iter().zip(g.fences()) {
                    let i = base.iter().position(|b| b == name).expect("one of ours");
                    if held[i].swap(true, Ordering::SeqCst) {
                        violations
                            .lock()
                            .unwrap()
                            .push(format!("{name} had two holders"));
                    }
                    if let Some(f) = fence {
                        let mut fences = fences.lock().unwrap();
                        let before = fences.insert(name.clone(), *f);
                        if before.is_some_and(|b| b >= *f) {
                            violations
                                .lock()
                                .unwrap()
                                .push(format!("{name}: fence {f} after {before:?}"));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(rng.below(3))).await;
                for name in g.names() {
                    let i = base.iter().position(|b| b == name).expect("one of ours");
                    held[i].store(false, Ordering::SeqCst);
                }
                if g.release().await.unwrap() != Released::Held {
                    violations
                        .lock()
                        .unwrap()
                        .push(format!("task {t} lost its names"));
                }
                counts[t].fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.expect("a task panicked");
    }
    let violations = violations.lock().unwrap();
    assert!(violations.is_empty(), "{violations:?}");
    let counts: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    eprintln!("acquisitions per task: {counts:?}");
    assert!(
        counts.iter().all(|&c| c > 0),
        "a task never took its names: {counts:?}"
    );
}
