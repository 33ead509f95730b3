//! The PostgreSQL engine: session advisory locks, each on a connection its guard owns.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BoxFuture, BreakOutcome, Breaker, Capabilities, ErrorKind,
    Fencing, LeaseCheck, LeaseRef, LockError, LockStatus, LostReason, MutexExt, Sessions, Token,
};
use distlock_core::seeded::{self, SeededBug};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls, Statement};

use crate::config::PgConfig;
use crate::error::map_err;

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

/// Reads a holder label: its fence, TTL in milliseconds and owner.
fn parse_label(app: &str) -> Option<(u64, i64, String)> {
    let mut words = app.splitn(4, ' ');
    if words.next()? != APP_TAG {
        return None;
    }
    let fence = words.next()?.parse().ok()?;
    let ttl = words.next()?.parse().ok()?;
    Some((fence, ttl, words.next().unwrap_or_default().to_owned()))
}

/// The server's `idle_session_timeout` for a lock TTL, in whole milliseconds (at least 1: 0
/// would turn the timeout off).
fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// One session and the statements prepared on it.
pub(crate) struct Conn {
    pub(crate) client: Client,
    acquire: Statement,
    release: Statement,
    check: Statement,
    status: Statement,
    /// Set when the session ends, with why (as far as the server said).
    ended: watch::Receiver<Option<LostReason>>,
}

impl Conn {
    fn is_closed(&self) -> bool {
        self.client.is_closed() || self.ended.borrow().is_some()
    }
}

/// A lock we hold: its session, kept out of the pool until released.
struct Held {
    key: String,
    id: i64,
    conn: Arc<Conn>,
}

struct Inner {
    config: PgConfig,
    /// Open sessions holding no lock, for the next acquire.
    idle: Mutex<Vec<Arc<Conn>>>,
    /// The locks we hold, by token.
    held: Mutex<HashMap<String, Held>>,
}

