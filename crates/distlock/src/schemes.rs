//! From a URL to an engine: one table of schemes, from which both [`supported_schemes`] and
//! [`open_backend`] read, so that the two cannot disagree.

use distlock_core::engine::BoxFuture;
use std::sync::Arc;

use distlock_core::{Backend, ErrorKind, LockClient, LockError};

type Open = for<'a> fn(&'a str) -> BoxFuture<'a, Result<Arc<dyn Backend>, LockError>>;

/// Boxes an engine's `connect` as an [`Open`].
macro_rules! opener {
    ($name:ident, $connect:expr) => {
        #[allow(dead_code)]
        fn $name(url: &str) -> BoxFuture<'_, Result<Arc<dyn Backend>, LockError>> {
            Box::pin(async move { Ok(Arc::new($connect(url).await?) as Arc<dyn Backend>) })
        }
    };
}

#[cfg(feature = "file")]
opener!(
    file,
    |u| async move { distlock_file::FileBackend::from_url(u) }
);
#[cfg(feature = "redis")]
opener!(redis, distlock_redis::RedisBackend::connect);
#[cfg(feature = "redis")]
opener!(redlock, distlock_redis::RedlockBackend::connect);
#[cfg(feature = "redis")]
opener!(sentinel, distlock_redis::SentinelBackend::connect);
#[cfg(feature = "etcd")]
opener!(etcd, distlock_etcd::EtcdBackend::connect);
#[cfg(feature = "zookeeper")]
opener!(zookeeper, distlock_zookeeper::ZkBackend::connect);
#[cfg(feature = "postgres")]
opener!(postgres, distlock_postgres::PgBackend::connect);
#[cfg(feature = "mysql")]
opener!(mysql, distlock_mysql::MysqlBackend::connect);
#[cfg(feature = "memcached")]
opener!(memcached, distlock_memcached::MemcachedBackend::connect);

/// Every scheme this build opens, and how.
const SCHEMES: &[(&str, Open)] = &[
    #[cfg(feature = "file")]
    ("file", file),
    #[cfg(feature = "redis")]
    ("redis", redis),
    #[cfg(feature = "redis")]
    ("rediss", redis),
    #[cfg(feature = "redis")]
    ("redis+unix", redis),
    #[cfg(feature = "redis")]
    ("unix", redis),
    #[cfg(feature = "redis")]
    ("valkey", redis),
    #[cfg(feature = "redis")]
    ("valkeys", redis),
    #[cfg(feature = "redis")]
    ("redis+cluster", redis),
    #[cfg(feature = "redis")]
    ("rediss+cluster", redis),
    #[cfg(feature = "redis")]
    ("redis+sentinel", sentinel),
    #[cfg(feature = "redis")]
    ("rediss+sentinel", sentinel),
    #[cfg(feature = "redis")]
    ("redlock", redlock),
    #[cfg(feature = "redis")]
    ("redlocks", redlock),
    #[cfg(feature = "etcd")]
    ("etcd", etcd),
    #[cfg(feature = "etcd")]
    ("etcds", etcd),
    #[cfg(feature = "zookeeper")]
    ("zk", zookeeper),
    #[cfg(feature = "zookeeper")]
    ("zks", zookeeper),
    #[cfg(feature = "postgres")]
    ("postgres", postgres),
    #[cfg(feature = "postgres")]
    ("postgresql", postgres),
    #[cfg(feature = "mysql")]
    ("mysql", mysql),
    #[cfg(feature = "mysql")]
    ("mariadb", mysql),
    #[cfg(feature = "memcached")]
    ("memcached", memcached),
    #[cfg(feature = "memcached")]
    ("memcacheds", memcached),
];

