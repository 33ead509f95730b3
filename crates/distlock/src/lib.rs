#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod builder;
mod schemes;

pub use builder::{ClientBuilder, client};
pub use distlock_core::{
    Backend, Backoff, BoxError, DEFAULT_HANDOFF_STREAK, DEFAULT_OBSERVE_INTERVAL,
    DEFAULT_PARTITIONS, DEFAULT_WAKE_FALLBACK, DowngradeError, Election, ErrorKind, Fence, Fenced,
    FencedClient, Fencing, Group, GroupWatch, Guard, HolderStatus, IntoBackend, KeyOwner, Leader,
    Leadership, LeakedLease, LeaseEnd, LeaseHandle, LeaseKind, ListedLock, Listing, LockClient,
    LockClientBuilder, LockError, LockGuard, LockOptions, LockOptionsBuilder, LockRequest,
    LockStatus, LostReason, MAX_GROUP_LEN, MAX_KEY_LEN, MAX_MEMBER_LEN, MAX_NAMES, MAX_PARTITIONS,
    MAX_PERMITS, MAX_TTL, MAX_VALUE_LEN, ManyLockRequest, Member, Membership, MultiGuard, Observer,
    Owned, OwnershipEvent, PartitionState, Permit, ReadGuard, Released, Token, View, Wait,
    WriteGuard, default_drift, validate_key,
};
pub use schemes::{connect, open_backend, supported_schemes};

/// The clock lease deadlines are measured on: the system's monotonic clock, or a manual one
/// that a test moves by hand (`LockClientBuilder::clock`).
pub mod clock {
    pub use distlock_core::{Clock, ManualClock, SystemClock};
}

/// Helpers for command-line tools and scripts built on distlock, as the `distlock` command
/// uses them: durations as people write them, an error with its causes on one line, the
/// default holder label, the engines this build has, and opening a URL within a time budget.
pub mod tools {
    pub use crate::schemes::{engines, open_backend_within};
    pub use distlock_core::{default_owner, error_chain, parse_duration};
}

/// Metrics through the `metrics` facade (feature `metrics`): see
/// [`distlock_core::metrics`] for the names and labels.
pub mod metrics {
    pub use distlock_core::metrics::*;
}

/// The lock's `tracing` spans (`distlock.acquire`, `distlock.attempt`, `distlock.release`,
/// `distlock.renew`): see [`distlock_core::trace`] for their fields.
pub mod trace {
    pub use distlock_core::trace::*;
}

/// URL helpers: where a password goes in each engine's URL (so it can come from a file or the
/// environment rather than the command line), and the form of a URL fit for logs.
pub mod url {
    pub use distlock_core::url::{is_secret_param, percent_encode, redact, with_password};
}

/// For those who write an engine, or code that drives one directly: the [`Backend`] trait
/// (object-safe: a client holds its engine as `dyn Backend`) and its types, and the helpers the
/// bundled engines share (URL parsing, holder values, wake-ups).
///
/// An application that takes locks needs none of this: [`connect`], [`LockClient`] and
/// [`LockGuard`] are the whole API.
pub mod engine {
    pub use distlock_core::engine::*;
}

/// What the bundled engines share beyond the engine interface: the session pool of the
/// database engines, the predecessor queue of etcd and ZooKeeper, wake-ups and small helpers.
/// For those who write an engine; an application needs none of it.
pub mod recipes {
    pub use distlock_core::recipes::*;
}

/// The Redis engines: one server, Sentinel, Cluster and Redlock (feature `redis`), and the
/// fenced writes to a resource kept in Redis.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis {
    /// The Redis client (redis-rs) whose connections [`fenced_set`] and [`fenced_get`] take.
    pub use distlock_redis::redis as client;
    pub use distlock_redis::{
        ClusterConfig, RedisBackend, RedisConfig, RedlockBackend, RedlockConfig, SentinelBackend,
        SentinelConfig, fenced_get, fenced_set, lock_error, resource_connection,
    };
}

/// The etcd engine (feature `etcd`).
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub mod etcd {
    pub use distlock_etcd::{EtcdBackend, EtcdConfig};
}

/// The PostgreSQL engine (feature `postgres`), the fenced `UPDATE` and the
/// transaction-scoped lock.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres {
    /// The client library, whose `Client` runs [`FencedUpdate`] and the statements of an
    /// [`XactLock`]'s transaction.
    pub use distlock_postgres::tokio_postgres;
    pub use distlock_postgres::{FencedUpdate, PgBackend, PgConfig, XactLock, lock_id};
}

/// The MySQL/MariaDB engine (feature `mysql`).
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql {
    pub use distlock_mysql::{MysqlBackend, MysqlConfig, lock_name};
}

/// The memcached engine (feature `memcached`): no fencing.
#[cfg(feature = "memcached")]
#[cfg_attr(docsrs, doc(cfg(feature = "memcached")))]
pub mod memcached {
    pub use distlock_memcached::{MemcachedBackend, MemcachedConfig};
}

/// The ZooKeeper engine (feature `zookeeper`).
#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub mod zookeeper {
    pub use distlock_zookeeper::{ZkBackend, ZkConfig};
}

/// The embedded file engine (feature `file`): `flock` on local files, one host.
#[cfg(feature = "file")]
#[cfg_attr(docsrs, doc(cfg(feature = "file")))]
pub mod file {
    pub use distlock_file::{FileBackend, default_dir};
}