/// A lock engine on PostgreSQL's session-level advisory locks.
///
/// - **acquire** takes a session of its own (from a small pool of idle ones) and, in one
///   statement, tries `pg_try_advisory_lock(id)` (`id` = [`lock_id`] of the name), takes the
///   fence from the sequence `distlock_fence` when it got the lock, writes the holder's label
///   (`distlock <fence> <ttl ms> <owner>`) in the session's `application_name` (for `status`,
///   through `pg_stat_activity`: no table write), and sets the session's
///   `idle_session_timeout` to the TTL;
/// - **the lease** is the session: the server ends a session that stays silent for
///   `idle_session_timeout` (PostgreSQL 14 or later), and with it the lock. The watchdog's
///   renewal is a statement on the session, which restarts that clock, and checks in
///   `pg_locks` that the session still holds the lock;
/// - **loss** is seen at once when the session ends (terminated, timed out, server gone): the
///   guard's lost signal fires without waiting for a renewal;
/// - **release** unlocks, turns the timeout off and returns the session to the pool.
///
/// Any error on a session drops it (closing it ends the session, so no lock can stay behind
/// on it: PostgreSQL keeps a session-level advisory lock even when its transaction fails).
#[derive(Clone)]
pub struct PgBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
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
        let backend = PgBackend {
            inner: Arc::new(Inner {
                config,
                idle: Mutex::new(Vec::new()),
                held: Mutex::new(HashMap::new()),
            }),
        };
        let conn = backend.setup().await?;
        backend.put_back(conn);
        Ok(backend)
    }

    /// The first session: checks the version and creates the engine's two objects.
    async fn setup(&self) -> Result<Arc<Conn>, LockError> {
        const DOING: &str = "preparing PostgreSQL for locks";
        let (client, ended) = self.open().await?;
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
        let s = &self.inner.config.schema;
        let ddl = format!("CREATE SEQUENCE IF NOT EXISTS {s}.distlock_fence");
        // Only when missing: a role without CREATE on the schema can use a sequence an
        // administrator made (CREATE … IF NOT EXISTS checks the privilege first).
        let missing: bool = client
            .query_one(
                &format!("SELECT to_regclass('{s}.distlock_fence') IS NULL"),
                &[],
            )
            .await
            .map_err(|e| map_err(e, DOING))?
            .get(0);
        if !missing {
            return self.prepare(client, ended).await;
        }
        // Two clients creating them at once can collide in the catalog: once more then.
        if let Err(e) = client.batch_execute(&ddl).await {
            let raced = e.code().is_some_and(|c| {
                *c == SqlState::UNIQUE_VIOLATION
                    || *c == SqlState::DUPLICATE_TABLE
                    || *c == SqlState::DUPLICATE_OBJECT
            });
            if !raced {
                return Err(map_err(e, DOING));
            }
            client
                .batch_execute(&ddl)
                .await
                .map_err(|e| map_err(e, DOING))?;
        }
        self.prepare(client, ended).await
    }

    /// Opens a session, whose connection runs in its own task.
    async fn open(&self) -> Result<(Client, watch::Receiver<Option<LostReason>>), LockError> {
        let (client, connection) = self
            .inner
            .config
            .pg
            .connect(NoTls)
            .await
            .map_err(|e| map_err(e, "connecting to PostgreSQL"))?;
        let (tx, rx) = watch::channel(None);
        tokio::spawn(async move {
            let why = match connection.await {
                Ok(()) => LostReason::Unreachable,
                Err(e) => why_ended(&e),
            };
            let _ = tx.send(Some(why));
        });
        Ok((client, rx))
    }

    async fn prepare(
        &self,
        client: Client,
        ended: watch::Receiver<Option<LostReason>>,
    ) -> Result<Arc<Conn>, LockError> {
        const DOING: &str = "preparing the lock statements";
        let s = &self.inner.config.schema;
        let in_pg_locks = IN_PG_LOCKS;
        // Granted: the fence, the lease (idle_session_timeout) and the holder's label in
        // application_name, which other sessions can read in pg_stat_activity (no write).
        let acquire = format!(
            "SELECT g.fence, CASE WHEN g.fence IS NOT NULL \
                    THEN set_config('idle_session_timeout', $2::text, false) \
                      || set_config('application_name', \
                           left('{APP_TAG} ' || g.fence || ' ' || $2::text || ' ' || $3::text, 63), \
                           false) END \
             FROM (SELECT CASE WHEN pg_try_advisory_lock($1::bigint) \
                               THEN nextval('{s}.distlock_fence') END AS fence) g"
        );
        let release = "SELECT pg_advisory_unlock($1::bigint), \
                       set_config('idle_session_timeout', '0', false)";
        let check = format!(
            "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = pg_backend_pid() \
                            AND {in_pg_locks}), \
                    set_config('idle_session_timeout', $2::text, false)"
        );
        let status = format!(
            "SELECT a.application_name, \
                    CASE WHEN a.state = 'idle' \
                         THEN (extract(epoch FROM now() - a.state_change) * 1000)::bigint END, \
                    (SELECT last_value FROM {s}.distlock_fence) \
             FROM pg_locks l \
             LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE {in_pg_locks}"
        );
        let acquire = client
            .prepare(&acquire)
            .await
            .map_err(|e| map_err(e, DOING))?;
        let release = client
            .prepare(release)
            .await
            .map_err(|e| map_err(e, DOING))?;
        let check = client
            .prepare(&check)
            .await
            .map_err(|e| map_err(e, DOING))?;
        let status = client
            .prepare(&status)
            .await
            .map_err(|e| map_err(e, DOING))?;
        Ok(Arc::new(Conn {
            client,
            acquire,
            release,
            check,
            status,
            ended,
        }))
    }

    /// An idle session, or a new one.
    pub(crate) async fn take(&self) -> Result<Arc<Conn>, LockError> {
        loop {
            let next = self.inner.idle.locked().pop();
            match next {
                Some(c) if c.is_closed() => continue,
                Some(c) => return Ok(c),
                None => {
                    let (client, ended) = self.open().await?;
                    return self.prepare(client, ended).await;
                }
            }
        }
    }

    /// Returns a session holding no lock to the pool (or closes it when the pool is full).
    pub(crate) fn put_back(&self, conn: Arc<Conn>) {
        if conn.is_closed() {
            return;
        }
        let mut idle = self.inner.idle.locked();
        if idle.len() < self.inner.config.idle_connections {
            idle.push(conn);
        }
    }

    /// The schema of the engine's objects.
    pub(crate) fn schema(&self) -> &str {
        &self.inner.config.schema
    }

    fn held(&self, token: &Token) -> Option<(String, i64, Arc<Conn>)> {
        self.inner
            .held
            .locked()
            .get(token.as_str())
            .map(|h| (h.key.clone(), h.id, h.conn.clone()))
    }
}

