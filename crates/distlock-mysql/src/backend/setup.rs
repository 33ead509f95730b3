//! Preparing a server: what it is, and the engine's tables and sequence where they are missing.

use distlock_core::engine::{ErrorKind, LockError};
use mysql_async::Row;

use super::{MySession, Server, dedicated, int, names, permits};
use crate::config::{FenceSource, MysqlConfig};

/// Whether `version` (`SELECT VERSION()`) is MariaDB 10.3 or later, which has sequences.
fn has_sequences(version: &str) -> bool {
    if !version.contains("MariaDB") {
        return false;
    }
    // The handshake's form for old clients, in case a proxy passes it on.
    let version = version.strip_prefix("5.5.5-").unwrap_or(version);
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= (10, 3)
}

/// Whether `version` (`SELECT VERSION()`) has recursive CTEs: MariaDB 10.2.2 and later, MySQL
/// 8.0 and later.
fn has_ctes(version: &str) -> bool {
    let mariadb = version.contains("MariaDB");
    let version = version.strip_prefix("5.5.5-").unwrap_or(version);
    let parts: Vec<u32> = version
        .split(|c: char| !c.is_ascii_digit())
        .take(3)
        .map(|p| p.parse().unwrap_or(0))
        .collect();
    let v = (
        parts.first().copied().unwrap_or(0),
        parts.get(1).copied().unwrap_or(0),
    );
    let patch = parts.get(2).copied().unwrap_or(0);
    if mariadb {
        v > (10, 2) || (v == (10, 2) && patch >= 2)
    } else {
        v >= (8, 0)
    }
}

/// Checks the server and creates the engine's objects where they are missing: the fence
/// source (MariaDB's sequence `distlock_fence` and the session table `distlock_sessions`, or
/// the counter table `distlock_locks`), and the semaphores' table `distlock_semaphores`.
/// Returns the fence source and what the server is.
pub(super) async fn setup(config: &MysqlConfig) -> Result<(FenceSource, Server), LockError> {
    const DOING: &str = "preparing MySQL for locks";
    let conn = dedicated(config).await?;
    let version: String = conn
        .run("SELECT VERSION()", DOING)
        .await?
        .and_then(|r| r.get::<Option<String>, _>(0).flatten())
        .unwrap_or_default();
    let fences = match (config.fence, has_sequences(&version)) {
        (Some(FenceSource::Sequence), false) => {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                format!("fence=sequence: {version} has no sequences (MariaDB 10.3 or later)"),
            ));
        }
        (Some(f), _) => f,
        (None, true) => FenceSource::Sequence,
        (None, false) => FenceSource::Counter,
    };
    let server = Server {
        mariadb: version.contains("MariaDB"),
        ctes: has_ctes(&version),
    };
    conn.run(permits::TABLE, "creating the table distlock_semaphores")
        .await?;
    conn.run(names::TABLE, "creating the table distlock_names")
        .await?;
    let fences = setup_fences(&conn, fences).await?;
    Ok((fences, server))
}

/// Creates the fence source's objects where they are missing.
async fn setup_fences(conn: &MySession, fences: FenceSource) -> Result<FenceSource, LockError> {
    const DOING: &str = "preparing MySQL for locks";
    if fences == FenceSource::Counter {
        conn.run(
            "CREATE TABLE IF NOT EXISTS distlock_locks (\
               name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY, \
               fence BIGINT UNSIGNED NOT NULL, holder VARCHAR(2048) NOT NULL, \
               ttl_ms BIGINT NOT NULL) ENGINE=InnoDB",
            "creating the table distlock_locks",
        )
        .await?;
        return Ok(fences);
    }
    conn.run(
        "CREATE TABLE IF NOT EXISTS distlock_sessions (\
           id BIGINT UNSIGNED PRIMARY KEY, holder VARCHAR(2048) NOT NULL, \
           ttl_ms BIGINT NOT NULL) ENGINE=InnoDB",
        "creating the table distlock_sessions",
    )
    .await?;
    conn.run(
        super::recorded::TABLE,
        "creating the table distlock_holders",
    )
    .await?;
    let exists = |table: &str| {
        format!(
            "SELECT COUNT(*) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}'"
        )
    };
    let have = |row: Option<Row>| row.and_then(|r| int(&r, 0)).unwrap_or(0) > 0;
    if !have(conn.run(&exists("distlock_fence"), DOING).await?) {
        // Above every fence the counter table handed out (an earlier release, or clients
        // with fence=counter): a lock's fences never go back when its clients move over.
        let start = if have(conn.run(&exists("distlock_locks"), DOING).await?) {
            conn.run(
                "SELECT COALESCE(MAX(fence), 0) + 1 FROM distlock_locks",
                DOING,
            )
            .await?
            .and_then(|r| int(&r, 0))
            .unwrap_or(1)
        } else {
            1
        };
        conn.run(
            &format!(
                "CREATE SEQUENCE IF NOT EXISTS distlock_fence START WITH {start} ENGINE=InnoDB"
            ),
            "creating the sequence distlock_fence",
        )
        .await?;
    }
    Ok(fences)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_come_with_mariadb_10_3() {
        assert!(has_sequences("10.11.6-MariaDB-0+deb12u1"));
        assert!(has_sequences("10.3.39-MariaDB"));
        assert!(has_sequences("11.4.2-MariaDB-log"));
        assert!(!has_sequences("10.2.44-MariaDB"));
        assert!(!has_sequences("8.0.36"));
        assert!(has_sequences("5.5.5-10.11.6-MariaDB"));
    }

    #[test]
    fn recursive_ctes_come_with_mysql_8_and_mariadb_10_2_2() {
        assert!(has_ctes("10.11.6-MariaDB-0+deb12u1"));
        assert!(has_ctes("10.2.2-MariaDB"));
        assert!(!has_ctes("10.2.1-MariaDB"));
        assert!(!has_ctes("10.1.48-MariaDB"));
        assert!(has_ctes("8.0.36"));
        assert!(has_ctes("8.4.0-commercial"));
        assert!(!has_ctes("5.7.44-log"));
        assert!(has_ctes("5.5.5-10.6.12-MariaDB"));
    }
}
