//! The MySQL/MariaDB engine: `GET_LOCK` on a connection its guard owns.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BoxFuture, BreakOutcome, Breaker, Capabilities, ErrorKind,
    Fencing, HolderValue, LeaseCheck, LeaseRef, LockError, LockStatus, MutexExt,
};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Row, Value};
use sha2::{Digest, Sha256};

/// How to reach MySQL or MariaDB.
///
/// From a URL: `mysql://[user[:password]@]host[:port]/database[?params]` (also `mariadb://`).
/// The database is required: the engine keeps its table `distlock_locks` there. Parameters:
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | `idle_connections` | `16` | connections kept open between locks |
/// | `connect_timeout` | `3s` | per connection attempt |
/// | `response_timeout` | `2s` | per statement |
#[derive(Clone)]
pub struct MysqlConfig {
    opts: Opts,
    idle_connections: usize,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl fmt::Debug for MysqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlConfig")
            .field("host", &self.opts.ip_or_hostname())
            .field("port", &self.opts.tcp_port())
            .field("user", &self.opts.user())
            .field("database", &self.opts.db_name())
            .field("idle_connections", &self.idle_connections)
            .finish_non_exhaustive()
    }
}

fn config_err(msg: impl Into<String>) -> LockError {
    LockError::new(ErrorKind::Config, msg.into())
}

impl MysqlConfig {
    /// Parses a `mysql://` or `mariadb://` URL.
    ///
    /// # Errors
    /// `Config` for another scheme, a malformed URL, no database, or a bad parameter.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let rest = url
            .strip_prefix("mysql://")
            .or_else(|| url.strip_prefix("mariadb://"))
            .ok_or_else(|| {
                config_err(format!(
                    "not a mysql:// URL: {:?}",
                    distlock_core::url::redact(url)
                ))
            })?;
        let (base, query) = match rest.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (rest, None),
        };
        let mut cfg_idle = 16;
        let mut connect_timeout = Duration::from_secs(3);
        let mut response_timeout = Duration::from_secs(2);
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if pair.is_empty() {
                continue;
            }
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "idle_connections" => {
                    cfg_idle = v.parse().map_err(|_| {
                        config_err(format!("idle_connections={v:?} is not a number"))
                    })?;
                }
                "connect_timeout" | "response_timeout" => {
                    let d = distlock_core::parse_duration(v)
                        .ok()
                        .filter(|d| !d.is_zero())
                        .ok_or_else(|| {
                            config_err(format!("{k}={v:?}: a duration such as 2s or 500ms"))
                        })?;
                    if k == "connect_timeout" {
                        connect_timeout = d;
                    } else {
                        response_timeout = d;
                    }
                }
                other => {
                    return Err(config_err(format!(
                        "unknown mysql URL parameter {other:?} (known: idle_connections, \
                         connect_timeout, response_timeout)"
                    )));
                }
            }
        }
        let opts = Opts::from_url(&format!("mysql://{base}")).map_err(|e| {
            config_err(format!(
                "bad mysql URL {:?}: {e}",
                distlock_core::url::redact(url)
            ))
        })?;
        if opts.db_name().is_none_or(str::is_empty) {
            return Err(config_err(format!(
                "{:?} names no database (mysql://host/db): the engine keeps its table there",
                distlock_core::url::redact(url)
            )));
        }
        let opts = OptsBuilder::from_opts(opts).stmt_cache_size(0).into();
        Ok(MysqlConfig {
            opts,
            idle_connections: cfg_idle,
            connect_timeout,
            response_timeout,
        })
    }
}

/// The server-side lock name of a lock: `dl:<name>` when that is at most 64 characters of
/// letters, digits and `_ . : / -`; otherwise `dl:sha256:` and the first 48 hex digits of
/// SHA-256 of the name (MySQL limits lock names to 64 characters).
pub fn lock_name(name: &str) -> String {
    let plain = name.len() <= 61
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:/-".contains(&b));
    if plain {
        return format!("dl:{name}");
    }
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest[..24].iter().map(|b| format!("{b:02x}")).collect();
    format!("dl:sha256:{hex}")
}

/// A SQL string literal (escaped by the driver's rules).
fn lit(s: &str) -> String {
    Value::from(s).as_sql(false)
}

/// The session's `wait_timeout` for a TTL: whole seconds, rounded up (the server keeps an idle
/// session at least that long), at least 1.
fn wait_secs(ttl: Duration) -> u64 {
    (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1)
}

