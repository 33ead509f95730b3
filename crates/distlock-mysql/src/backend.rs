//! The MySQL/MariaDB engine: `GET_LOCK` named locks, many on each session of a small pool.

mod names;
mod permits;
mod recorded;
mod setup;

pub use permits::semaphore_name;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BatchRenew, BoxFuture, BreakOutcome, Breaker, Capabilities,
    ErrorKind, Fencing, LeaseCheck, LeaseKind, LeaseRef, LockError, LockStatus, LostReason,
    RenewItem, SessionWatch, Sessions,
};
use distlock_core::recipes::pool::{
    PoolLimits, SHARED_PREFIX, SessionEnd, SessionOps, SessionPool,
};
use distlock_core::recipes::{HolderValue, MutexExt, shares_unbreakable};
use distlock_core::seeded::SeededBug;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Row, Value};

use crate::config::{FenceSource, MysqlConfig, SslMode, config_err};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

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

/// A SQL string literal (escaped by the driver's rules).
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

fn lit(s: &str) -> String {
    Value::from(s).as_sql(false)
}

/// The session's `wait_timeout` for a TTL: whole seconds, rounded up (the server keeps an idle
/// session at least that long), at least 1.
fn wait_secs(ttl: Duration) -> u64 {
    (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1)
}

fn map_err(e: mysql_async::Error, doing: &str) -> LockError {
    // A certificate refused, ours or the server's.
    #[cfg(feature = "tls")]
    if let Some((kind, words)) = distlock_tls::classify(&e) {
        return LockError::new(kind, format!("{doing}: {words}"));
    }
    let kind = match &e {
        mysql_async::Error::Server(s) => match s.code {
            // Access denied (user, database, command, table); 3159: clear text where the
            // server requires secure transport.
            1044 | 1045 | 1095 | 1142 | 1227 | 1698 | 3159 => ErrorKind::Auth,
            1049 => ErrorKind::Config,
            // Too many connections (the server's max_connections, or the account's
            // max_user_connections): nothing was opened; a wait tries again.
            1040 | 1203 => ErrorKind::Exhausted,
            _ => ErrorKind::Protocol,
        },
        mysql_async::Error::Io(_) => ErrorKind::Connection,
        mysql_async::Error::Url(_) => ErrorKind::Config,
        mysql_async::Error::Driver(_) | mysql_async::Error::Other(_) => ErrorKind::Connection,
    };
    // An I/O error reads "Input/output error: Input/output error: <cause>" in the driver's
    // words: say the cause once, and keep it (a copy) as the source.
    if let mysql_async::Error::Io(_) = &e
        && let Some(io) = innermost_io(&e)
    {
        let cause = std::io::Error::new(io.kind(), io.to_string());
        return LockError::new(kind, format!("{doing}: {io}")).with_source(cause);
    }
    LockError::caused_by(kind, doing, e)
}

/// The last `std::io::Error` in an error's chain of causes.
fn innermost_io<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a std::io::Error> {
    let mut found = None;
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            found = Some(io);
        }
        cause = c.source();
    }
    found
}

/// Why a session ended, from the error its statement failed with; `until` is when its
/// `wait_timeout` would have run out.
fn why_ended(e: &mysql_async::Error, until: Option<Instant>) -> LostReason {
    match e {
        // ER_CONNECTION_KILLED, ER_SERVER_SHUTDOWN: somebody took the locks away.
        mysql_async::Error::Server(s) if s.code == 1927 || s.code == 1053 => LostReason::Stolen,
        // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8.0.24+): the wait_timeout ran out.
        mysql_async::Error::Server(s) if s.code == 4031 => LostReason::Expired,
        _ if until.is_some_and(|u| Instant::now() >= u) => LostReason::Expired,
        _ => LostReason::Unreachable,
    }
}

