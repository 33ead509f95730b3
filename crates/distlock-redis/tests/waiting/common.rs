//! What the waiting tests share: a client of a test server, its engine, the options they take
//! locks with, an acquire in a task of its own, and the server's command counts.

use std::time::Duration;

use distlock_core::{LockClient, LockOptions};
use distlock_redis::RedisBackend;
use distlock_testkit::RedisServer;

pub(crate) async fn client(server: &RedisServer, options: LockOptions) -> LockClient {
    let backend = RedisBackend::connect(&server.url()).await.expect("connect");
    LockClient::builder(backend).options(options).build()
}

/// The engine under `c`, for its key layout and counters.
pub(crate) fn redis(c: &LockClient) -> &RedisBackend {
    c.engine().expect("a Redis client")
}

pub(crate) fn ttl(ms: u64) -> distlock_core::LockOptionsBuilder {
    LockOptions::builder().ttl(Duration::from_millis(ms))
}

/// A 30 s lease and a long wake fallback: only an event (or a hand-over) wakes a waiter early.
pub(crate) fn event_only(fallback_secs: u64) -> LockOptions {
    ttl(30_000)
        .wake_fallback(Duration::from_secs(fallback_secs))
        .build()
        .unwrap()
}

/// `c.acquire(key)` in a task of its own.
pub(crate) fn spawn_acquire(
    c: &LockClient,
    key: &'static str,
) -> tokio::task::JoinHandle<distlock_core::LockGuard> {
    let c = c.clone();
    tokio::spawn(async move { c.acquire(key).await.unwrap() })
}

/// How many times the server ran `command`.
pub(crate) fn calls(server: &RedisServer, command: &str) -> u64 {
    server.commandstats().get(command).copied().unwrap_or(0)
}
