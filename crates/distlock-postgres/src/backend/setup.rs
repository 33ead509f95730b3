//! Preparing a server: its version checked, and the engine's sequence and tables created where
//! they are missing.

use distlock_core::engine::{ErrorKind, LockError};
use tokio_postgres::error::SqlState;

use super::{Conn, PgBackend, names, order, recorded};
use crate::error::map_err;

impl PgBackend {
    /// The first session: checks the version and creates the fence sequence and the waiters'
    /// table (see `order`) where they are missing.
    pub(super) async fn setup(&self) -> Result<Conn, LockError> {
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
}
