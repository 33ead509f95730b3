//! A session of the pool: opening its connection (whose task hears notifications and tells
//! the pool when it ends), the statements prepared on it, and the pool's session operations
//! (open, close, unlock, keep-alive) in SQL.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use distlock_core::engine::{ErrorKind, LeaseKind, LockError, LostReason};
use distlock_core::recipes::pool::{SessionEnd, SessionOps};
use tokio_postgres::{AsyncMessage, Client, NoTls, Statement};

use super::lease::why_ended;
use super::*;
use crate::error::map_err;

/// Opens a session, whose connection runs in its own task; `end` hears when it ends.
#[cfg(feature = "tls")]
pub(super) type Tls<'a> = Option<&'a crate::tls::MakeRustls>;
#[cfg(not(feature = "tls"))]
pub(super) type Tls<'a> = Option<&'a ()>;

/// What hears a session's notifications: each one's channel.
pub(super) type Heard = Box<dyn Fn(&str) + Send + Sync>;

pub(super) async fn connect(
    config: &PgConfig,
    tls: Tls<'_>,
    end: impl FnOnce(LostReason) + Send + 'static,
    heard: Option<Heard>,
) -> Result<(Client, tokio::task::AbortHandle), LockError> {
    let limit = config.response_timeout.max(Duration::from_secs(1)) * 2;
    let no_answer = |_| {
        LockError::new(
            ErrorKind::Timeout,
            "connecting to PostgreSQL: no answer".to_owned(),
        )
    };
    let doing = "connecting to PostgreSQL";
    #[cfg(feature = "tls")]
    if let Some(tls) = tls {
        let (client, connection) = tokio::time::timeout(limit, config.pg.connect(tls.clone()))
            .await
            .map_err(no_answer)?
            .map_err(|e| map_err(e, doing))?;
        return Ok((client, watch(connection, end, heard)));
    }
    #[cfg(not(feature = "tls"))]
    let _ = tls;
    let (client, connection) = tokio::time::timeout(limit, config.pg.connect(NoTls))
        .await
        .map_err(no_answer)?
        .map_err(|e| map_err(e, doing))?;
    Ok((client, watch(connection, end, heard)))
}

/// Runs a session's connection in its own task, passes its notifications to `heard`, and
/// tells `end` why it ended.
pub(super) fn watch<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    end: impl FnOnce(LostReason) + Send + 'static,
    heard: Option<Heard>,
) -> tokio::task::AbortHandle
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let task = tokio::spawn(async move {
        let why = loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if let Some(heard) = &heard {
                        heard(n.channel());
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => break why_ended(&e),
                None => break LostReason::Unreachable,
            }
        };
        end(why);
    });
    task.abort_handle()
}

/// A session of the pool, with its statements prepared.
pub(crate) struct PgConn {
    pub(super) client: Client,
    /// A writer's, behind the waiters' tickets, setting the session's timeout and label.
    pub(super) acquire: Statement,
    /// A reader's: a shared hold, whose fence is the sequence as the last writer left it.
    pub(super) acquire_shared: Statement,
    /// A writer's when nobody waits and the settings stay (see `settings`).
    pub(super) acquire_fast: Statement,
    /// A reader's when nobody waits and the settings stay.
    pub(super) acquire_shared_fast: Statement,
    pub(super) unlock: Statement,
    pub(super) unlock_shared: Statement,
    pub(super) ping: Statement,
    pub(super) status: Statement,
    pub(super) task: tokio::task::AbortHandle,
    /// Held while a statement that sets the idle timeout computes it and is sent.
    pub(super) order: tokio::sync::Mutex<()>,
    /// The timeout and label the session's statements left (see `settings`).
    pub(super) settings: settings::Settings,
    /// The semaphore statements, prepared on this session's first permit.
    pub(super) permit_sql: tokio::sync::OnceCell<PermitSql>,
    /// The permits held on this session, by their semaphore's base id (the pool keeps one per
    /// semaphore on a session: see `permit_key`).
    pub(super) permits: Mutex<HashMap<i64, PermitHold>>,
}

