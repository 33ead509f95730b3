//! Helpers for tests that fail a deployment over: take a lock while the servers change hands.

use std::time::{Duration, Instant};

use distlock_core::{LockClient, LockGuard};

/// Tries `key` with `try_acquire` until it is taken, for `limit` (errors while a fail-over
/// runs are retried every 100 ms); panics when someone else holds it, or after `limit` with
/// the last error.
pub async fn acquire_within(client: &LockClient, key: &str, limit: Duration) -> LockGuard {
    let deadline = Instant::now() + limit;
    loop {
        match client.try_acquire(key).await {
            Ok(Some(g)) => return g,
            Ok(None) => panic!("{key} is held by someone else"),
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "no acquire of {key} within {limit:?}: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Takes and releases `key` `times` times, and returns the fences it was given (an engine
/// with fences).
pub async fn fences_of(client: &LockClient, key: &str, times: usize) -> Vec<u64> {
    let mut fences = Vec::with_capacity(times);
    for _ in 0..times {
        let g = client
            .try_acquire(key)
            .await
            .expect("acquire")
            .expect("free");
        fences.push(g.fence().expect("a fenced engine"));
        assert_eq!(
            g.release().await.expect("release"),
            distlock_core::Released::Held
        );
    }
    fences
}