/// Schemes this build does not open, and why: an engine left out by its feature, or a
/// transport not built in this release.
const NOT_OPENED: &[(&str, &str)] = &[
    (
        "file",
        "the file engine is not compiled in (feature `file`)",
    ),
    (
        "redis",
        "the Redis engines are not compiled in (feature `redis`)",
    ),
    (
        "rediss",
        "the Redis engines are not compiled in (feature `redis`)",
    ),
    (
        "redis+unix",
        "the Redis engines are not compiled in (feature `redis`)",
    ),
    (
        "redis+cluster",
        "the Redis engines are not compiled in (feature `redis`)",
    ),
    (
        "redis+sentinel",
        "the Redis engines are not compiled in (feature `redis`)",
    ),
    (
        "redlock",
        "the Redis engines are not compiled in (feature `redis`)",
    ),
    (
        "etcd",
        "the etcd engine is not compiled in (feature `etcd`)",
    ),
    (
        "zk",
        "the ZooKeeper engine is not compiled in (feature `zookeeper`)",
    ),
    (
        "postgres",
        "the PostgreSQL engine is not compiled in (feature `postgres`)",
    ),
    (
        "postgresql",
        "the PostgreSQL engine is not compiled in (feature `postgres`)",
    ),
    (
        "mysql",
        "the MySQL engine is not compiled in (feature `mysql`)",
    ),
    (
        "mariadb",
        "the MySQL engine is not compiled in (feature `mysql`)",
    ),
    (
        "memcached",
        "the memcached engine is not compiled in (feature `memcached`)",
    ),
    (
        "etcds",
        "the etcd engine is not compiled in (feature `etcd`)",
    ),
    (
        "zks",
        "the ZooKeeper engine is not compiled in (feature `zookeeper`)",
    ),
    (
        "memcacheds",
        "the memcached engine is not compiled in (feature `memcached`)",
    ),
];

/// The engines compiled into this build, by the name of the feature that brings each, with
/// `tls` when `rediss://` is built in.
pub fn engines() -> &'static [&'static str] {
    &[
        #[cfg(feature = "file")]
        "file",
        #[cfg(feature = "redis")]
        "redis",
        #[cfg(all(feature = "redis", feature = "tls"))]
        "tls",
        #[cfg(feature = "etcd")]
        "etcd",
        #[cfg(feature = "zookeeper")]
        "zookeeper",
        #[cfg(feature = "postgres")]
        "postgres",
        #[cfg(feature = "mysql")]
        "mysql",
        #[cfg(feature = "memcached")]
        "memcached",
    ]
}

/// The URL schemes this build opens: exactly those [`open_backend`] accepts (a test keeps the
/// two in agreement).
pub fn supported_schemes() -> Vec<&'static str> {
    SCHEMES.iter().map(|(scheme, _)| *scheme).collect()
}