impl Backend for PgBackend {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Monotonic, true)
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a PostgreSQL advisory lock";
        if req.retry
            && let Some((key, _, conn)) = self.held(req.token)
            && key == req.name
            && !conn.is_closed()
        {
            // The reply came after all: the lock is ours already (never locked twice: a
            // session-level advisory lock counts its acquisitions).
            return Ok(Attempt::Acquired { fence: None });
        }
        let id = lock_id(req.name);
        let ttl = ttl_ms(req.ttl).to_string();
        let conn = self.take().await?;
        // Dropped on any error (and so is the session, with whatever it may hold).
        let row = conn
            .client
            .query_one(&conn.acquire, &[&id, &ttl, &req.owner])
            .await
            .map_err(|e| map_err(e, DOING))?;
        let fence: Option<i64> = row.get(0);
        let Some(fence) = fence else {
            self.put_back(conn);
            return Ok(Attempt::Busy { holder_ttl: None });
        };
        self.inner.held.locked().insert(
            req.token.as_str().to_owned(),
            Held {
                key: req.name.to_owned(),
                id,
                conn,
            },
        );
        Ok(Attempt::Acquired {
            fence: u64::try_from(fence).ok(),
        })
    }

    async fn renew(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        let key = lease.name;
        let Some((held_key, id, conn)) = self.held(lease.token) else {
            return Ok(LeaseCheck::Missing);
        };
        if conn.is_closed() && seeded::on(SeededBug::PgSessionHeld) {
            return Ok(LeaseCheck::Ours);
        }
        if held_key != key || conn.is_closed() {
            return Ok(LeaseCheck::Missing);
        }
        match conn
            .client
            .query_one(&conn.check, &[&id, &ttl_ms(ttl).to_string()])
            .await
        {
            Ok(row) if row.get::<_, bool>(0) => Ok(LeaseCheck::Ours),
            Ok(_) => Ok(LeaseCheck::Missing),
            // The session is gone, and its lock with it.
            Err(_) if conn.is_closed() => Ok(LeaseCheck::Missing),
            Err(e) => Err(map_err(e, "renewing a PostgreSQL advisory lock")),
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
        if held.conn.is_closed() {
            return Ok(LeaseCheck::Missing);
        }
        match held
            .conn
            .client
            .query_one(&held.conn.release, &[&held.id])
            .await
        {
            Ok(row) => {
                let was_ours: bool = row.get(0);
                self.put_back(held.conn);
                Ok(if was_ours {
                    LeaseCheck::Ours
                } else {
                    LeaseCheck::Missing
                })
            }
            // Closed under us: the session's end released the lock.
            Err(_) if held.conn.is_closed() => Ok(LeaseCheck::Missing),
            // Dropping the session (here) releases whatever it held.
            Err(e) => Err(map_err(e, "releasing a PostgreSQL advisory lock")),
        }
    }

    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        const DOING: &str = "reading a PostgreSQL lock's status";
        let id = lock_id(key);
        let conn = self.take().await?;
        let rows = conn
            .client
            .query(&conn.status, &[&id])
            .await
            .map_err(|e| map_err(e, DOING))?;
        self.put_back(conn);
        let Some(row) = rows.first() else {
            return Ok(LockStatus::free());
        };
        let app: Option<String> = row.get(0);
        let idle: Option<i64> = row.get(1);
        let last: Option<i64> = row.get(2);
        let last_fence = last.and_then(|l| u64::try_from(l).ok());
        // "<tag> <fence> <ttl ms> <owner>", as the acquire wrote it (another role's session may
        // show nothing; a session that changed its application_name shows that).
        let Some((fence, ttl, owner)) = app.as_deref().and_then(parse_label) else {
            return Ok(LockStatus::held(app, None, None).with_last_fence(last_fence));
        };
        let remaining = Duration::from_millis(
            u64::try_from(ttl.saturating_sub(idle.unwrap_or(0))).unwrap_or(0),
        );
        Ok(LockStatus::held(Some(owner), Some(fence), Some(remaining)).with_last_fence(last_fence))
    }

    fn sessions(&self) -> Option<&dyn Sessions> {
        Some(self)
    }

    fn breaker(&self) -> Option<&dyn Breaker> {
        Some(self)
    }
}

impl Breaker for PgBackend {
    /// Ends the holding session (`pg_terminate_backend`, waiting up to 5 s for it to go),
    /// which frees the lock: the holder sees its session end at once (lost: `Stolen`). Needs
    /// the right to signal that session (the same role, `pg_signal_backend`, or superuser).
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
        let id = lock_id(key);
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
    /// The guard's session ending (the server closed it, an idle timeout, a termination).
    fn session_end(&self, lease: &LeaseRef<'_>) -> BoxFuture<'static, LostReason> {
        let ended = self
            .held(lease.token)
            .map(|(_, _, c)| c.ended.clone())
            .filter(|_| !seeded::on(SeededBug::PgSessionHeld));
        Box::pin(async move {
            let Some(mut ended) = ended else {
                return std::future::pending().await;
            };
            loop {
                if let Some(why) = *ended.borrow_and_update() {
                    return why;
                }
                if ended.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_ids_are_stable() {
        // The first 8 bytes of SHA-256("orders"): the same in every version and language.
        assert_eq!(lock_id("orders"), lock_id("orders"));
        assert_ne!(lock_id("orders"), lock_id("orders2"));
        let digest = Sha256::digest(b"orders");
        assert_eq!(lock_id("orders").to_be_bytes(), digest[..8]);
    }

    #[test]
    fn holder_labels_read_back() {
        assert_eq!(
            parse_label("distlock 42 30000 vm/123"),
            Some((42, 30_000, "vm/123".to_owned()))
        );
        assert_eq!(
            parse_label("distlock 42 30000"),
            Some((42, 30_000, String::new()))
        );
        assert_eq!(parse_label("psql"), None);
        assert_eq!(parse_label("distlock x 1 a"), None);
    }

    #[test]
    fn ttls_become_whole_milliseconds() {
        assert_eq!(ttl_ms(Duration::from_secs(30)), 30_000);
        assert_eq!(ttl_ms(Duration::from_micros(10)), 1);
    }
}
