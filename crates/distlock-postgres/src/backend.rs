//! The PostgreSQL engine: session advisory locks, many on each session of a small pool.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BatchRenew, BoxFuture, BreakOutcome, Breaker, Capabilities,
    Downgrade, ErrorKind, Fencing, HolderStatus, LeaseCheck, LeaseKind, LeaseRef, LockError,
    LockStatus, LostReason, RenewItem, SessionWatch, Sessions, WakeSource,
};
use distlock_core::recipes::pool::{PoolLease, PoolLimits, SHARED_PREFIX, SessionPool};
use distlock_core::recipes::{HolderValue, MutexExt, shares_unbreakable};
use distlock_core::seeded::SeededBug;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use crate::config::PgConfig;
use crate::error::map_err;

mod kinds;
mod listen;
mod marker;
mod names;
mod order;
mod recorded;
mod session;
mod settings;

use kinds::{PERMIT_PREFIX, PermitHold, PermitSql};
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

/// How many dedicated sessions (transaction-scoped locks, breaking) are kept open between uses.
const DEDICATED_IDLE: usize = 2;

/// Reads a holder label: its fence (`-` on a shared session, whose locks have one each), TTL in
/// milliseconds and owner.
fn parse_label(app: &str) -> Option<(Option<u64>, i64, String)> {
    let mut words = app.splitn(4, ' ');
    if words.next()? != APP_TAG {
        return None;
    }
    let fence = match words.next()? {
        "-" => None,
        f => Some(f.parse().ok()?),
    };
    let ttl = words.next()?.parse().ok()?;
    Some((fence, ttl, words.next().unwrap_or_default().to_owned()))
}

/// A holding session as `status` lists it, from its label in `application_name` ("<tag> <fence
/// or -> <ttl ms> <owner>", as the acquire wrote it; another role's session may show nothing,
/// and a session that changed its application_name shows that) and how long it has been idle.
fn holder_of(kind: LeaseKind, app: Option<String>, idle: Option<i64>) -> HolderStatus {
    match app.as_deref().and_then(parse_label) {
        Some((fence, ttl, owner)) => {
            let remaining = ttl.saturating_sub(idle.unwrap_or(0));
            HolderStatus::new(kind)
                .owner(Some(owner))
                .fence(fence)
                .ttl(Some(Duration::from_millis(
                    u64::try_from(remaining).unwrap_or(0),
                )))
        }
        None => HolderStatus::new(kind).owner(app),
    }
}

/// A lease the statement took, once the pool has recorded it (`Busy` if its session ended
/// meanwhile).
fn confirmed(
    pool: &SessionPool<PgOps>,
    lease: &PoolLease<PgConn>,
    sent: tokio::time::Instant,
    req: &AcquireRequest<'_>,
    fence: i64,
) -> Attempt {
    if pool.confirm(lease, sent, req.ttl, req.renewed) {
        Attempt::Acquired {
            fence: u64::try_from(fence).ok(),
        }
    } else {
        Attempt::Busy { holder_ttl: None }
    }
}

/// The server's `idle_session_timeout` for a time the session must last, in whole
/// milliseconds, rounded up (at least 1: 0 would turn the timeout off).
fn ttl_ms(ttl: Duration) -> i64 {
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX).max(1)
}

/// Why the server ended a session, from the error the connection ended with.
fn why_ended(e: &tokio_postgres::Error) -> LostReason {
    match e.code() {
        Some(c) if *c == SqlState::IDLE_SESSION_TIMEOUT => LostReason::Expired,
        // pg_terminate_backend, or an operator's shutdown: somebody took the lock away.
        Some(c) if *c == SqlState::ADMIN_SHUTDOWN => LostReason::Stolen,
        _ => LostReason::Unreachable,
    }
}

/// A session of its own (a transaction-scoped lock, breaking a lock, the first checks, the
/// waiters' queue).
pub(crate) struct Conn {
    pub(crate) client: Client,
    /// Set when the session ends.
    ended: watch::Receiver<Option<LostReason>>,
    task: tokio::task::AbortHandle,
}

impl Conn {
    fn is_closed(&self) -> bool {
        self.client.is_closed() || self.ended.borrow().is_some()
    }