/// Whether the error leaves the connection unusable (as opposed to a statement the server
/// refused on a live session).
fn breaks_connection(e: &mysql_async::Error) -> bool {
    match e {
        mysql_async::Error::Server(s) => matches!(s.code, 1927 | 1053 | 4031),
        _ => true,
    }
}

/// A session of the pool: one connection, used by one statement at a time.
pub(crate) struct MySession {
    conn: Arc<tokio::sync::Mutex<Option<Conn>>>,
    end: SessionEnd,
    /// When the server may end it for silence (after the last `wait_timeout` set).
    until: Mutex<Option<Instant>>,
    /// The `wait_timeout` in effect once the statements built so far have run (0: the
    /// server's default).
    secs: Mutex<u64>,
    /// The owner written in `distlock_sessions` for this connection (MariaDB's sequence
    /// fences).
    label: Mutex<Option<String>>,
    /// The semaphore permits held (or being taken) on this connection, by the semaphore's
    /// server name ([`permits::semaphore_name`]): one per semaphore on a session.
    permits: Mutex<HashMap<String, permits::PermitHold>>,
    limit: Duration,
}

impl MySession {
    fn new(conn: Conn, end: SessionEnd, limit: Duration) -> Self {
        MySession {
            conn: Arc::new(tokio::sync::Mutex::new(Some(conn))),
            end,
            until: Mutex::new(None),
            secs: Mutex::new(0),
            label: Mutex::new(None),
            permits: Mutex::new(HashMap::new()),
            limit,
        }
    }

    /// The statement setting `wait_timeout` to cover `keep` from now: always, or only when the
    /// value changes. Built under the connection's lock, in the order statements run.
    fn keep_sql(&self, keep: Duration, always: bool) -> Option<String> {
        let secs = wait_secs(keep);
        let until = Instant::now() + Duration::from_secs(secs);
        {
            let mut u = self.until.locked();
            *u = Some(u.map_or(until, |x| x.max(until)));
        }
        let mut current = self.secs.locked();
        if !always && *current == secs {
            return None;
        }
        *current = secs;
        Some(format!("SET SESSION wait_timeout = {secs}"))
    }

    /// Runs `sql` on the connection in `slot` and returns the last row any of its statements
    /// returned. A statement that fails the connection, or does not answer in time, ends the
    /// session.
    async fn run_in(
        &self,
        slot: &mut Option<Conn>,
        sql: &Sql,
        doing: &str,
    ) -> Result<Vec<Row>, LockError> {
        let Some(conn) = slot.as_mut() else {
            return Err(LockError::new(
                ErrorKind::Connection,
                format!("{doing}: the session has ended"),
            ));
        };
        let work = async {
            match sql {
                Sql::Text(text) => last_rows(conn.query_iter(text.as_str()).await?).await,
                Sql::Prepared(text, params) => {
                    last_rows(conn.exec_iter(*text, params.clone()).await?).await
                }
            }
        };
        match tokio::time::timeout(self.limit, work).await {
            Ok(Ok(row)) => Ok(row),
            Ok(Err(e)) => {
                if breaks_connection(&e) {
                    slot.take();
                    self.end.end(why_ended(&e, *self.until.locked()));
                }
                Err(map_err(e, doing))
            }
            Err(_) => {
                // Cut off half-way: the connection's state is unknown, so it is not used
                // again. It stays open, though, until the longest lease on it has run out:
                // closing it would free its locks on the server at once, before their holders'
                // deadlines (the fault harness caught it: a paused server, a renewal timed out,
                // and the next holder took the lock 0.6 s before the first one's deadline).
                if let Some(conn) = slot.take() {
                    let until = *self.until.locked();
                    tokio::spawn(async move {
                        if let Some(until) = until {
                            tokio::time::sleep_until(until).await;
                        }
                        drop(conn);
                    });
                }
                self.end.end(LostReason::Unreachable);
                Err(LockError::new(
                    ErrorKind::Timeout,
                    format!("{doing}: no answer within {:?}", self.limit),
                ))
            }
        }
    }

