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
/// TLS takes libpq's parameters, with libpq's meanings (and its environment variables
/// `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY` when the URL does not say):
///
/// | `sslmode` | TLS | the server's certificate |
/// |---|---|---|
/// | `disable` | never | — |
/// | `allow`, `prefer` (default) | if the server has it | not checked, unless a CA is given |
/// | `require` | always | not checked, unless a CA is given (then as `verify-ca`) |
/// | `verify-ca` | always | chains to the CA |
/// | `verify-full` | always | chains to the CA and names the host |
///
/// `sslrootcert` is the CA file (default `~/.postgresql/root.crt` if it exists), or `system`
/// for the system's roots (with `verify-full` only, as libpq 16 demands); `sslcert` and
/// `sslkey` are the client certificate and key (default `~/.postgresql/postgresql.crt` and
/// `.key` if both exist). `allow` behaves as `prefer` (TLS first). Without the `tls` feature,
/// modes that need TLS are refused rather than connecting in clear text.
#[derive(Clone)]
pub struct PgConfig {
    pub(crate) pg: tokio_postgres::Config,
    pub(crate) schema: String,
    pub(crate) sessions: usize,
    pub(crate) pool_wait: Duration,
    pub(crate) response_timeout: Duration,
    /// How TLS is made (`None`: never).
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<distlock_tls::TlsSettings>,
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
            .finish_non_exhaustive()
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
            .ok_or_else(|| {
                config_err(format!(
                    "not a postgres:// URL: {:?}",
                    distlock_core::url::redact(url)
                ))
            })?;
        let (base, query) = match rest.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (rest, None),
        };
        let mut schema = "public".to_owned();
        let mut sessions = 8;
        let mut pool_wait = Duration::from_secs(5);
        let mut response_timeout = Duration::from_secs(5);
        let mut kept = Vec::new();
        let mut ssl = SslParams::default();
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
                    let d = distlock_core::url::duration_param(k, v, k == "pool_wait")?;
                    if k == "pool_wait" {
                        pool_wait = d;
                    } else {
                        response_timeout = d;
                    }
                }
                "sslmode" | "sslrootcert" | "sslcert" | "sslkey" => {
                    ssl.set(k, distlock_core::url::decode(v));
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
        let (mode, tls) = ssl.resolve()?;
        pg.ssl_mode(mode);
        #[cfg(not(feature = "tls"))]
        let () = tls;
        Ok(PgConfig {
            pg,
            schema,
            sessions,
            pool_wait,
            response_timeout,
            #[cfg(feature = "tls")]
            tls,
        })
    }
}

/// libpq's TLS parameters as given (URL first, then the environment).
#[derive(Default)]
struct SslParams {
    mode: Option<String>,
    root: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

/// What the TLS settings are without the `tls` feature: there are none.
#[cfg(not(feature = "tls"))]
type Tls = ();
#[cfg(feature = "tls")]
type Tls = Option<distlock_tls::TlsSettings>;

impl SslParams {
    fn set(&mut self, k: &str, v: String) {
        let slot = match k {
            "sslmode" => &mut self.mode,
            "sslrootcert" => &mut self.root,
            "sslcert" => &mut self.cert,
            _ => &mut self.key,
        };
        *slot = Some(v);
    }

    /// tokio-postgres's mode and our TLS settings.
    fn resolve(self) -> Result<(tokio_postgres::config::SslMode, Tls), LockError> {
        use tokio_postgres::config::SslMode;
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mode = self
            .mode
            .or_else(|| env("PGSSLMODE"))
            .unwrap_or_else(|| "prefer".to_owned());
        let pg_mode = match mode.as_str() {
            "disable" => return Ok((SslMode::Disable, Tls::default())),
            "allow" | "prefer" => SslMode::Prefer,
            "require" | "verify-ca" | "verify-full" => SslMode::Require,
            other => {
                return Err(config_err(format!(
                    "sslmode={other:?}: one of disable, allow, prefer, require, verify-ca, \
                     verify-full"
                )));
            }
        };
        #[cfg(not(feature = "tls"))]
        {
            if pg_mode == SslMode::Require {
                return Err(distlock_core::url::no_tls_build(&format!("sslmode={mode}")));
            }
            let _ = (self.root, self.cert, self.key);
            Ok((SslMode::Disable, ()))
        }
        #[cfg(feature = "tls")]
        {
            use distlock_tls::{TlsSettings, Verify};
            use std::path::PathBuf;
            let home = env("HOME").map(|h| PathBuf::from(h).join(".postgresql"));
            let root = self.root.or_else(|| env("PGSSLROOTCERT"));
            let mut settings = TlsSettings::default();
            let system = root.as_deref() == Some("system");
            settings.ca = match root {
                Some(r) if r == "system" => None,
                Some(r) => Some(PathBuf::from(r)),
                None => home
                    .as_ref()
                    .map(|h| h.join("root.crt"))
                    .filter(|p| p.is_file()),
            };
            let have_ca = system || settings.ca.is_some();
            settings.verify = match mode.as_str() {
                "verify-full" => Verify::Full,
                "verify-ca" => Verify::Chain,
                // libpq: with a CA at hand, `require` (and `prefer`) check the chain.
                _ if have_ca => Verify::Chain,
                _ => Verify::EncryptOnly,
            };
            if system && mode != "verify-full" {
                return Err(config_err(format!(
                    "sslrootcert=system needs sslmode=verify-full (not {mode}), as in libpq"
                )));
            }
            if mode.starts_with("verify") && !have_ca {
                return Err(config_err(format!(
                    "sslmode={mode} needs a CA to check the server against: sslrootcert=<file> \
                     (or system), PGSSLROOTCERT, or ~/.postgresql/root.crt"
                )));
            }
            let cert = self.cert.or_else(|| env("PGSSLCERT"));
            let key = self.key.or_else(|| env("PGSSLKEY"));
            match (cert, key) {
                (Some(c), Some(k)) => {
                    settings.cert = Some(c.into());
                    settings.key = Some(k.into());
                }
                (None, None) => {
                    if let Some(h) = &home {
                        let (c, k) = (h.join("postgresql.crt"), h.join("postgresql.key"));
                        if c.is_file() && k.is_file() {
                            settings.cert = Some(c);
                            settings.key = Some(k);
                        }
                    }
                }
                _ => {
                    return Err(config_err(
                        "a client certificate needs both sslcert and sslkey",
                    ));
                }
            }
            Ok((pg_mode, Some(settings)))
        }
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
        for bad in [
            "postgres://h?sslmode=sometimes",
            "postgres://h?sslmode=verify-ca&sslrootcert=system",
            "postgres://h?sslmode=require&sslcert=/c.pem",
        ] {
            let e = PgConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
        }
    }

    #[test]
    fn messages_hide_the_password() {
        let e = PgConfig::from_url("postgres://u:topsecret@h:x/db").unwrap_err();
        assert!(!e.to_string().contains("topsecret"), "{e}");
    }
}
