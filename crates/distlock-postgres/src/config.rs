//! `postgres://` URLs.

use std::str::FromStr;
use std::time::Duration;

use distlock_core::{ErrorKind, LockError};

/// How to reach PostgreSQL, and where the engine keeps its two objects.
///
/// From a URL: `postgres://[user[:password]@]host[:port][/database][?params]` (also
/// `postgresql://`), with libpq's parameters that tokio-postgres knows (`connect_timeout`,
/// `application_name`, `sslmode=disable`, …) plus these, removed before the rest is parsed:
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | `schema` | `public` | where the fence sequence is created |
/// | `sessions` | `8` | the most server sessions that hold locks, many on each |
/// | `pool_wait` | `5s` | how long an acquire waits for room when every session is in use for it |
/// | `response_timeout` | `5s` | per statement on a session that holds locks |
///
/// TLS is not built in this release: `sslmode=require` (or stronger) is refused as a
/// configuration error rather than silently connecting in clear text.
#[derive(Clone)]
pub struct PgConfig {
    pub(crate) pg: tokio_postgres::Config,
    pub(crate) schema: String,
    pub(crate) sessions: usize,
    pub(crate) pool_wait: Duration,
    pub(crate) response_timeout: Duration,
}

impl std::fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // tokio-postgres's own Debug hides the password.
        f.debug_struct("PgConfig")
            .field("pg", &self.pg)
            .field("schema", &self.schema)
            .field("sessions", &self.sessions)
            .field("pool_wait", &self.pool_wait)
            .field("response_timeout", &self.response_timeout)
            .finish()
    }
}

fn config_err(msg: impl Into<String>) -> LockError {
    LockError::new(ErrorKind::Config, msg.into())
}

impl PgConfig {
    /// Parses a `postgres://` URL.
    ///
    /// # Errors
    /// `Config` for another scheme, a malformed URL, an unknown parameter, a bad schema name
    /// or a TLS mode that this build cannot honour.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| config_err(format!("not a postgres:// URL: {url:?}")))?;
        let (base, query) = match rest.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (rest, None),
        };
        let mut schema = "public".to_owned();
        let mut sessions = 8;
        let mut pool_wait = Duration::from_secs(5);
        let mut response_timeout = Duration::from_secs(5);
        let mut kept = Vec::new();
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if pair.is_empty() {
                continue;
            }
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "schema" => {
                    let ok = !v.is_empty()
                        && v.len() <= 63
                        && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        && !v.starts_with(|c: char| c.is_ascii_digit());
                    if !ok {
                        return Err(config_err(format!(
                            "schema={v:?}: a plain identifier (letters, digits, _) is needed"
                        )));
                    }
                    schema = v.to_ascii_lowercase();
                }
                "sessions" => {
                    sessions = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        config_err(format!("sessions={v:?}: a number of sessions, at least 1"))
                    })?;
                }
                "idle_connections" => {
                    return Err(config_err(
                        "idle_connections= is gone: locks share sessions now; sessions= sets \
                         how many (default 8)",
                    ));
                }
                "pool_wait" | "response_timeout" => {
                    let d = distlock_core::parse_duration(v)
                        .ok()
                        .filter(|d| !d.is_zero() || k == "pool_wait")
                        .ok_or_else(|| {
                            config_err(format!("{k}={v:?}: a duration such as 2s or 500ms"))
                        })?;
                    if k == "pool_wait" {
                        pool_wait = d;
                    } else {
                        response_timeout = d;
                    }
                }
                "sslmode" if !matches!(v, "disable" | "prefer" | "allow") => {
                    return Err(LockError::new(
                        ErrorKind::Unsupported,
                        format!("sslmode={v}: TLS to PostgreSQL is not built in this release"),
                    ));
                }
                _ => kept.push(pair),
            }
        }
        let mut text = format!("postgres://{base}");
        if !kept.is_empty() {
            text.push('?');
            text.push_str(&kept.join("&"));
        }
        let mut pg = tokio_postgres::Config::from_str(&text).map_err(|e| {
            config_err(format!(
                "bad postgres URL {:?}: {e}",
                distlock_core::url::redact(url)
            ))
        })?;
        if pg.get_hosts().is_empty() {
            return Err(config_err(format!(
                "no host in {:?}",
                distlock_core::url::redact(url)
            )));
        }
        if pg.get_user().is_none() {
            pg.user("postgres");
        }
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(Duration::from_secs(3));
        }
        if pg.get_application_name().is_none() {
            pg.application_name("distlock");
        }
        // Never TLS here, whatever `prefer` would try.
        pg.ssl_mode(tokio_postgres::config::SslMode::Disable);
        Ok(PgConfig {
            pg,
            schema,
            sessions,
            pool_wait,
            response_timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ours_and_libpq_params() {
        let c = PgConfig::from_url(
            "postgres://app:s3cret@db.example:5433/locks?schema=Locking&sessions=4&pool_wait=0s&connect_timeout=2",
        )
        .unwrap();
        assert_eq!(c.schema, "locking");
        assert_eq!(c.sessions, 4);
        assert_eq!(c.pool_wait, Duration::ZERO);
        assert_eq!(c.response_timeout, Duration::from_secs(5));
        assert_eq!(c.pg.get_user(), Some("app"));
        assert_eq!(c.pg.get_dbname(), Some("locks"));
        assert_eq!(c.pg.get_ports(), &[5433]);
        assert_eq!(c.pg.get_connect_timeout(), Some(&Duration::from_secs(2)));
        let d = PgConfig::from_url("postgresql://localhost").unwrap();
        assert_eq!(d.schema, "public");
        assert_eq!(d.pg.get_user(), Some("postgres"));
    }

    #[test]
    fn refuses_bad_urls() {
        for bad in [
            "redis://h",
            "postgres://h?schema=drop%20table",
            "postgres://h?schema=1x",
            "postgres://h?sessions=many",
            "postgres://h?sessions=0",
            "postgres://h?idle_connections=4",
            "postgres://h?response_timeout=0s",
            "postgres://h?nonsense=1",
            "postgres://h:notaport",
        ] {
            let e = PgConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
        }
        let e = PgConfig::from_url("postgres://h?sslmode=require").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
    }

    #[test]
    fn messages_hide_the_password() {
        let e = PgConfig::from_url("postgres://u:topsecret@h:x/db").unwrap_err();
        assert!(!e.to_string().contains("topsecret"), "{e}");
    }
}