    /// Runs `sql` (one or more statements) once the connection is free.
    async fn run(&self, sql: &str, doing: &str) -> Result<Option<Row>, LockError> {
        let mut slot = self.conn.lock().await;
        self.run_in(&mut slot, &Sql::Text(sql.to_owned()), doing)
            .await
            .map(|mut rows| rows.pop())
    }
}

/// What a session runs: SQL text (one or more statements), or one statement prepared once per
/// connection (mysql_async's statement cache) with its parameters: no parsing on the server.
pub(crate) enum Sql {
    Text(String),
    Prepared(&'static str, Vec<Value>),
}

/// The rows of the last result set of `result` that has any.
async fn last_rows<P: mysql_async::prelude::Protocol>(
    mut result: mysql_async::QueryResult<'_, 'static, P>,
) -> Result<Vec<Row>, mysql_async::Error> {
    let mut last = Vec::new();
    while !result.is_empty() {
        let rows: Vec<Row> = result.collect().await?;
        if !rows.is_empty() {
            last = rows;
        }
    }
    Ok(last)
}

/// A statement on a session: `build` writes it once the connection is free (so statements run
/// in the order they were built, which the idle timeouts they set rely on).
///
/// It runs in the caller's task; if the caller is dropped half-way, the rest of it goes on in a
/// task of its own, since a statement cut off half-way would leave the connection's state
/// unknown (and end the session, with every lock on it).
async fn on_session(
    session: &Arc<MySession>,
    build: impl FnOnce() -> Sql,
    doing: &'static str,
) -> Result<Option<Row>, LockError> {
    on_session_all(session, build, doing)
        .await
        .map(|mut rows| rows.pop())
}

/// As [`on_session`], with every row of the last result set that has any.
async fn on_session_all(
    session: &Arc<MySession>,
    build: impl FnOnce() -> Sql,
    doing: &'static str,
) -> Result<Vec<Row>, LockError> {
    let mut slot = session.conn.clone().lock_owned().await;
    let sql = build();
    let session = session.clone();
    let mut statement = Detached(Some(Box::pin(async move {
        session.run_in(&mut slot, &sql, doing).await
    })));
    let out = std::future::poll_fn(|cx| match statement.0.as_mut() {
        Some(f) => f.as_mut().poll(cx),
        None => std::task::Poll::Pending,
    })
    .await;
    statement.0 = None;
    out
}

type Statement = std::pin::Pin<Box<dyn Future<Output = Result<Vec<Row>, LockError>> + Send>>;

/// A statement in flight: finished in a task of its own if dropped before it completes.
struct Detached(Option<Statement>);

impl Drop for Detached {
    fn drop(&mut self) {
        if let Some(rest) = self.0.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(rest);
        }
    }
}

/// The SQL half of the pool.
pub(crate) struct MyOps {
    config: MysqlConfig,
    fences: FenceSource,
    server: Server,
}

/// What the server is, as far as the engine's statements care.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Server {
    /// MariaDB (its own names for some session variables).
    mariadb: bool,
    /// Recursive common table expressions (MySQL 8.0, MariaDB 10.2.2): the semaphore's
    /// statements need them.
    ctes: bool,
}

impl MyOps {
    async fn connect(&self) -> Result<Conn, LockError> {
        connect(&self.config).await
    }
}

async fn connect(c: &MysqlConfig) -> Result<Conn, LockError> {
    const DOING: &str = "connecting to MySQL";
    let attempt = |opts: &Opts| {
        let opts = opts.clone();
        async move {
            tokio::time::timeout(c.connect_timeout, Conn::new(opts))
                .await
                .map_err(|_| LockError::new(ErrorKind::Timeout, format!("{DOING}: no answer")))
        }
    };
    let Some(tls) = &c.tls_opts else {
        return attempt(&c.opts).await?.map_err(|e| map_err(e, DOING));
    };
    match attempt(tls).await? {
        Ok(conn) => Ok(conn),
        Err(mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer)) => {
            if c.ssl_mode == SslMode::Preferred {
                // PREFERRED, as MySQL's clients: clear text when the server has no TLS.
                attempt(&c.opts).await?.map_err(|e| map_err(e, DOING))
            } else {
                Err(config_err(format!(
                    "{DOING}: the server does not offer TLS, and ssl-mode={:?} asks for it \
                     (PREFERRED allows clear text)",
                    c.ssl_mode
                )))
            }
        }
        Err(e) => Err(map_err(e, DOING)),
    }
}

