//! The PostgreSQL engine: session advisory locks, many on each session of a small pool.
//!
//! This file is `PgBackend`, its shared state, its construction and its `Backend` wiring, with
//! the lock ids and the few constants every module uses; each job is a module of its own.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BatchRenew, Capabilities, Fencing, LeaseCheck, LeaseRef,
    LockError, LockStatus, Sessions,
};
use distlock_core::recipes::pool::{PoolLimits, SHARED_PREFIX, SessionPool};
use sha2::{Digest, Sha256};

use crate::config::PgConfig;

mod acquire;
mod breaker;
mod dedicated;
mod kinds;
mod lease;
mod listen;
mod many;
mod marker;
mod names;
mod order;
mod permits;
mod recorded;
mod session;
mod settings;
mod setup;
mod status;
#[cfg(fuzzing)]
pub(crate) use status::fuzz_label;

pub(crate) use dedicated::Conn;
use permits::{PERMIT_PREFIX, PermitHold, PermitSql};
use session::{PgConn, PgOps, Taking, Tls, connect};

/// The advisory lock id of a lock name: the first 8 bytes of SHA-256 of its UTF-8 bytes, read
/// big-endian as a signed 64-bit integer. Stable across versions and easy to compute in any
/// language (`SELECT ('x' || left(encode(sha256(convert_to(name, 'UTF8')), 'hex'), 16))::bit(64)::bigint`
/// in SQL).
pub fn lock_id(name: &str) -> i64 {
    let digest = Sha256::digest(name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The advisory lock `$1` in `pg_locks` (as `l`): a bigint key is classid (high half) and objid
/// (low half), with objsubid 1.
const IN_PG_LOCKS: &str = "l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted \
     AND l.classid = (($1::bigint >> 32) & 4294967295)::oid \
     AND l.objid = ($1::bigint & 4294967295)::oid";

/// The first word of the holder label a session carries in `application_name`.
const APP_TAG: &str = "distlock";

/// The server's `idle_session_timeout` for a time the session must last, in whole
/// milliseconds, rounded up (at least 1: 0 would turn the timeout off).
fn ttl_ms(ttl: Duration) -> i64 {
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX).max(1)
}

struct PgShared {
    pool: Arc<SessionPool<PgOps>>,
    /// Sessions of their own, idle between uses.
    dedicated: Mutex<Vec<Conn>>,
    /// The tickets of this client's waiters (see `order`).
    tickets: order::Tickets,
    /// The session that writes them and holds their markers (see `marker`).
    queue: marker::Queue,
    /// This client's holders recorded in `distlock_holders` (see `recorded`).
    recorded: recorded::LeaderRows,
    /// This client's listening session (see `listen`).
    listener: listen::Listener,
    /// The lock ids whose names this client recorded (see `names`).
    names: names::NameRecorder,
    /// The multi-name leases, each on a session of its own (see `many`).
    many: many::ManyLeases,
}

/// A lock engine on PostgreSQL's session-level advisory locks, many on each session of a small
/// pool (`sessions=` in the URL, 8 by default).
///
/// - **acquire** places the lock on a pooled session that neither holds nor is taking the same
///   lock id (see [`distlock_core::recipes::pool`]) and, in one statement, tries
///   `pg_try_advisory_lock(id)` (`id` = [`lock_id`] of the name), takes the fence from the
///   sequence `distlock_fence` when it got the lock, sets the session's `idle_session_timeout`
///   to cover every lock on it, and labels the session (`application_name` =
///   `distlock - <timeout ms> <owner>`, for `status`, through `pg_stat_activity`: no table
///   write). A lock id that one of this client's sessions holds already is busy at once;
///   the engine never waits in the server (waiting is the core's, between try-locks), so one
///   long wait never blocks the other locks of a session;
/// - **the lease** is the session's: the server ends a session that stays silent for
///   `idle_session_timeout` (PostgreSQL 14 or later), and every lock on it. The watchdog's
///   renewal is one statement per session, however many of its locks are due, which restarts
///   that clock; a session's advisory locks end only with the session or its own unlock, so a
///   session that answers still holds them all;
/// - **loss** is seen at once when a session ends (terminated, timed out, server gone): the
///   lost signal of every lock on it fires without waiting for a renewal, with the reason;
/// - **release** is `pg_advisory_unlock`. A session that cannot unlock (no answer in time) is
///   closed, which frees everything on it, rather than kept with a lock nobody tracks;
/// - **several names at once** (`lock_many`) are taken in one statement, in sorted order, all
///   or none, on a session of the lease's own (see the module `many` of this crate's
///   `backend`): its renewal is that session's keep-alive and a check that it holds every
///   name, and its end loses the lease at the next renewal.
#[derive(Clone)]
pub struct PgBackend {
    inner: Arc<PgShared>,
}

impl fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgBackend")
            .field("config", &self.inner.pool.ops().config)
            .field("pool", &self.inner.pool)
            .finish_non_exhaustive()
    }
}

impl PgBackend {
    /// Connects to the server a URL names (see [`PgConfig`]), and creates the fence sequence
    /// if it is missing.
    ///
    /// # Errors
    /// `Config` for a bad URL; `Connection` or `Timeout` when the server does not answer;
    /// `Auth` for refused credentials or missing privileges; `Unsupported` before
    /// PostgreSQL 14.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(PgConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn with_config(config: PgConfig) -> Result<Self, LockError> {
        let limits = PoolLimits {
            sessions: config.sessions,
            wait: config.pool_wait,
        };
        let backend = PgBackend {
            inner: Arc::new(PgShared {
                pool: SessionPool::new(
                    PgOps {
                        #[cfg(feature = "tls")]
                        tls: config
                            .tls
                            .clone()
                            .map(crate::tls::MakeRustls::new)
                            .transpose()?,
                        config,
                    },
                    limits,
                ),
                dedicated: Mutex::new(Vec::new()),
                tickets: order::Tickets::default(),
                queue: marker::Queue::new(),
                recorded: recorded::LeaderRows::default(),
                listener: listen::Listener::new(),
                names: names::NameRecorder::default(),
                many: many::ManyLeases::default(),
            }),
        };
        let conn = backend.setup().await?;
        backend.put_back(conn);
        Ok(backend)
    }

    fn config(&self) -> &PgConfig {
        &self.inner.pool.ops().config
    }

    /// The TLS connector, when TLS may be used.
    fn tls(&self) -> Tls<'_> {
        #[cfg(feature = "tls")]
        return self.inner.pool.ops().tls.as_ref();
        #[cfg(not(feature = "tls"))]
        None
    }

    /// The schema of the engine's objects.
    pub(crate) fn schema(&self) -> &str {
        &self.config().schema
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
impl Backend for PgBackend {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Monotonic, true)
            .with_shared()
            .with_permits()
            .with_order()
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        self.acquire_inner(req).await
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        // A waiter that gave up leaves the queue.
        self.drop_ticket(lease.token.as_str()).await;
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
        wake_source: WakeSource,
        lister: Lister,
        breaker: Breaker,
        downgrade: Downgrade,
        relabel: Relabel,
        multi_lock: MultiLock,
    );
}

#[cfg(test)]
mod tests;
