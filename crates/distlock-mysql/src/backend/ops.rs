//! The SQL half of the pool (`SessionOps`): a connection opened (over TLS as `ssl-mode` asks)
//! and closed, a named lock released, the keep-alive; and a connection of its own.

use std::sync::Arc;
use std::time::Duration;

use distlock_core::engine::{ErrorKind, LockError};
use distlock_core::recipes::pool::{SHARED_PREFIX, SessionEnd, SessionOps};
use mysql_async::{Conn, Opts, Value};

use super::error::map_err;
use super::{MySession, Sql, int, on_session};
use crate::config::{FenceSource, MysqlConfig, SslMode, config_err};

/// The SQL half of the pool.
pub(crate) struct MyOps {
    pub(super) config: MysqlConfig,
    pub(super) fences: FenceSource,
    pub(super) server: Server,
}

/// What the server is, as far as the engine's statements care.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Server {
    /// MariaDB (its own names for some session variables).
    pub(super) mariadb: bool,
    /// Recursive common table expressions (MySQL 8.0, MariaDB 10.2.2): the semaphore's
    /// statements need them.
    pub(super) ctes: bool,
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

#[distlock_core::engine::async_trait]
impl SessionOps for MyOps {
    type Conn = Arc<MySession>;

    async fn open(&self, end: SessionEnd) -> Result<Arc<MySession>, LockError> {
        let conn = self.connect().await?;
        Ok(Arc::new(MySession::new(
            conn,
            end,
            self.config.response_timeout,
        )))
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

    async fn unlock(&self, session: &Arc<MySession>, key: &str) -> Result<bool, LockError> {
        if let Some(base) = key.strip_prefix(SHARED_PREFIX) {
            // (GET_LOCK has no shared mode: the engine's only shared keys are permits.)
            return self.unlock_permit(session, base).await;
        }
        let sql = || Sql::Prepared("SELECT RELEASE_LOCK(?)", vec![Value::from(key)]);
        let row = on_session(session, sql, "releasing a MySQL named lock").await?;
        Ok(row.and_then(|r| int(&r, 0)) == Some(1))
    }

    async fn ping(
        &self,
        session: &Arc<MySession>,
        keep: &(dyn Fn() -> Duration + Send + Sync),
    ) -> Result<(), LockError> {
        let build = || Sql::Text(session.keep_sql(keep(), true).unwrap_or_default());
        on_session(session, build, "renewing MySQL named locks")
            .await
            .map(drop)
    }
}

/// A connection of its own (the first checks, breaking a lock), closed when dropped.
pub(super) async fn dedicated(config: &MysqlConfig) -> Result<MySession, LockError> {
    Ok(MySession::new(
        connect(config).await?,
        SessionEnd::default(),
        config.response_timeout,
    ))
}