impl SessionOps for MyOps {
    type Conn = Arc<MySession>;

    fn open(&self, end: SessionEnd) -> BoxFuture<'_, Result<Arc<MySession>, LockError>> {
        Box::pin(async move {
            let conn = self.connect().await?;
            Ok(Arc::new(MySession::new(
                conn,
                end,
                self.config.response_timeout,
            )))
        })
    }

    fn close(&self, session: &Arc<MySession>) {
        // Dropping the connection closes it: the server frees its locks.
        let session = session.clone();
        if let Ok(mut slot) = session.conn.try_lock() {
            slot.take();
        } else if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                session.conn.lock().await.take();
            });
        }
    }

    fn unlock<'a>(
        &'a self,
        session: &'a Arc<MySession>,
        key: &'a str,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(async move {
            if let Some(base) = key.strip_prefix(SHARED_PREFIX) {
                // (GET_LOCK has no shared mode: the engine's only shared keys are permits.)
                return self.unlock_permit(session, base).await;
            }
            let sql = || Sql::Prepared("SELECT RELEASE_LOCK(?)", vec![Value::from(key)]);
            let row = on_session(session, sql, "releasing a MySQL named lock").await?;
            Ok(row.and_then(|r| int(&r, 0)) == Some(1))
        })
    }

    fn ping<'a>(
        &'a self,
        session: &'a Arc<MySession>,
        keep: &'a (dyn Fn() -> Duration + Send + Sync),
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let build = || Sql::Text(session.keep_sql(keep(), true).unwrap_or_default());
            on_session(session, build, "renewing MySQL named locks")
                .await
                .map(drop)
        })
    }
}

struct MysqlShared {
    pool: Arc<SessionPool<MyOps>>,
    /// This client's holders recorded in `distlock_holders` (see `recorded`).
    recorded: recorded::LeaderRows,
    /// The server names whose lock names this client recorded (see `names`).
    names: names::NameRecorder,
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
///   on it is reported lost.
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

/// A connection of its own (the first checks, breaking a lock), closed when dropped.
async fn dedicated(config: &MysqlConfig) -> Result<MySession, LockError> {
    Ok(MySession::new(
        connect(config).await?,
        SessionEnd::default(),
        config.response_timeout,
    ))
}

fn int(row: &Row, i: usize) -> Option<i64> {
    row.get::<Option<i64>, _>(i).flatten()
}

/// Why a server without recursive common table expressions has no semaphores.
pub(crate) const NO_CTES: &str = "the semaphore's statements need recursive common table \
     expressions: MySQL 8.0 or MariaDB 10.2.2 and later";

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

