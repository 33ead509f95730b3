//! The conformance case of a lease left to run out by itself (`release_after` on an engine
//! whose leases outlive their holder): a cron job's lock that stays taken for its period after
//! its process has gone.

use std::time::{Duration, Instant};

use distlock_core::Released;

use super::{MakeClient, key, opts};

/// `release_after(1.5 s)`: where the engine's leases outlive their holder (`lingers`), it
/// returns at once, and the lock stays taken until then, even once the holder's client is
/// gone (its sessions closed, as when its process exits), then frees by itself (within the
/// engine's rounding: whole seconds on etcd and memcached), the next holder's fence higher.
/// Elsewhere it keeps the lock until then and releases it.
pub async fn a_lease_left_runs_out_by_itself(make: &impl MakeClient) {
    let o = opts().build().unwrap();
    let (a, b) = (make.client(o).await, make.client(o).await);
    let k = key("linger");
    // The time counts from when the acquire was sent.
    let t0 = Instant::now();
    let g = a.acquire(&k).await.expect("acquire");
    let (lingers, fence) = (g.lingers(), g.fence());
    let t1 = Instant::now();
    let left = g
        .release_after(Duration::from_millis(1500))
        .await
        .expect("release_after");
    let took = t1.elapsed();
    assert_eq!(left, Released::Held);
    if !lingers {
        assert!(
            t0.elapsed() >= Duration::from_millis(1500),
            "released early: {:?} after the acquire was sent",
            t0.elapsed()
        );
        let again = b.try_acquire(&k).await.expect("try_acquire");
        assert!(again.is_some(), "not released after the hold");
        return;
    }
    assert!(
        took < Duration::from_millis(700),
        "waited {took:?} to leave the lease"
    );
    drop(a);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        b.try_acquire(&k).await.expect("try_acquire").is_none(),
        "a left lease was free at once"
    );
    let st = b.status(&k).await.expect("status");
    assert!(st.held, "a left lease is not shown held: {st:?}");
    loop {
        if let Some(next) = b.try_acquire(&k).await.expect("try_acquire") {
            assert!(
                t0.elapsed() >= Duration::from_millis(1450),
                "free before its time: {:?} after the acquire was sent",
                t0.elapsed()
            );
            if let (Some(before), Some(after)) = (fence, next.fence()) {
                assert!(after > before, "fence {after} after {before}");
            }
            assert_eq!(next.release().await.expect("release"), Released::Held);
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(6),
            "a left lease never ran out"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
