//! A server out of connections, as a database engine's tests meet it: a wait outlasts it.

use std::time::Duration;

use distlock_core::{ErrorKind, LockClient, LockError, Released};

/// With the server refusing new connections (the test took every slot): `quick`'s attempt on
/// `name` fails as `Exhausted` at once, while `waiter`'s wait for it goes on; once `free`
/// resolves (the test gave slots back), the wait takes the lock. Returns `quick`'s error, for
/// the engine's own checks of its message.
///
/// # Panics
/// When any of that does not happen.
pub async fn a_wait_outlasts_exhaustion(
    quick: &LockClient,
    waiter: LockClient,
    name: &'static str,
    free: impl std::future::Future<Output = ()>,
) -> LockError {
    let refused = quick
        .try_acquire(name)
        .await
        .expect_err("no connection for it");
    assert_eq!(refused.kind(), ErrorKind::Exhausted, "{refused}");
    let waiting = tokio::spawn(async move {
        let g = waiter.acquire(name).await;
        (waiter, g)
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !waiting.is_finished(),
        "the wait ended while no connection was free"
    );
    free.await;
    let (_waiter, g) = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("taken once a connection was free")
        .unwrap();
    let g = g.expect("the lock, after waiting");
    assert_eq!(g.release().await.unwrap(), Released::Held);
    refused
}

/// Takes every connection slot of a server: opens connections with `connect` until the server
/// refuses one, then again after a pause for as long as a round takes any (a client's setup
/// connection closes in the background, and the slot it frees late would let a request that
/// should find none through). The connections, and the last refusal.
///
/// # Panics
/// When the server accepts 64 connections, or keeps freeing slots for ten rounds.
pub async fn fill_every_slot<C, E, Fut>(mut connect: impl FnMut() -> Fut) -> (Vec<C>, E)
where
    Fut: std::future::Future<Output = Result<C, E>>,
{
    let mut fillers = Vec::new();
    for _ in 0..10 {
        let before = fillers.len();
        let refused = loop {
            match connect().await {
                Ok(c) => fillers.push(c),
                Err(e) => break e,
            }
            assert!(fillers.len() < 64, "the server kept accepting connections");
        };
        if fillers.len() == before && before > 0 {
            return (fillers, refused);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the server kept freeing connection slots");
}