    fn acquire<'a>(
        &'a self,
        req: &'a AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Attempt, LockError>> {
        Box::pin(async move {
            const DOING: &str = "acquiring a MySQL named lock";
            // For `distlock list` (the server shows its named locks only in performance_schema).
            self.record_name(req.name, req.kind);
            let pool = &self.inner.pool;
            let token = req.token.as_str();
            if req.mode.is_resend()
                && let Some(lease) = pool.held(req.name, token)
                && !lease.session().is_over()
            {
                // The reply came after all: the lock is ours already (a recorded holder's fence is
                // known).
                return Ok(Attempt::Acquired {
                    fence: self.recorded_fence(token),
                });
            }
            if let LeaseKind::Permit { permits } = req.kind {
                return self.acquire_permit(req, permits).await;
            }
            let key = lock_name(req.name);
            let name = name_lit(&key);
            let fences = pool.ops().fences;
            let mut tries = 0;
            loop {
                let placed = (req.name, key.as_str(), token);
                let Some(lease) = pool.place_try(&mut tries, placed, req.ttl, DOING).await? else {
                    return Ok(Attempt::Busy { holder_ttl: None });
                };
                let session = lease.session();
                let my = session.conn();
                let sent = Instant::now();
                let build = || {
                    let keep = pool.keep_for(session, req.ttl);
                    let mut sql = String::with_capacity(96);
                    if let Some(set) = my.keep_sql(keep, false) {
                        sql.push_str(&set);
                        sql.push_str("; ");
                    }
                    match fences {
                        FenceSource::Sequence => {
                            // The holder's label, once per connection (and owner): `status` finds it
                            // through IS_USED_LOCK's connection id.
                            let mut label = my.label.locked();
                            if label.as_deref() != Some(req.owner) {
                                let holder = lit(&HolderValue::now("-", req.owner).encode());
                                let ttl_ms = req.ttl.as_millis();
                                sql.push_str(&format!(
                                    "REPLACE INTO distlock_sessions (id, holder, ttl_ms) \
                                     VALUES (CONNECTION_ID(), {holder}, {ttl_ms}); "
                                ));
                                *label = Some(req.owner.to_owned());
                            }
                            // NEXTVAL only once the lock is ours (IF evaluates its condition
                            // first): the fence, or NULL when busy.
                            if sql.is_empty() {
                                // The common case: one statement, prepared once per connection.
                                return Sql::Prepared(
                                    "SELECT IF(GET_LOCK(?, 0) = 1, NEXTVAL(distlock_fence), NULL)",
                                    vec![Value::from(key.as_str())],
                                );
                            }
                            sql.push_str("SELECT IF(GET_LOCK(");
                            sql.push_str(&name);
                            sql.push_str(", 0) = 1, NEXTVAL(distlock_fence), NULL)");
                        }
                        FenceSource::Counter => {
                            let holder = lit(&HolderValue::now(token, req.owner).encode());
                            let ttl_ms = req.ttl.as_millis();
                            sql.push_str(&format!(
                                "SELECT GET_LOCK({name}, 0) INTO @distlock_got; \
                                 INSERT INTO distlock_locks (name, fence, holder, ttl_ms) \
                                   SELECT {name}, LAST_INSERT_ID(1), {holder}, {ttl_ms} FROM DUAL \
                                   WHERE @distlock_got = 1 \
                                   ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(fence + 1), \
                                     holder = VALUES(holder), ttl_ms = VALUES(ttl_ms); \
                                 SELECT @distlock_got, IF(@distlock_got = 1, LAST_INSERT_ID(), NULL)"
                            ));
                        }
                    }
                    Sql::Text(sql)
                };
                let row = match on_session(my, build, DOING).await {
                    Ok(row) => row,
                    // GET_LOCK may have succeeded before a later statement failed.
                    Err(e) => {
                        pool.failed(&lease, e).await?;
                        continue;
                    }
                };
                let Some(row) = row else {
                    pool.withdraw_unknown(&lease).await;
                    return Err(LockError::new(
                        ErrorKind::Protocol,
                        format!("{DOING}: no row came back"),
                    ));
                };
                let (got, fence) = match fences {
                    FenceSource::Sequence => (int(&row, 0).is_some(), int(&row, 0)),
                    FenceSource::Counter => (int(&row, 0) == Some(1), int(&row, 1)),
                };
                if !got {
                    pool.withdraw(&lease);
                    return Ok(Attempt::Busy { holder_ttl: None });
                }
                if !pool.confirm(&lease, sent, req.ttl, req.renewed) {
                    return Ok(Attempt::Busy { holder_ttl: None });
                }
                let fence = fence.and_then(|f| u64::try_from(f).ok());
                // With a sequence, a holder whose fence `status` must give writes it (see
                // `recorded`); with the counter table, every holder's is kept.
                if let (true, FenceSource::Sequence, Some(f)) = (req.recorded, fences, fence)
                    && let Err(e) = self.record(req, f).await
                {
                    let _ = pool.release(req.name, token).await;
                    return Err(e);
                }
                return Ok(Attempt::Acquired { fence });
            }
        })
    }

    fn release<'a>(
        &'a self,
        lease: &'a LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>> {
        Box::pin(async move {
            let released = self
                .inner
                .pool
                .release(lease.name, lease.token.as_str())
                .await;
            self.unrecord(lease.token.as_str()).await;
            released
        })
    }

    /// The mutex of the name, or if nobody holds it, the holders of the semaphore of the name.
    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<LockStatus, LockError>> {
        Box::pin(async move {
            let status = self.lock_status(key).await?;
            if status.held || !self.inner.pool.ops().server.ctes {
                return Ok(status);
            }
            let permits = self.semaphore_status(key).await?;
            Ok(if permits.held { permits } else { status })
        })
    }

    fn batch_renew(&self) -> Option<&dyn BatchRenew> {
        Some(self)
    }

    fn sessions(&self) -> Option<&dyn Sessions> {
        Some(self)
    }

    fn lister(&self) -> Option<&dyn distlock_core::engine::Lister> {
        Some(self)
    }

    fn breaker(&self) -> Option<&dyn Breaker> {
        Some(self)
    }

    fn relabel(&self) -> Option<&dyn distlock_core::engine::Relabel> {
        Some(self)
    }
}

