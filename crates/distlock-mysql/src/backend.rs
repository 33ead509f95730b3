//! The MySQL/MariaDB engine: `GET_LOCK` named locks, many on each session of a small pool.
//!
//! This file is `MysqlBackend`, its shared state, its construction and its `Backend` wiring,
//! with the server names and SQL literals every module writes; each job is a module of its own.

mod acquire;
mod breaker;
mod error;
mod many;
mod names;
mod ops;
mod permits;
mod recorded;
mod session;
mod setup;
mod status;

pub use permits::semaphore_name;

use std::fmt;
use std::sync::Arc;

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BatchRenew, Capabilities, Fencing, LeaseCheck, LeaseRef,
    LockError, LockStatus, Sessions,
};
use distlock_core::recipes::pool::{PoolLimits, SessionPool};
use mysql_async::{Row, Value};
use sha2::{Digest, Sha256};

use crate::config::{FenceSource, MysqlConfig};
use ops::{MyOps, Server, dedicated};
use session::{MySession, Sql, on_session, on_session_all};

/// The server-side lock name of a lock: `dl:<name>` when that is at most 64 characters of
/// letters, digits and `_ . : / -`; otherwise `dl:sha256:` and the first 48 hex digits of
/// SHA-256 of the name (MySQL limits lock names to 64 characters).
pub fn lock_name(name: &str) -> String {
    server_name("dl:", name, 61)
}

/// `<prefix><name>` when `name` is at most `longest` characters of letters, digits and
/// `_ . : / -`; otherwise `<prefix>sha256:` and the first 48 hex digits of SHA-256 of the name.
fn server_name(prefix: &str, name: &str, longest: usize) -> String {
    let plain = name.len() <= longest
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:/-".contains(&b));
    if plain {
        return format!("{prefix}{name}");
    }
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest[..24].iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}sha256:{hex}")
}

/// A server-side lock name ([`lock_name`]: letters, digits and `_ . : / -` only) as a SQL
/// string literal: nothing in it needs escaping.
fn name_lit(key: &str) -> String {
    debug_assert!(
        key.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:/-".contains(&b))
    );
    let mut q = String::with_capacity(key.len() + 2);
    q.push('\'');
    q.push_str(key);
    q.push('\'');
    q
}

/// A SQL string literal (escaped by the driver's rules).
fn lit(s: &str) -> String {
    Value::from(s).as_sql(false)
}

/// Column `i` of a row as an integer (`None` for NULL).
fn int(row: &Row, i: usize) -> Option<i64> {
    row.get::<Option<i64>, _>(i).flatten()
}

/// Why a server without recursive common table expressions has no semaphores.
pub(crate) const NO_CTES: &str = "the semaphore's statements need recursive common table \
     expressions: MySQL 8.0 or MariaDB 10.2.2 and later";

struct MysqlShared {
    pool: Arc<SessionPool<MyOps>>,
    /// This client's holders recorded in `distlock_holders` (see `recorded`).
    recorded: recorded::LeaderRows,
    /// The server names whose lock names this client recorded (see `names`).
    names: names::NameRecorder,
    /// The multi-name leases, each on a connection of its own (see `many`).
    many: many::ManyLeases,
}