    /// Ends the session.
    fn close(&self) {
        self.task.abort();
    }
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
///   closed, which frees everything on it, rather than kept with a lock nobody tracks.
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

    /// The first session: checks the version and creates the fence sequence and the waiters'
    /// table (see `order`) where they are missing.
    async fn setup(&self) -> Result<Conn, LockError> {
        const DOING: &str = "preparing PostgreSQL for locks";
        let conn = self.open().await?;
        let client = &conn.client;
        let version: String = client
            .query_one("SHOW server_version_num", &[])
            .await
            .map_err(|e| map_err(e, DOING))?
            .get(0);
        if version.parse::<u32>().unwrap_or(0) < 140_000 {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                format!("PostgreSQL {version} has no idle_session_timeout: 14 or later is needed"),
            ));
        }
        let s = &self.config().schema;
        // Only what is missing: a role without CREATE on the schema can use objects an
        // administrator made (CREATE … IF NOT EXISTS checks the privilege first).
        let missing = client
            .query_one(
                &format!(
                    "SELECT to_regclass('{s}.distlock_fence') IS NULL, \
                            to_regclass('{s}.distlock_waiters') IS NULL, \
                            to_regclass('{s}.distlock_holders') IS NULL, \
                            to_regclass('{s}.distlock_names') IS NULL"
                ),
                &[],
            )
            .await
            .map_err(|e| map_err(e, DOING))?;
        let (fence, waiters, holders, names): (bool, bool, bool, bool) = (
            missing.get(0),
            missing.get(1),
            missing.get(2),
            missing.get(3),
        );
        let sequence = format!("CREATE SEQUENCE IF NOT EXISTS {s}.distlock_fence");
        let table = order::waiters_ddl(s);
        let recorded = recorded::holders_ddl(s);
        let named = names::names_ddl(s);
        for ddl in [
            (fence, &sequence),
            (waiters, &table),
            (holders, &recorded),
            (names, &named),
        ]
        .into_iter()
        .filter_map(|(missing, ddl)| missing.then_some(ddl))
        {
            // Two clients creating it at once can collide in the catalog: once more then.
            if let Err(e) = client.batch_execute(ddl).await {
                let raced = e.code().is_some_and(|c| {
                    *c == SqlState::UNIQUE_VIOLATION
                        || *c == SqlState::DUPLICATE_TABLE
                        || *c == SqlState::DUPLICATE_OBJECT
                });
                if !raced {
                    return Err(map_err(e, DOING));
                }
                client
                    .batch_execute(ddl)
                    .await
                    .map_err(|e| map_err(e, DOING))?;
            }
        }
        Ok(conn)
    }

    /// Opens a session of its own.
    async fn open(&self) -> Result<Conn, LockError> {
        let (tx, rx) = watch::channel(None);
        let (client, task) = connect(
            self.config(),
            self.tls(),
            move |why| {
                let _ = tx.send(Some(why));
            },
            None,
        )
        .await?;
        Ok(Conn {
            client,
            ended: rx,
            task,
        })
    }

    /// An idle session of its own, or a new one.
    pub(crate) async fn take(&self) -> Result<Conn, LockError> {
        loop {
            let next = self.inner.dedicated.locked().pop();
            match next {
                Some(c) if c.is_closed() => continue,
                Some(c) => return Ok(c),
                None => return self.open().await,
            }
        }
    }

    /// Returns a session of its own, holding no lock, for the next use (or closes it).
    pub(crate) fn put_back(&self, conn: Conn) {
        if conn.is_closed() {
            return;
        }
        let mut idle = self.inner.dedicated.locked();
        if idle.len() < DEDICATED_IDLE {
            idle.push(conn);
        }
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

    fn acquire<'a>(
        &'a self,
        req: &'a AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Attempt, LockError>> {
        Box::pin(async move {
            // The id a waiter's ticket names (see `order`): the lock's, or the semaphore's base;
            // recorded with the name for `distlock list` (the server knows the lock by its id
            // only).
            let (id, new_name) = self.name_id(req.name, req.kind);
            // Sent when this call ends, or is dropped half-way: the writer's connection is not
            // opened beside the attempt's.
            let _name = new_name.then(|| names::NameToSend {
                backend: self,
                name: req.name,
                kind: req.kind,
                id,
            });
            let pool = &self.inner.pool;
            let token = req.token.as_str();
            if req.mode.is_resend()
                && let Some(lease) = pool.held(req.name, token)
                && !lease.session().is_over()
            {
                // The reply came after all: the lock is ours already (never locked twice: a
                // session-level advisory lock counts its acquisitions). A recorded holder's fence
                // is known.
                return Ok(Attempt::Acquired {
                    fence: self.recorded_fence(token),
                });
            }
            let seq = self.ticket_seq(token);
            let attempt = match req.kind {
                LeaseKind::Permit { permits } => self.acquire_permit(req, permits, id, seq).await?,
                _ => self.try_lock(req, id, seq).await?,
            };
            if let (true, LeaseKind::Exclusive, Attempt::Acquired { fence: Some(fence) }) =
                (req.recorded, req.kind, attempt)
                && let Err(e) = self.record(req, fence).await
            {
                // Not a holder status can name: the lock goes back.
                let _ = self.inner.pool.release(req.name, token).await;
                return Err(e);
            }
            match attempt {
                Attempt::Busy { .. } if req.mode.waits() => {
                    // A waiter: in the queue from now, or kept in it.
                    if let Err(e) = self.keep_ticket(req, id).await {
                        tracing::debug!(target: "distlock", key = req.name, error = %e,
                            "no ticket for a PostgreSQL waiter: it waits unordered this round");
                    }
                }
                Attempt::Busy { .. } => {}
                _ if seq.is_some() => self.drop_ticket(token).await,
                _ => {}
            }
            Ok(attempt)
        })
    }

    fn release<'a>(
        &'a self,
        lease: &'a LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>> {
        Box::pin(async move {
            // A waiter that gave up leaves the queue.
            self.drop_ticket(lease.token.as_str()).await;
            let released = self
                .inner
                .pool
                .release(lease.name, lease.token.as_str())
                .await;
            self.unrecord(lease.token.as_str()).await;
            released
        })
    }

    /// Every session that holds the lock (one writer, or every reader), each with the label
    /// its acquire wrote, and the number of waiters (their live tickets: see `order`).
    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LockStatus, LockError>> {
        Box::pin(async move {
            const DOING: &str = "reading a PostgreSQL lock's status";
            let id = lock_id(key);
            let session = self.inner.pool.any_session().await?;
            let conn = session.conn();
            let rows = tokio::time::timeout(
                self.config().response_timeout,
                conn.client.query(&conn.status, &[&id]),
            )
            .await
            .map_err(|_| LockError::new(ErrorKind::Timeout, format!("{DOING}: no answer")))?
            .map_err(|e| map_err(e, DOING))?;
            if rows.is_empty() {
                return self.semaphore_status(conn, key).await;
            }
            let mut last_fence = None;
            let holders = rows
                .iter()
                .map(|row| {
                    let app: Option<String> = row.get(0);
                    let idle: Option<i64> = row.get(1);
                    let last: Option<i64> = row.get(2);
                    let shared: Option<bool> = row.get(3);
                    let (fence, holder): (Option<i64>, Option<String>) = (row.get(4), row.get(5));
                    last_fence = last.and_then(|l| u64::try_from(l).ok());
                    let kind = if shared == Some(true) {
                        LeaseKind::Shared
                    } else {
                        LeaseKind::Exclusive
                    };
                    let h = holder_of(kind, app, idle);
                    match (fence, holder) {
                        // Recorded by the holder itself (see `recorded`): its own label and fence.
                        (Some(fence), Some(holder)) => {
                            let value = HolderValue::parse(&holder);
                            let token = Some(value.token.to_owned()).filter(|t| !t.is_empty());
                            h.owner(Some(value.label()))
                                .fence(u64::try_from(fence).ok())
                                .token(token)
                        }
                        _ => h,
                    }
                })
                .collect();
            let waiters = self.waiting(id).await?;
            Ok(LockStatus::held_by(holders)
                .with_last_fence(last_fence)
                .with_waiters(Some(waiters)))
        })
    }

    fn batch_renew(&self) -> Option<&dyn BatchRenew> {
        Some(self)
    }

    fn sessions(&self) -> Option<&dyn Sessions> {
        Some(self)
    }

    fn wake_source(&self) -> Option<&dyn WakeSource> {
        Some(self)
    }

    fn lister(&self) -> Option<&dyn distlock_core::engine::Lister> {
        Some(self)
    }

    fn breaker(&self) -> Option<&dyn Breaker> {
        Some(self)
    }

    fn downgrade(&self) -> Option<&dyn Downgrade> {
        Some(self)
    }

    fn relabel(&self) -> Option<&dyn distlock_core::engine::Relabel> {
        Some(self)
    }
}

