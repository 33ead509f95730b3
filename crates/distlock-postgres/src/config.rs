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
/// | `idle_connections` | `16` | connections kept open between locks |
///
/// TLS is not built in this release: `sslmode=require` (or stronger) is refused as a
/// configuration error rather than silently connecting in clear text.
#[derive(Clone)]
pub struct PgConfig {
    pub(crate) pg: tokio_postgres::Config,
    pub(crate) schema: String,
    pub(crate) idle_connections: usize,
}

impl std::fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // tokio-postgres's own Debug hides the password.
        f.debug_struct("PgConfig")
            .field("pg", &self.pg)
            .field("schema", &self.schema)
            .field("idle_connections", &self.idle_connections)
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
        let mut idle_connections = 16;
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
                "idle_connections" => {
                    idle_connections = v.parse().map_err(|_| {
                        config_err(format!("idle_connections={v:?} is not a number"))
                    })?;
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
            idle_connections,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ours_and_libpq_params() {
        let c = PgConfig::from_url(
            "postgres://app:s3cret@db.example:5433/locks?schema=Locking&idle_connections=4&connect_timeout=2",
        )
        .unwrap();
        assert_eq!(c.schema, "locking");
        assert_eq!(c.idle_connections, 4);
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
            "postgres://h?idle_connections=many",
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