/// Opens the engine a URL names, as a backend to build a [`LockClient`] with your own options
/// (`LockClient::builder(backend).options(…)`): for code that picks the engine at run time,
/// such as the `distlock` command. [`connect`] is the same with default options.
///
/// | URL | engine |
/// |---|---|
/// | `file:///var/lock/app`, `file://` | local `flock` files (feature `file`) |
/// | `redis://host:port/db`, `rediss://…`, `redis+unix:///sock` (also `valkey://`, `valkeys://`, `unix://`) | one Redis server (feature `redis`) |
/// | `redlock://h1:p1,h2:p2,h3:p3` (`redlocks://` for TLS) | Redlock over independent masters (feature `redis`) |
/// | `redis+cluster://h1:p1,h2:p2,…` (`rediss+cluster://` for TLS) | a Redis Cluster, through any of its nodes (feature `redis`) |
/// | `redis+sentinel://s1:p1,s2:p2/mymaster[/db]` (`rediss+sentinel://` for TLS) | the master Redis Sentinel names, followed across failovers (feature `redis`) |
/// | `etcd://h1:2379,h2:2379,…` | etcd: FIFO queue by create revision, revision fencing (feature `etcd`) |
/// | `zk://h1:2181,h2:2181[/chroot]` (`zks://` for TLS) | ZooKeeper: ephemeral sequential nodes, czxid fencing (feature `zookeeper`) |
/// | `postgres://user:pw@host:5432/db` (`postgresql://`) | PostgreSQL session advisory locks, sequence fencing (feature `postgres`) |
/// | `mysql://user:pw@host:3306/db` (`mariadb://`) | MySQL/MariaDB `GET_LOCK`, per-lock counter fencing (feature `mysql`) |
/// | `memcached://host:11211` | memcached `add` with CAS renewals and release, no fencing (feature `memcached`) |
///
/// # Errors
/// `Config` for a malformed URL or a scheme this build does not open (the message says why:
/// which feature it needs, say); the engine's connection errors otherwise.
pub async fn open_backend(url: &str) -> Result<Arc<dyn Backend>, LockError> {
    let scheme = url
        .split_once(':')
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    if let Some((_, open)) = SCHEMES.iter().find(|(s, _)| *s == scheme) {
        return open(url).await;
    }
    if scheme.is_empty() {
        return Err(LockError::new(
            ErrorKind::Config,
            format!(
                "{:?} is not a lock URL (try file:// or redis://host:6379)",
                distlock_core::url::redact(url)
            ),
        ));
    }
    let why = NOT_OPENED
        .iter()
        .find(|(s, _)| *s == scheme)
        .map_or("", |(_, why)| *why);
    let why = if why.is_empty() {
        String::new()
    } else {
        format!(": {why}")
    };
    Err(LockError::new(
        ErrorKind::Config,
        format!(
            "unsupported lock URL scheme {scheme:?}{why}; this build supports: {}",
            supported_schemes().join(", ")
        ),
    ))
}

/// [`open_backend`], tried again while the engine cannot be reached (no sentinel names a
/// master yet, the cluster or the ensemble is failing over, the server restarts), with backoff
/// (100 ms doubling to 2 s), until `budget` has passed. The budget bounds the whole call: an
/// attempt still connecting when it runs out (a server that accepts connections and never
/// answers) is dropped, and the call fails with `Timeout`. A malformed URL, refused
/// credentials or anything else that trying again cannot mend fails at once. After the budget,
/// the error names the last cause.
///
/// Each retry is logged under the target `distlock::retry`: the first at WARN, the others at
/// DEBUG (see the library guide's Logs section).
///
/// This is what `distlock run --wait D` does before it waits for the lock with what is left
/// of `D`; an `acquire` with a wait timeout rides through the same failures (see
/// `Wait::Timeout`).
///
/// # Errors
/// As [`open_backend`], the last one once the budget is spent; `Timeout` when the budget ran
/// out during an attempt that had no answer yet.
pub async fn open_backend_within(
    url: &str,
    budget: std::time::Duration,
) -> Result<Arc<dyn Backend>, LockError> {
    let deadline = tokio::time::Instant::now() + budget;
    let mut pause = std::time::Duration::from_millis(100);
    let mut tries = 0u32;
    let mut last: Option<LockError> = None;
    loop {
        tries += 1;
        let e = match tokio::time::timeout_at(deadline, open_backend(url)).await {
            Ok(Ok(b)) => return Ok(b),
            Ok(Err(e)) if e.is_retryable() => e,
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                let silent = format!("the lock engine did not answer within {budget:?}");
                return Err(match last {
                    // The attempts before this one had answers: the last of them is named.
                    Some(e) => LockError::new(
                        ErrorKind::Timeout,
                        format!(
                            "{silent} ({tries} attempts); the one before the last failed with {}",
                            distlock_core::error_chain(&e)
                        ),
                    )
                    .with_source(e),
                    None => LockError::new(ErrorKind::Timeout, silent),
                });
            }
        };
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(tried_for(budget, tries, e));
        }
        if now + pause >= deadline {
            // No time for another attempt: the budget ends with this one's cause.
            tokio::time::sleep_until(deadline).await;
            return Err(tried_for(budget, tries, e));
        }
        let error = distlock_core::error_chain(&e);
        if tries == 1 {
            tracing::warn!(target: "distlock::retry", error, attempt = tries,
                "cannot open the lock engine; trying again within the wait");
        } else {
            tracing::debug!(target: "distlock::retry", error, attempt = tries,
                "cannot open the lock engine; trying again within the wait");
        }
        last = Some(e);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_secs(2));
    }
}