impl PgBackend {
    async fn renew_batch(&self, items: &[RenewItem<'_>]) -> Vec<Result<LeaseCheck, LockError>> {
        self.inner
            .pool
            .renew_many_seeded(items, SeededBug::PgSessionHeld)
            .await
    }
}

impl BatchRenew for PgBackend {
    /// One statement per session (setting its idle timeout), however many of its locks are
    /// due: a session that answers still holds every lock it took and did not unlock.
    fn renew_many<'a>(
        &'a self,
        items: &'a [RenewItem<'a>],
    ) -> BoxFuture<'a, Vec<Result<LeaseCheck, LockError>>> {
        Box::pin(self.renew_batch(items))
    }

    /// See [`RENEW_CHUNK`](distlock_core::recipes::pool::RENEW_CHUNK): a chunk costs a
    /// statement per session it touches, whatever its size.
    fn max_batch(&self) -> usize {
        distlock_core::recipes::pool::RENEW_CHUNK
    }
}

impl Breaker for PgBackend {
    /// Ends the holding session (`pg_terminate_backend`, waiting up to 5 s for it to go),
    /// which frees the lock, and every other lock on that session: their holders see the
    /// session end at once (lost: `Stolen`). Needs the right to signal that session (the same
    /// role, `pg_signal_backend`, or superuser).
    fn break_once<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<BreakOutcome, LockError>> {
        Box::pin(self.terminate_holder(key))
    }
}