/// What parameters a statement that takes a lease gets around the timeout.
pub(super) enum Taking<'a> {
    /// `$1` the lock id, `$2` the timeout, `$3` the owner, `$4` the waiter's ticket.
    Lock(i64, &'a str, Option<i64>),
    /// `$1` the semaphore's base id, `$2` its permits, `$3` the timeout, `$4` the owner, `$5`
    /// the waiter's ticket.
    Permit(i64, i32, &'a str, Option<i64>),
}

/// The SQL half of the pool.
pub(crate) struct PgOps {
    pub(super) config: PgConfig,
    /// The TLS connector (its files read once), when TLS may be used.
    #[cfg(feature = "tls")]
    pub(super) tls: Option<crate::tls::MakeRustls>,
}

impl PgOps {
    /// Runs a statement on a shared session within the response timeout.
    pub(super) async fn query_one(
        &self,
        conn: &PgConn,
        statement: &Statement,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        doing: &str,
    ) -> Result<tokio_postgres::Row, LockError> {
        let limit = self.config.response_timeout;
        tokio::time::timeout(limit, conn.client.query_one(statement, params))
            .await
            .map_err(|_| {
                LockError::new(
                    ErrorKind::Timeout,
                    format!("{doing}: no answer within {limit:?}"),
                )
            })?
            .map_err(|e| map_err(e, doing))
    }

    /// Runs a statement that sets the session's idle timeout: `$1` is the timeout (`keep()`,
    /// in ms), or with `lock`, the parameters of [`Taking`] around it (a lease taken sets the
    /// label too). `keep` is called and the statement sent under the session's order lock, so
    /// statements run in the order their timeouts were computed (see `SessionPool::keep_for`);
    /// the session's [`settings::Settings`] learn what it left in effect.
    pub(super) async fn query_keeping(
        &self,
        conn: &PgConn,
        statement: &Statement,
        keep: &(dyn Fn() -> Duration + Send + Sync),
        lock: Option<Taking<'_>>,
        doing: &str,
    ) -> Result<Option<tokio_postgres::Row>, LockError> {
        // The timeout is computed, and the statement sent, under the order lock.
        let order = conn.order.lock().await;
        let keep_ms = ttl_ms(keep());
        let keep_text = keep_ms.to_string();
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = match &lock {
            Some(Taking::Lock(id, owner, seq)) => vec![id, &keep_text, owner, seq],
            Some(Taking::Permit(base, n, owner, seq)) => vec![base, n, &keep_text, owner, seq],
            None => vec![&keep_text],
        };
        let sending = conn.settings.sending();
        // An acquire's row (and its fence) arrives before its transaction commits, but
        // `query_opt` answers only at the `ReadyForQuery` sent after that commit, which (with
        // synchronous_commit on, see open_session) flushed the sequence's WAL: a fence is
        // reported only once a crash can no longer give it again (tests/postgres.rs
        // a_statement_answers_only_after_its_commit).
        let row = conn.client.query_opt(statement, &params);
        let answer = self.sent_in_order(order, row, doing).await;
        let owner = match &lock {
            Some(Taking::Lock(_, owner, _) | Taking::Permit(_, _, owner, _)) => Some(*owner),
            None => None,
        };
        match (&answer, owner) {
            (Err(_), _) => sending.unknown(),
            (Ok(_), None) => sending.timeout_set(keep_ms),
            // A lock's row says whether it was taken (its fence), a permit's comes only then:
            // the settings are set with the lease, and only then.
            (Ok(Some(row)), Some(owner)) if row.get::<_, Option<i64>>(0).is_some() => {
                sending.both_set(keep_ms, owner);
            }
            (Ok(_), Some(_)) => sending.unchanged(),
        }
        answer
    }

    /// Sends `query` (its first poll queues it on the connection) while `order` is held, then
    /// awaits its answer within the response timeout.
    pub(super) async fn sent_in_order<T>(
        &self,
        order: tokio::sync::MutexGuard<'_, ()>,
        query: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
        doing: &str,
    ) -> Result<T, LockError> {
        use std::future::Future;
        use std::task::Poll;
        let limit = self.config.response_timeout;
        let mut query = std::pin::pin!(tokio::time::timeout(limit, query));
        let first = std::future::poll_fn(|cx| Poll::Ready(query.as_mut().poll(cx))).await;
        drop(order);
        let answer = match first {
            Poll::Ready(answer) => answer,
            Poll::Pending => query.await,
        };
        answer
            .map_err(|_| {
                LockError::new(
                    ErrorKind::Timeout,
                    format!("{doing}: no answer within {limit:?}"),
                )
            })?
            .map_err(|e| map_err(e, doing))
    }

    pub(super) async fn open_session(&self, end: SessionEnd) -> Result<PgConn, LockError> {
        const DOING: &str = "preparing the lock statements";
        let ended = end.clone();
        #[cfg(feature = "tls")]
        let tls = self.tls.as_ref();
        #[cfg(not(feature = "tls"))]
        let tls = None::<&()>;
        let (client, task) = connect(&self.config, tls, move |why| ended.end(why), None).await?;
        let s = &self.config.schema;
        // Granted: the fence, the session's timeout (which covers every lock on it) and a
        // label in application_name, which other sessions read in pg_stat_activity (no write).
        // The lock is tried only when no waiter's ticket that it must let go first is live
        // (see `order`): `$4` is the attempt's own ticket, if it has one.
        let acquire_sql = |lock: &str, fence: &str, kind: LeaseKind| {
            let ahead = order::ahead_sql(s, kind, "$4");
            format!(
                "SELECT g.fence, CASE WHEN g.fence IS NOT NULL \
                        THEN set_config('idle_session_timeout', $2::text, false) \
                          || set_config('application_name', \
                               left('{APP_TAG} - ' || $2::text || ' ' || $3::text, 63), false) \
                        END \
                 FROM (SELECT CASE WHEN {ahead} THEN NULL \
                                   WHEN {lock}($1::bigint) THEN {fence} END AS fence) g"
            )
        };
        let next_fence = format!("nextval('{s}.distlock_fence')");
        let acquire = acquire_sql("pg_try_advisory_lock", &next_fence, LeaseKind::Exclusive);
        let acquire_fast = settings::fast_sql("pg_try_advisory_lock", &next_fence);
        // A reader's fence: the last value the sequence gave (0 before any), read once the
        // shared hold is ours: every writer before it had a lower or equal value, every writer
        // after it gets a higher one.
        let last_fence = format!(
            "(SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {s}.distlock_fence)"
        );
        let acquire_shared = acquire_sql(
            "pg_try_advisory_lock_shared",
            &last_fence,
            LeaseKind::Shared,
        );
        let acquire_shared_fast = settings::fast_sql("pg_try_advisory_lock_shared", &last_fence);
        // A release tells the lock's waiters, where it may have any (see `listen`): `$2`, `$3`
        // its marker, `$4` its channel.
        let unlock = format!(
            "SELECT pg_advisory_unlock($1::bigint), {}",
            listen::notify_sql(None, "$2", "$3", "$4")
        );
        let unlock_shared = format!(
            "SELECT pg_advisory_unlock_shared($1::bigint), {}",
            listen::notify_sql(None, "$2", "$3", "$4")
        );
        let ping = "SELECT set_config('idle_session_timeout', $1::text, false)";
        let status = format!(
            "SELECT a.application_name, \
                    CASE WHEN a.state = 'idle' \
                         THEN (extract(epoch FROM now() - a.state_change) * 1000)::bigint END, \
                    (SELECT last_value FROM {s}.distlock_fence), \
                    l.mode = 'ShareLock', h.fence, h.holder \
             FROM pg_locks l \
             LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
             {} \
             WHERE {IN_PG_LOCKS}",
            recorded::status_join(s)
        );
        let prepared = async {
            // A fence is durable when its acquire commits, whatever the server's default (a
            // crash under synchronous_commit=off gave fences again, from 1, in the tests).
            client.batch_execute("SET synchronous_commit = on").await?;
            // In one round trip.
            tokio::try_join!(
                client.prepare(&acquire),
                client.prepare(&acquire_shared),
                client.prepare(&acquire_fast),
                client.prepare(&acquire_shared_fast),
                client.prepare(&unlock),
                client.prepare(&unlock_shared),
                client.prepare(ping),
                client.prepare(&status),
            )
        };
        match prepared.await {
            Ok((
                acquire,
                acquire_shared,
                acquire_fast,
                acquire_shared_fast,
                unlock,
                unlock_shared,
                ping,
                status,
            )) => Ok(PgConn {
                client,
                acquire,
                acquire_shared,
                acquire_fast,
                acquire_shared_fast,
                unlock,
                unlock_shared,
                ping,
                status,
                task,
                order: tokio::sync::Mutex::new(()),
                settings: settings::Settings::default(),
                permit_sql: tokio::sync::OnceCell::new(),
                permits: Mutex::new(HashMap::new()),
            }),
            Err(e) => {
                task.abort();
                Err(map_err(e, DOING))
            }
        }
    }
}

#[distlock_core::engine::async_trait]
impl SessionOps for PgOps {
    type Conn = PgConn;

    async fn open(&self, end: SessionEnd) -> Result<PgConn, LockError> {
        self.open_session(end).await
    }

    fn close(&self, conn: &PgConn) {
        // Dropping the connection ends the session: the server frees its locks.
        conn.task.abort();
    }

    async fn unlock(&self, conn: &PgConn, key: &str) -> Result<bool, LockError> {
        if let Some(base) = key.strip_prefix(PERMIT_PREFIX) {
            return self.unlock_permit(conn, key, base).await;
        }
        let (statement, id) = match key.strip_prefix(SHARED_PREFIX) {
            Some(id) => (&conn.unlock_shared, id),
            None => (&conn.unlock, key),
        };
        let id: i64 = id
            .parse()
            .map_err(|_| LockError::new(ErrorKind::Protocol, format!("not a lock id: {key:?}")))?;
        let row = self
            .unlock_notifying(conn, statement, id, "releasing a PostgreSQL advisory lock")
            .await?;
        Ok(row.get(0))
    }

    async fn ping(
        &self,
        conn: &PgConn,
        keep: &(dyn Fn() -> Duration + Send + Sync),
    ) -> Result<(), LockError> {
        self.query_keeping(
            conn,
            &conn.ping,
            keep,
            None,
            "renewing PostgreSQL advisory locks",
        )
        .await
        .map(drop)
    }
}