fn map_err(e: mysql_async::Error, doing: &str) -> LockError {
    let kind = match &e {
        mysql_async::Error::Server(s) => match s.code {
            // Access denied (user, database, command, table).
            1044 | 1045 | 1095 | 1142 | 1227 | 1698 => ErrorKind::Auth,
            1049 => ErrorKind::Config,
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

/// A lock we hold, and the connection that holds it (taken out by the release; renewals of
/// different locks run at once, each on its own connection).
struct Held {
    key: String,
    conn: Arc<tokio::sync::Mutex<Option<Conn>>>,
}

struct Inner {
    config: MysqlConfig,
    idle: Mutex<Vec<Conn>>,
    held: Mutex<HashMap<String, Held>>,
}

/// A lock engine on MySQL's and MariaDB's named locks (`GET_LOCK`).
///
/// - **acquire** takes a connection of its own and, in one round trip, sets its `wait_timeout`
///   to the TTL, tries `GET_LOCK(name, 0)`, and only if it got the lock bumps the lock's counter
///   in the table `distlock_locks` (the fence) and records the holder there (for `status`);
/// - **the lease** is the connection's silence: the server closes a connection idle for
///   `wait_timeout` seconds, and its locks with it. The watchdog's renewal is a statement on
///   the connection (restarting that clock) that checks `IS_USED_LOCK(name) = CONNECTION_ID()`;
/// - **release** is `RELEASE_LOCK(name)`, and the connection goes back to the pool.
///
/// Any error on a connection drops it: closing it is the only sure release.
#[derive(Clone)]
pub struct MysqlBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for MysqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlBackend")
            .field("config", &self.inner.config)
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
        let backend = MysqlBackend {
            inner: Arc::new(Inner {
                config,
                idle: Mutex::new(Vec::new()),
                held: Mutex::new(HashMap::new()),
            }),
        };
        let mut conn = backend.open().await?;
        backend
            .run(
                &mut conn,
                "CREATE TABLE IF NOT EXISTS distlock_locks (\
                   name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY, \
                   fence BIGINT UNSIGNED NOT NULL, holder VARCHAR(2048) NOT NULL, \
                   ttl_ms BIGINT NOT NULL) ENGINE=InnoDB",
                "creating the table distlock_locks",
            )
            .await?;
        backend.put_back(conn);
        Ok(backend)
    }

    async fn open(&self) -> Result<Conn, LockError> {
        const DOING: &str = "connecting to MySQL";
        let c = &self.inner.config;
        tokio::time::timeout(c.connect_timeout, Conn::new(c.opts.clone()))
            .await
            .map_err(|_| LockError::new(ErrorKind::Timeout, format!("{DOING}: no answer")))?
            .map_err(|e| map_err(e, DOING))
    }

    /// Runs `sql` (one or more statements) and returns the last row any of them returned.
    async fn run(&self, conn: &mut Conn, sql: &str, doing: &str) -> Result<Option<Row>, LockError> {
        let limit = self.inner.config.response_timeout;
        let work = async {
            let mut result = conn.query_iter(sql).await?;
            let mut last = None;
            while !result.is_empty() {
                let rows: Vec<Row> = result.collect().await?;
                if let Some(r) = rows.into_iter().last() {
                    last = Some(r);
                }
            }
            Ok::<_, mysql_async::Error>(last)
        };
        tokio::time::timeout(limit, work)
            .await
            .map_err(|_| {
                LockError::new(
                    ErrorKind::Timeout,
                    format!("{doing}: no answer within {limit:?}"),
                )
            })?
            .map_err(|e| map_err(e, doing))
    }

    /// An idle connection, or a new one.
    fn pooled(&self) -> Option<Conn> {
        self.inner.idle.locked().pop()
    }

    fn put_back(&self, conn: Conn) {
        let mut idle = self.inner.idle.locked();
        if idle.len() < self.inner.config.idle_connections {
            idle.push(conn);
        }
    }

    /// Runs `sql` on a pooled connection, or on a new one when the pooled one turns out closed
    /// (the server ends idle connections after their `wait_timeout`; a closed one ran nothing,
    /// and any lock it had went with it).
    async fn on_some_conn(&self, sql: &str, doing: &str) -> Result<(Conn, Option<Row>), LockError> {
        if let Some(mut conn) = self.pooled() {
            match self.run(&mut conn, sql, doing).await {
                Ok(row) => return Ok((conn, row)),
                Err(e) if e.kind() == ErrorKind::Connection => {}
                Err(e) => return Err(e),
            }
        }
        let mut conn = self.open().await?;
        let row = self.run(&mut conn, sql, doing).await?;
        Ok((conn, row))
    }
}

fn int(row: &Row, i: usize) -> Option<i64> {
    row.get::<Option<i64>, _>(i).flatten()
}

impl Backend for MysqlBackend {
    fn name(&self) -> &'static str {
        "mysql"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Monotonic, true)
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a MySQL named lock";
        // A resent attempt needs no check: the attempt whose reply was lost dropped its
        // connection, and the lock, if it got it, went with it.
        let name = lit(&lock_name(req.name));
        let holder = lit(&HolderValue::now(req.token.as_str(), req.owner).encode());
        let ttl_ms = req.ttl.as_millis();
        let sql = format!(
            "SET SESSION wait_timeout = {secs}; \
             SELECT GET_LOCK({name}, 0) INTO @distlock_got; \
             INSERT INTO distlock_locks (name, fence, holder, ttl_ms) \
               SELECT {name}, LAST_INSERT_ID(1), {holder}, {ttl_ms} FROM DUAL \
               WHERE @distlock_got = 1 \
               ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(fence + 1), \
                 holder = VALUES(holder), ttl_ms = VALUES(ttl_ms); \
             SELECT @distlock_got, IF(@distlock_got = 1, LAST_INSERT_ID(), NULL)",
            secs = wait_secs(req.ttl),
        );
        let (conn, row) = self.on_some_conn(&sql, DOING).await?;
        let row = row.ok_or_else(|| {
            LockError::new(ErrorKind::Protocol, format!("{DOING}: no row came back"))
        })?;
        if int(&row, 0) != Some(1) {
            self.put_back(conn);
            return Ok(Attempt::Busy { holder_ttl: None });
        }
        let fence = int(&row, 1).and_then(|f| u64::try_from(f).ok());
        self.inner.held.locked().insert(
            req.token.as_str().to_owned(),
            Held {
                key: req.name.to_owned(),
                conn: Arc::new(tokio::sync::Mutex::new(Some(conn))),
            },
        );
        Ok(Attempt::Acquired { fence })
    }

    async fn renew(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        let (key, token) = (lease.name, lease.token);
        let Some(slot) = self
            .inner
            .held
            .locked()
            .get(token.as_str())
            .filter(|h| h.key == key)
            .map(|h| h.conn.clone())
        else {
            return Ok(LeaseCheck::Missing);
        };
        let mut slot = slot.lock().await;
        let Some(conn) = slot.as_mut() else {
            return Ok(LeaseCheck::Missing);
        };
        let sql = format!(
            "SET SESSION wait_timeout = {}; SELECT IS_USED_LOCK({name}) = CONNECTION_ID(), \
             IS_USED_LOCK({name}) IS NULL",
            wait_secs(ttl),
            name = lit(&lock_name(key)),
        );
        match self.run(conn, &sql, "renewing a MySQL named lock").await {
            Ok(Some(row)) if int(&row, 0) == Some(1) => Ok(LeaseCheck::Ours),
            Ok(Some(row)) if int(&row, 1) == Some(1) => Ok(LeaseCheck::Missing),
            Ok(_) => Ok(LeaseCheck::Foreign),
            // The connection is gone, and its lock with it.
            Err(e) if e.kind() == ErrorKind::Connection => {
                *slot = None;
                Ok(LeaseCheck::Missing)
            }
            Err(e) => Err(e),
        }
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        let (key, token) = (lease.name, lease.token);
        let held = {
            let mut map = self.inner.held.locked();
            match map.get(token.as_str()) {
                Some(h) if h.key == key => map.remove(token.as_str()),
                _ => None,
            }
        };
        let Some(held) = held else {
            return Ok(LeaseCheck::Missing);
        };
        let Some(mut conn) = held.conn.lock().await.take() else {
            return Ok(LeaseCheck::Missing);
        };
        let sql = format!("SELECT RELEASE_LOCK({})", lit(&lock_name(key)));
        match self
            .run(&mut conn, &sql, "releasing a MySQL named lock")
            .await
        {
            Ok(row) => {
                self.put_back(conn);
                Ok(match row.and_then(|r| int(&r, 0)) {
                    Some(1) => LeaseCheck::Ours,
                    Some(0) => LeaseCheck::Foreign,
                    _ => LeaseCheck::Missing,
                })
            }
            // Closed: the lock went with the connection. (Dropped here either way.)
            Err(e) if e.kind() == ErrorKind::Connection => Ok(LeaseCheck::Missing),
            Err(e) => Err(e),
        }
    }

    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        const DOING: &str = "reading a MySQL lock's status";
        let name = lit(&lock_name(key));
        let sql = format!(
            "SELECT IS_USED_LOCK({name}), l.holder, l.fence, l.ttl_ms, \
                    (SELECT p.TIME FROM information_schema.PROCESSLIST p \
                      WHERE p.ID = IS_USED_LOCK({name})) \
             FROM (SELECT 1) AS one LEFT JOIN distlock_locks l ON l.name = {name}"
        );
        let (conn, row) = self.on_some_conn(&sql, DOING).await?;
        self.put_back(conn);
        let Some(row) = row else {
            return Ok(LockStatus::free());
        };
        let fence = int(&row, 2).and_then(|f| u64::try_from(f).ok());
        if int(&row, 0).is_none() {
            return Ok(LockStatus::free().with_last_fence(fence));
        }
        let holder: Option<String> = row.get::<Option<String>, _>(1).flatten();
        let owner = holder.map(|h| HolderValue::parse(&h).label());
        let ttl = int(&row, 3).map(|t| {
            let idle_ms = int(&row, 4).unwrap_or(0).saturating_mul(1000);
            Duration::from_millis(u64::try_from(t - idle_ms).unwrap_or(0))
        });
        Ok(LockStatus::held(owner, fence, ttl).with_last_fence(fence))
    }

    fn breaker(&self) -> Option<&dyn Breaker> {
        Some(self)
    }
}

