//! The protected resource in its SQL form, on a real PostgreSQL: a row per mode, written with
//! `distlock_postgres::FencedUpdate` (`UPDATE … SET value = $3, fence = $1 WHERE id = $2 AND
//! fence <= $1`).
//!
//! - row `w`: only the write is fenced (the statement as `docs/fencing.md` first shows it);
//! - row `rw`: the read is fenced too: it raises the row's fence to the reader's token
//!   (`UPDATE … SET fence = GREATEST(fence, $1) … RETURNING value`), so a stale holder that
//!   read before a newer one cannot write after the newer one read.
//!
//! A read-modify-write that spans two statements needs the second form: the first loses
//! updates when a paused holder writes between a newer holder's read and its write.

use distlock_postgres::FencedUpdate;
use distlock_postgres::tokio_postgres::{self, Client, NoTls};
use distlock_testkit::Postgres;

/// The table and its server.
pub(crate) struct SqlResource {
    client: Client,
    update: FencedUpdate,
    _server: Postgres,
}

impl std::fmt::Debug for SqlResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqlResource")
    }
}

/// One read: the values of row `w` and row `rw`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SqlRead {
    pub(crate) w: i64,
    pub(crate) rw: i64,
}

fn e(what: &str, err: impl std::fmt::Display) -> String {
    format!("SQL resource, {what}: {err}")
}

fn fence_i64(fence: Option<u64>) -> i64 {
    fence.and_then(|f| i64::try_from(f).ok()).unwrap_or(0)
}

impl SqlResource {
    /// Starts a PostgreSQL server and creates the table.
    pub(crate) async fn start() -> Result<SqlResource, String> {
        let server = Postgres::start().ok_or("postgresql is not installed")?;
        let (client, conn) = tokio_postgres::connect(&server.url(""), NoTls)
            .await
            .map_err(|x| e("connect", x))?;
        tokio::spawn(conn);
        client
            .batch_execute(
                "CREATE TABLE resource (id text PRIMARY KEY, value bigint NOT NULL, \
                 fence bigint NOT NULL DEFAULT 0);
                 INSERT INTO resource (id, value) VALUES ('w', 0), ('rw', 0);",
            )
            .await
            .map_err(|x| e("create", x))?;
        let update = FencedUpdate::new("resource", "id", "fence", "value = $3")
            .map_err(|x| e("statement", x))?;
        Ok(SqlResource {
            client,
            update,
            _server: server,
        })
    }

    /// A read by a holder with `fence`.
    pub(crate) async fn read(&self, fence: Option<u64>) -> Result<SqlRead, String> {
        let w = self
            .client
            .query_one("SELECT value FROM resource WHERE id = 'w'", &[])
            .await
            .map_err(|x| e("read w", x))?
            .get(0);
        let rw = self
            .client
            .query_one(
                "UPDATE resource SET fence = GREATEST(fence, $1) WHERE id = 'rw' RETURNING value",
                &[&fence_i64(fence)],
            )
            .await
            .map_err(|x| e("read rw", x))?
            .get(0);
        Ok(SqlRead { w, rw })
    }

    /// A write of `w` and `rw` (each the value read plus one); returns which were accepted.
    pub(crate) async fn write(
        &self,
        fence: Option<u64>,
        w: i64,
        rw: i64,
    ) -> Result<(bool, bool), String> {
        // An engine without tokens cannot use the fenced resource.
        let Some(fence) = fence else {
            return Ok((false, false));
        };
        let a = self
            .update
            .run(&self.client, &"w", fence, &[&w])
            .await
            .map_err(|x| e("write w", x))?;
        let b = self
            .update
            .run(&self.client, &"rw", fence, &[&rw])
            .await
            .map_err(|x| e("write rw", x))?;
        Ok((a, b))
    }

    /// The rows' final values.
    pub(crate) async fn values(&self) -> Result<SqlRead, String> {
        let v = self.read(None).await?;
        Ok(v)
    }
}
