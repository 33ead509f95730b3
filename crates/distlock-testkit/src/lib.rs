#![doc = include_str!("../README.md")]
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

mod cluster;
pub mod conformance;
mod etcd;
mod exhausted;
pub mod failover;
mod logs;
mod mariadb;
mod memcached;
mod memory;
mod pki;
mod postgres;
mod process;
mod proxy;
mod redis_server;
pub mod seeded;
mod sentinel;
pub mod tls_cases;
pub mod wrong_server;
mod zookeeper;

pub use cluster::RedisCluster;
pub use etcd::{Etcd, EtcdMember};
pub use exhausted::{a_wait_outlasts_exhaustion, fill_every_slot};
pub use logs::Logs;
pub use mariadb::{MARIADB_CERT_USER, MARIADB_PASSWORD_USER, MariaDb};
pub use memcached::Memcached;
pub use memory::{MemoryBackend, MemoryStore};
pub use pki::{CertFiles, Pki};
pub use postgres::{PG_CERT_USER, PG_PASSWORD_USER, Postgres};
pub use process::{free_port, require_binary};
pub use proxy::{FaultProxy, LinkMode};
pub use redis_server::RedisServer;
pub use sentinel::{MASTER_NAME, Sentinels};
pub use zookeeper::{ZkServer, ZooKeeper};

/// A client over `backend` whose locks have `ttl`, and whose waits end after `wait` (the
/// library's default without one): what most tests of an engine start from.
///
/// # Panics
/// For a TTL the options refuse (zero).
pub fn client_of(
    backend: impl distlock_core::IntoBackend,
    ttl: std::time::Duration,
    wait: Option<std::time::Duration>,
) -> distlock_core::LockClient {
    let mut options = distlock_core::LockOptions::builder().ttl(ttl);
    if let Some(wait) = wait {
        options = options.wait_timeout(wait);
    }
    distlock_core::LockClient::builder(backend)
        .options(options.build().unwrap())
        .build()
}