impl Breaker for MysqlBackend {
    /// Kills the holding connection (`KILL CONNECTION`), which frees the lock, and waits (up
    /// to 5 s) until the server has let it go. Needs the right to kill that connection (the
    /// same user, or `CONNECTION ADMIN`/`SUPER`).
    fn break_once<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<BreakOutcome, LockError>> {
        Box::pin(self.kill_holder(key))
    }
}

impl MysqlBackend {
    async fn kill_holder(&self, key: &str) -> Result<BreakOutcome, LockError> {
        const DOING: &str = "breaking a MySQL lock";
        let st = self.inspect(key).await?;
        if !st.held {
            return Ok(BreakOutcome::Free);
        }
        let who = format!("SELECT IS_USED_LOCK({})", lit(&lock_name(key)));
        let (mut conn, row) = self.on_some_conn(&who, DOING).await?;
        let Some(id) = row.as_ref().and_then(|r| int(r, 0)) else {
            self.put_back(conn);
            return Ok(BreakOutcome::Free);
        };
        if let Err(e) = self
            .run(&mut conn, &format!("KILL CONNECTION {id}"), DOING)
            .await
            && e.kind() != ErrorKind::Protocol
        {
            // Refused (`Auth`), or our connection failed. (`Protocol`: most likely the
            // holder's connection ended meanwhile; the check below tells.)
            return Err(e);
        }
        for _ in 0..50 {
            let now = self.run(&mut conn, &who, DOING).await?;
            if now.as_ref().and_then(|r| int(r, 0)) != Some(id) {
                self.put_back(conn);
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
    fn urls() {
        let c = MysqlConfig::from_url(
            "mariadb://app:pw@db:3307/locks?idle_connections=2&response_timeout=500ms",
        )
        .unwrap();
        assert_eq!(c.idle_connections, 2);
        assert_eq!(c.response_timeout, Duration::from_millis(500));
        assert_eq!(c.opts.tcp_port(), 3307);
        for bad in [
            "mysql://h",
            "mysql://h/",
            "mysql://h/db?nonsense=1",
            "mysql://h/db?response_timeout=0",
            "postgres://h/db",
        ] {
            let e = MysqlConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
        }
        let e = MysqlConfig::from_url("mysql://u:topsecret@h/db?x=1").unwrap_err();
        assert!(!e.to_string().contains("topsecret"), "{e}");
    }

    #[test]
    fn wait_timeouts_round_up() {
        assert_eq!(wait_secs(Duration::from_millis(300)), 1);
        assert_eq!(wait_secs(Duration::from_millis(1500)), 2);
        assert_eq!(wait_secs(Duration::from_secs(30)), 30);
    }
}