/// A lock engine on MySQL's and MariaDB's named locks (`GET_LOCK`), many on each session of a
/// small pool (`sessions=` in the URL, 8 by default).
///
/// - **acquire** places the lock on a pooled session that neither holds nor is taking the same
///   name (see [`distlock_core::recipes::pool`]) and, in one round trip, sets the session's
///   `wait_timeout` to cover every lock on it, tries `GET_LOCK(name, 0)`, and only if it got
///   the lock bumps the lock's counter in the table `distlock_locks` (the fence) and records
///   the holder there (for `status`). A name that one of this client's sessions holds already
///   is busy at once; the engine never waits in the server (waiting is the core's), so one long
///   wait never blocks the other locks of a session;
/// - **the lease** is the session's silence: the server closes a connection idle for
///   `wait_timeout` seconds, and every lock on it. The watchdog's renewal is one statement per
///   session, however many of its locks are due; a session's named locks end only with the
///   session or its own `RELEASE_LOCK`, so a session that answers still holds them all;
/// - **loss**: a session found ended (killed, timed out, server gone) at its next statement
///   loses every lock on it at once, with the reason;
/// - **release** is `RELEASE_LOCK(name)`. A statement that fails the connection, or does not
///   answer within `response_timeout`, ends its session (its state is unknown), and every lock
///   on it is reported lost;
/// - **several names at once** (`lock_many`) are taken in one round trip, in sorted order,
///   all or none, on a connection of the lease's own (see the module `many` of this crate's
///   `backend`): its renewal is that connection's keep-alive and a check that it holds every
///   name, and its end loses the lease at the next renewal.
#[derive(Clone)]
pub struct MysqlBackend {
    inner: Arc<MysqlShared>,
}

impl fmt::Debug for MysqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlBackend")
            .field("config", &self.inner.pool.ops().config)
            .field("pool", &self.inner.pool)
            .finish_non_exhaustive()
    }
}

impl MysqlBackend {
    /// Connects to the server a URL names (see [`MysqlConfig`]) and creates the table
    /// `distlock_locks` if it is missing.
    ///
    /// # Errors
    /// `Config` for a bad URL or an unknown database; `Connection` or `Timeout` when the server
    /// does not answer; `Auth` for refused credentials or missing privileges.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(MysqlConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn with_config(config: MysqlConfig) -> Result<Self, LockError> {
        let (fences, server) = setup::setup(&config).await?;
        let limits = PoolLimits {
            sessions: config.sessions,
            wait: config.pool_wait,
        };
        Ok(MysqlBackend {
            inner: Arc::new(MysqlShared {
                pool: SessionPool::new(
                    MyOps {
                        config,
                        fences,
                        server,
                    },
                    limits,
                ),
                recorded: recorded::LeaderRows::default(),
                names: names::NameRecorder::default(),
                many: many::ManyLeases::default(),
            }),
        })
    }

    /// How many sessions of the pool are open (the server connections that hold locks).
    pub fn open_sessions(&self) -> usize {
        self.inner.pool.open_sessions()
    }

    /// How many keep-alive statements the pool has sent: one per session per renewal batch,
    /// however many locks each session holds.
    pub fn keepalives(&self) -> u64 {
        self.inner.pool.keepalives()
    }
}

#[distlock_core::engine::async_trait]
impl Backend for MysqlBackend {
    fn name(&self) -> &'static str {
        "mysql"
    }

    fn capabilities(&self) -> Capabilities {
        let caps = Capabilities::new(Fencing::Monotonic, true).other_kinds_because(
            "GET_LOCK has no shared mode: a MySQL/MariaDB named lock excludes every other \
             session, so readers cannot share one",
        );
        if self.inner.pool.ops().server.ctes {
            caps.with_permits()
        } else {
            caps.no_permits_because(NO_CTES)
        }
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        self.acquire_inner(req).await
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        let released = self
            .inner
            .pool
            .release(lease.name, lease.token.as_str())
            .await;
        self.unrecord(lease.token.as_str()).await;
        released
    }

    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        self.status(key).await
    }

    /// The session pool renews the leases and hears their sessions' ends.
    fn batch_renew(&self) -> Option<&dyn BatchRenew> {
        Some(&*self.inner.pool)
    }

    fn sessions(&self) -> Option<&dyn Sessions> {
        Some(&*self.inner.pool)
    }

    distlock_core::capability_getters!(
        lister: Lister,
        breaker: Breaker,
        relabel: Relabel,
        multi_lock: MultiLock,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_fit_mysql() {
        assert_eq!(lock_name("orders"), "dl:orders");
        for odd in ["with space", "quote'd", &"k".repeat(62), "é"] {
            let n = lock_name(odd);
            assert!(n.starts_with("dl:sha256:") && n.len() == 58, "{n}");
        }
        assert_eq!(lock_name("quote'd"), lock_name("quote'd"));
    }
}
