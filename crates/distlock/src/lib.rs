#![doc = include_str!("../../../README.md")]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

pub use distlock_core::*;

/// The Redis engine (feature `redis`).
#[cfg(feature = "redis")]
pub mod redis {
    pub use distlock_redis::{
        ClusterConfig, RedisBackend, RedisConfig, RedlockBackend, RedlockConfig, SentinelBackend,
        SentinelConfig,
    };
}

/// The etcd engine (feature `etcd`).
#[cfg(feature = "etcd")]
pub mod etcd {
    pub use distlock_etcd::{EtcdBackend, EtcdConfig};
}

/// The PostgreSQL engine (feature `postgres`).
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use distlock_postgres::{PgBackend, PgConfig, lock_id};
}

/// The MySQL/MariaDB engine (feature `mysql`).
#[cfg(feature = "mysql")]
pub mod mysql {
    pub use distlock_mysql::{MysqlBackend, MysqlConfig, lock_name};
}

/// The memcached engine (feature `memcached`): no fencing.
#[cfg(feature = "memcached")]
pub mod memcached {
    pub use distlock_memcached::{MemcachedBackend, MemcachedConfig};
}

/// The ZooKeeper engine (feature `zookeeper`).
#[cfg(feature = "zookeeper")]
pub mod zookeeper {
    pub use distlock_zookeeper::{ZkBackend, ZkConfig};
}

/// The embedded file engine (feature `file`).
#[cfg(feature = "file")]
pub mod file {
    pub use distlock_file::{FileBackend, default_dir};
}

/// The URL schemes this build understands, for help texts.
pub fn supported_schemes() -> &'static [&'static str] {
    &[
        #[cfg(feature = "file")]
        "file",
        #[cfg(feature = "redis")]
        "redis",
        #[cfg(feature = "redis")]
        "rediss",
        #[cfg(feature = "redis")]
        "redis+unix",
        #[cfg(feature = "redis")]
        "redlock",
        #[cfg(feature = "redis")]
        "redlocks",
        #[cfg(feature = "redis")]
        "redis+sentinel",
        #[cfg(feature = "redis")]
        "rediss+sentinel",
        #[cfg(feature = "redis")]
        "redis+cluster",
        #[cfg(feature = "redis")]
        "rediss+cluster",
        #[cfg(feature = "etcd")]
        "etcd",
        #[cfg(feature = "zookeeper")]
        "zk",
        #[cfg(feature = "postgres")]
        "postgres",
        #[cfg(feature = "mysql")]
        "mysql",
        #[cfg(feature = "memcached")]
        "memcached",
    ]
}

/// Opens the engine a URL names, for code that picks the engine at run time (the CLI).
///
/// | URL | engine |
/// |---|---|
/// | `file:///var/lock/app`, `file://` | local `flock` files (feature `file`) |
/// | `redis://host:port/db`, `rediss://…`, `redis+unix:///sock` | one Redis server (feature `redis`) |
/// | `redlock://h1:p1,h2:p2,h3:p3` (`redlocks://` for TLS) | Redlock over independent masters (feature `redis`) |
/// | `redis+cluster://h1:p1,h2:p2,…` (`rediss+cluster://` for TLS) | a Redis Cluster, through any of its nodes (feature `redis`) |
/// | `etcd://h1:2379,h2:2379,…` | etcd: FIFO queue by create revision, revision fencing (feature `etcd`) |
/// | `zk://h1:2181,h2:2181[/chroot]` | ZooKeeper: ephemeral sequential nodes, czxid fencing (feature `zookeeper`) |
/// | `postgres://user:pw@host:5432/db` (`postgresql://`) | PostgreSQL session advisory locks, sequence fencing (feature `postgres`) |
/// | `mysql://user:pw@host:3306/db` (`mariadb://`) | MySQL/MariaDB `GET_LOCK`, per-lock counter fencing (feature `mysql`) |
/// | `memcached://host:11211` | memcached `add` with CAS renewals and release, no fencing (feature `memcached`) |
/// | `redis+sentinel://s1:p1,s2:p2/mymaster[/db]` (`rediss+sentinel://` for TLS) | the master Redis Sentinel names, followed across failovers (feature `redis`) |
///
/// # Errors
/// `Config` for a malformed URL or a scheme this build does not support; the engine's connection
/// errors otherwise.
pub async fn open_backend(url: &str) -> Result<AnyBackend, LockError> {
    let scheme = url
        .split_once(':')
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    match scheme.as_str() {
        #[cfg(feature = "file")]
        "file" => Ok(Box::new(distlock_file::FileBackend::from_url(url)?)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+unix" | "unix" | "valkey" | "valkeys" | "redis+cluster"
        | "rediss+cluster" => Ok(Box::new(distlock_redis::RedisBackend::connect(url).await?)),
        #[cfg(feature = "redis")]
        "redlock" | "redlocks" => Ok(Box::new(
            distlock_redis::RedlockBackend::connect(url).await?,
        )),
        #[cfg(feature = "redis")]
        "redis+sentinel" | "rediss+sentinel" => Ok(Box::new(
            distlock_redis::SentinelBackend::connect(url).await?,
        )),
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => Ok(Box::new(distlock_etcd::EtcdBackend::connect(url).await?)),
        #[cfg(feature = "zookeeper")]
        "zk" | "zks" => Ok(Box::new(distlock_zookeeper::ZkBackend::connect(url).await?)),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            Ok(Box::new(distlock_postgres::PgBackend::connect(url).await?))
        }
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(Box::new(distlock_mysql::MysqlBackend::connect(url).await?)),
        #[cfg(feature = "memcached")]
        "memcached" | "memcacheds" => Ok(Box::new(
            distlock_memcached::MemcachedBackend::connect(url).await?,
        )),
        "" => Err(LockError::new(
            ErrorKind::Config,
            format!("{url:?} is not a lock URL (try file:// or redis://host:6379)"),
        )),
        other => Err(LockError::new(
            ErrorKind::Config,
            format!(
                "unsupported lock URL scheme {other:?}; this build supports: {}",
                supported_schemes().join(", ")
            ),
        )),
    }
}

/// A [`LockClient`] over the engine a URL names, with default options.
///
/// # Errors
/// As [`open_backend`].
pub async fn connect(url: &str) -> Result<LockClient<AnyBackend>, LockError> {
    Ok(LockClient::new(open_backend(url).await?))
}