impl MysqlBackend {
    /// Who holds the mutex of `key`.
    async fn lock_status(&self, key: &str) -> Result<LockStatus, LockError> {
        const DOING: &str = "reading a MySQL lock's status";
        let name = name_lit(&lock_name(key));
        let idle = format!(
            "(SELECT p.TIME FROM information_schema.PROCESSLIST p \
              WHERE p.ID = IS_USED_LOCK({name}))"
        );
        // The holder's label, its fence where it was recorded, its TTL, how long its session
        // has been idle, and the highest fence issued (for a cached sequence, the end of the
        // cache handed out so far: an upper bound).
        let sql = match self.inner.pool.ops().fences {
            FenceSource::Counter => format!(
                "SELECT IS_USED_LOCK({name}), l.holder, l.fence, l.ttl_ms, {idle}, l.fence \
                 FROM (SELECT 1) AS one LEFT JOIN distlock_locks l ON l.name = {name}"
            ),
            // A holder that recorded itself (see `recorded`) is named by its own row.
            FenceSource::Sequence => format!(
                "SELECT IS_USED_LOCK({name}), COALESCE(h.holder, s.holder), h.fence, s.ttl_ms, \
                        {idle}, (SELECT next_not_cached_value - 1 FROM distlock_fence) \
                 FROM (SELECT 1) AS one \
                 LEFT JOIN distlock_sessions s ON s.id = IS_USED_LOCK({name}) \
                 LEFT JOIN distlock_holders h ON h.name = {name} \
                   AND h.conn_id = IS_USED_LOCK({name})"
            ),
        };
        let session = self.inner.pool.any_session().await?;
        let Some(row) = on_session(session.conn(), || Sql::Text(sql), DOING).await? else {
            return Ok(LockStatus::free());
        };
        let fence = int(&row, 2).and_then(|f| u64::try_from(f).ok());
        let last_fence = int(&row, 5).and_then(|f| u64::try_from(f).ok());
        if int(&row, 0).is_none() {
            return Ok(LockStatus::free().with_last_fence(last_fence));
        }
        let holder: Option<String> = row.get::<Option<String>, _>(1).flatten();
        let owner = holder.map(|h| HolderValue::parse(&h).label());
        let ttl = int(&row, 3).map(|t| {
            let idle_ms = int(&row, 4).unwrap_or(0).saturating_mul(1000);
            Duration::from_millis(u64::try_from(t - idle_ms).unwrap_or(0))
        });
        Ok(LockStatus::held(owner, fence, ttl).with_last_fence(last_fence))
    }
}