impl PgBackend {
    async fn terminate_holder(&self, key: &str) -> Result<BreakOutcome, LockError> {
        const DOING: &str = "breaking a PostgreSQL advisory lock";
        let st = self.inspect(key).await?;
        if !st.held {
            return Ok(BreakOutcome::Free);
        }
        if st
            .holders
            .iter()
            .any(|h| matches!(h.kind, LeaseKind::Permit { .. }))
        {
            return Err(shares_unbreakable(key, "a semaphore's permits"));
        }
        let id = lock_id(key);
        // A session of its own: the holder may be a session of this very pool.
        let conn = self.take().await?;
        let rows = conn
            .client
            .query(
                &format!(
                    "SELECT pg_terminate_backend(l.pid, 5000) FROM pg_locks l \
                     WHERE l.pid <> pg_backend_pid() AND {IN_PG_LOCKS}"
                ),
                &[&id],
            )
            .await
            .map_err(|e| map_err(e, DOING))?;
        self.put_back(conn);
        match rows.first().map(|r| r.get::<_, bool>(0)) {
            None => Ok(BreakOutcome::Free),
            Some(true) => Ok(BreakOutcome::Broken(st)),
            Some(false) => Err(LockError::new(
                ErrorKind::Timeout,
                format!("{DOING}: the holding session was signalled but had not ended after 5 s"),
            )),
        }
    }
}

impl Sessions for PgBackend {
    /// The end of the session the lock is on (the server closed it, an idle timeout, a
    /// termination): every lock on that session hears it.
    fn session_end(&self, lease: &LeaseRef<'_>) -> SessionWatch {
        self.inner
            .pool
            .session_end_seeded(lease.token.as_str(), SeededBug::PgSessionHeld)
    }

    /// Unless the client released it at its deadline meanwhile (nobody renewed it).
    fn still_on(&self, lease: &LeaseRef<'_>, session: u64) -> bool {
        self.inner.pool.still_on(lease.token.as_str(), session)
    }

    /// The client unlocks it when `ttl` has passed: an advisory lock cannot move to a session
    /// of its own, and the session lives on for its other locks.
    fn detach<'a>(
        &'a self,
        lease: &'a LeaseRef<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        self.inner
            .pool
            .detach(lease.name, lease.token.as_str(), ttl);
        Box::pin(std::future::ready(Ok(())))
    }
}

#[cfg(test)]
mod tests;