/// The error of a budget spent on attempts that failed, naming the last one's cause.
fn tried_for(budget: std::time::Duration, tries: u32, last: LockError) -> LockError {
    let attempts = if tries == 1 {
        "1 attempt); it failed".to_owned()
    } else {
        format!("{tries} attempts); the last one failed")
    };
    LockError::after(format_args!("tried for {budget:?} ({attempts}"), last)
}

/// A [`LockClient`] with default options over the engine a URL names (see [`open_backend`]
/// for the URLs, and for a client with options of your own).
///
/// ```no_run
/// # async fn demo() -> Result<(), distlock::LockError> {
/// let locks = distlock::connect("redis://127.0.0.1:6379").await?;
/// if let Some(guard) = locks.try_acquire("invoices:2026-11").await? {
///     println!("fence {:?}", guard.fence());
///     guard.release().await?;
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// As [`open_backend`].
pub async fn connect(url: &str) -> Result<LockClient, LockError> {
    Ok(LockClient::new(open_backend(url).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every listed scheme reaches its engine, which refuses the URL's unknown parameter by
    /// name (before any connection: the test needs no server); every scheme of the "not
    /// opened" table is refused as unsupported, with its reason.
    #[tokio::test]
    async fn listed_schemes_are_exactly_the_opened_ones() {
        let listed = supported_schemes();
        let mut seen = std::collections::HashSet::new();
        for scheme in &listed {
            assert!(seen.insert(*scheme), "{scheme} is listed twice");
            let url = match *scheme {
                "file" => "file:///tmp/x?no_such_param=1".to_owned(),
                "unix" | "redis+unix" => format!("{scheme}:///tmp/x.sock?no_such_param=1"),
                "redis+sentinel" | "rediss+sentinel" => {
                    format!("{scheme}://127.0.0.1:1/mymaster?no_such_param=1")
                }
                _ => format!("{scheme}://127.0.0.1:1?no_such_param=1"),
            };
            let e = open_backend(&url).await.expect_err("refused");
            assert_eq!(e.kind(), ErrorKind::Config, "{scheme}: {e}");
            assert!(
                e.message().contains("no_such_param"),
                "{scheme} did not reach its engine: {e}"
            );
        }
        for (scheme, why) in NOT_OPENED {
            if listed.contains(scheme) {
                continue;
            }
            let e = open_backend(&format!("{scheme}://127.0.0.1:1"))
                .await
                .expect_err("refused");
            assert_eq!(e.kind(), ErrorKind::Config);
            assert!(e.message().contains(why), "{e}");
        }
        for bad in ["gopher://h", "nothing", ""] {
            let e = open_backend(bad).await.expect_err("refused");
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
        }
    }

    /// No engine repeats a password of its URL in an error: one with a bad parameter, one
    /// with a bad host, and one with an unknown scheme, each refused before any connection.
    #[tokio::test]
    async fn no_error_shows_the_url_s_password() {
        const SECRET: &str = "hunter2-secret";
        let mut urls = vec![format!("gopher://u:{SECRET}@h:1")];
        for scheme in supported_schemes() {
            if matches!(scheme, "file" | "unix" | "redis+unix") {
                continue;
            }
            let path = if scheme.contains("sentinel") {
                "/m"
            } else {
                "/db"
            };
            urls.push(format!(
                "{scheme}://u:{SECRET}@127.0.0.1:1{path}?no_such_param=1&sentinel_password={SECRET}"
            ));
            urls.push(format!("{scheme}://u:{SECRET}@127.0.0.1:notaport{path}"));
        }
        for url in urls {
            if let Err(e) = open_backend(&url).await {
                let shown = format!("{e} {e:?}");
                assert!(!shown.contains(SECRET), "{url}: {shown}");
            }
        }
    }
}