impl BatchRenew for MysqlBackend {
    /// One statement per session (setting its `wait_timeout`), however many of its locks are
    /// due: a session that answers still holds every lock it took and did not release.
    fn renew_many<'a>(
        &'a self,
        items: &'a [RenewItem<'a>],
    ) -> BoxFuture<'a, Vec<Result<LeaseCheck, LockError>>> {
        Box::pin(
            self.inner
                .pool
                .renew_many_seeded(items, SeededBug::MysqlSessionHeld),
        )
    }

    /// See [`RENEW_CHUNK`](distlock_core::recipes::pool::RENEW_CHUNK): a chunk costs a
    /// statement per session it touches, whatever its size.
    fn max_batch(&self) -> usize {
        distlock_core::recipes::pool::RENEW_CHUNK
    }
}

impl Sessions for MysqlBackend {
    /// The end of the session the lock is on, as its next statement finds it.
    fn session_end(&self, lease: &LeaseRef<'_>) -> SessionWatch {
        self.inner
            .pool
            .session_end_seeded(lease.token.as_str(), SeededBug::MysqlSessionHeld)
    }

    /// Unless the client released it at its deadline meanwhile (nobody renewed it).
    fn still_on(&self, lease: &LeaseRef<'_>, session: u64) -> bool {
        self.inner.pool.still_on(lease.token.as_str(), session)
    }

    /// The client releases it when `ttl` has passed: a named lock cannot move to a session of
    /// its own, and the session lives on for its other locks.
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

impl Breaker for MysqlBackend {
    /// Kills the holding connection (`KILL CONNECTION`), which frees the lock and every other
    /// lock on that connection, and waits (up to 5 s) until the server has let it go. Needs the
    /// right to kill that connection (the same user, or `CONNECTION ADMIN`/`SUPER`).
    fn break_once<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<BreakOutcome, LockError>> {
        Box::pin(self.kill_holder(key))
    }
}

impl MysqlBackend {
    async fn kill_holder(&self, key: &str) -> Result<BreakOutcome, LockError> {
        const DOING: &str = "breaking a MySQL lock";
        let st = self.lock_status(key).await?;
        if !st.held {
            if self.inner.pool.ops().server.ctes && self.semaphore_status(key).await?.held {
                return Err(shares_unbreakable(key, "a semaphore's permits"));
            }
            return Ok(BreakOutcome::Free);
        }
        let who = format!("SELECT IS_USED_LOCK({})", name_lit(&lock_name(key)));
        // A connection of its own: the holder may be a session of this very pool.
        let session = dedicated(&self.inner.pool.ops().config).await?;
        let row = session.run(&who, DOING).await?;
        let Some(id) = row.as_ref().and_then(|r| int(r, 0)) else {
            return Ok(BreakOutcome::Free);
        };
        if let Err(e) = session.run(&format!("KILL CONNECTION {id}"), DOING).await
            && e.kind() != ErrorKind::Protocol
        {
            // Refused (`Auth`), or our connection failed. (`Protocol`: most likely the
            // holder's connection ended meanwhile; the check below tells.)
            return Err(e);
        }
        for _ in 0..50 {
            let now = session.run(&who, DOING).await?;
            if now.as_ref().and_then(|r| int(r, 0)) != Some(id) {
                return Ok(BreakOutcome::Broken(st));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(LockError::new(
            ErrorKind::Timeout,
            format!("{DOING}: connection {id} was killed but still held the lock after 5 s"),
        ))
    }
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

    #[test]
    fn wait_timeouts_round_up() {
        assert_eq!(wait_secs(Duration::from_millis(300)), 1);
        assert_eq!(wait_secs(Duration::from_millis(1500)), 2);
        assert_eq!(wait_secs(Duration::from_secs(30)), 30);
    }
}
