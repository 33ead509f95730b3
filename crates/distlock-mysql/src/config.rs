//! `mysql://` and `mariadb://` URLs.

use std::fmt;
use std::time::Duration;

use distlock_core::engine::{ErrorKind, LockError};
use mysql_async::{Opts, OptsBuilder};

/// How to reach MySQL or MariaDB.
///
/// From a URL: `mysql://[user[:password]@]host[:port]/database[?params]` (also `mariadb://`).
/// The database is required: the engine keeps its table `distlock_locks` there. Parameters:
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | `sessions` | `8` | the most server connections that hold locks, many on each |
/// | `pool_wait` | `5s` | how long an acquire waits for room when every session is in use for it |
/// | `fence` | `auto` | `sequence` (MariaDB 10.3+: a cached `SEQUENCE`, read in the acquiring statement), `counter` (a per-name counter row, written by each acquire), or `auto`: `sequence` where the server has sequences |
/// | `connect_timeout` | `3s` | per connection attempt |
/// | `response_timeout` | `2s` | per statement |
/// | `ssl-mode` | `PREFERRED` | MySQL's client modes: `DISABLED`; `PREFERRED` (TLS if the server has it, its certificate not checked); `REQUIRED` (TLS or fail, certificate not checked); `VERIFY_CA` (a chain to the CA); `VERIFY_IDENTITY` (the chain and the host name) |
/// | `ssl-ca` | built-in roots | the CA file (PEM) that the server's certificate must chain to; given without `ssl-mode`, the mode is `VERIFY_CA` |
/// | `ssl-cert`, `ssl-key` | none | our certificate and key (PEM), for accounts `REQUIRE X509` |
///
/// `ssl_mode`, `ssl_ca`, `ssl_cert` and `ssl_key` are taken too, and the files default to
/// `DISTLOCK_TLS_CA`, `DISTLOCK_TLS_CERT` and `DISTLOCK_TLS_KEY`. Without the `tls` feature,
/// modes that need TLS are refused rather than connecting in clear text.
#[derive(Clone)]
pub struct MysqlConfig {
    pub(crate) opts: Opts,
    /// The same with TLS, when the mode asks for it.
    pub(crate) tls_opts: Option<Opts>,
    pub(crate) ssl_mode: SslMode,
    pub(crate) sessions: usize,
    pub(crate) pool_wait: Duration,
    pub(crate) fence: Option<FenceSource>,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

impl fmt::Debug for MysqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlConfig")
            .field("host", &self.opts.ip_or_hostname())
            .field("port", &self.opts.tcp_port())
            .field("user", &self.opts.user())
            .field("database", &self.opts.db_name())
            .field("sessions", &self.sessions)
            .field("pool_wait", &self.pool_wait)
            .field("ssl_mode", &self.ssl_mode)
            .finish_non_exhaustive()
    }
}

pub(crate) fn config_err(msg: impl Into<String>) -> LockError {
    LockError::new(ErrorKind::Config, msg.into())
}

/// MySQL's `--ssl-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disabled,
    Preferred,
    Required,
    VerifyCa,
    VerifyIdentity,
}

impl SslMode {
    fn parse(v: &str) -> Result<Self, LockError> {
        Ok(match v.to_ascii_uppercase().replace('-', "_").as_str() {
            "DISABLED" => SslMode::Disabled,
            "PREFERRED" => SslMode::Preferred,
            "REQUIRED" => SslMode::Required,
            "VERIFY_CA" => SslMode::VerifyCa,
            "VERIFY_IDENTITY" => SslMode::VerifyIdentity,
            _ => {
                return Err(config_err(format!(
                    "ssl-mode={v:?}: DISABLED, PREFERRED, REQUIRED, VERIFY_CA or VERIFY_IDENTITY"
                )));
            }
        })
    }
}

use distlock_core::url::decode as decoded;

/// The options with TLS for `mode`, or `None` for `DISABLED`.
#[cfg(feature = "tls")]
fn with_tls(
    opts: &Opts,
    mode: SslMode,
    settings: &distlock_tls::TlsSettings,
) -> Result<Option<Opts>, LockError> {
    use mysql_async::{ClientIdentity, SslOpts};
    if mode == SslMode::Disabled {
        return Ok(None);
    }
    // mysql_async builds its rustls configuration with the process's default provider.
    distlock_tls::install_default_provider();
    // Read (and checked) here: a file that cannot be used is a configuration error now, not
    // a connection error at each session.
    let pem = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            LockError::caused_by(ErrorKind::Config, format!("reading {}", path.display()), e)
        })
    };
    let mut ssl = SslOpts::default();
    if let Some(ca) = &settings.ca {
        distlock_tls::read_certs(ca)?;
        ssl = ssl
            .with_root_certs(vec![pem(ca)?.into()])
            .with_disable_built_in_roots(true);
    }
    if let (Some(cert), Some(key)) = (&settings.cert, &settings.key) {
        distlock_tls::read_certs(cert)?;
        distlock_tls::read_key(key)?;
        ssl = ssl.with_client_identity(Some(ClientIdentity::new(
            pem(cert)?.into(),
            pem(key)?.into(),
        )));
    }
    ssl = match mode {
        SslMode::VerifyIdentity => ssl,
        SslMode::VerifyCa => ssl.with_danger_skip_domain_validation(true),
        _ => ssl.with_danger_accept_invalid_certs(true),
    };
    // Over TLS, stay on the connection that was checked: the driver would otherwise move a
    // connection to 127.0.0.1 onto the server's Unix socket, without TLS.
    Ok(Some(
        OptsBuilder::from_opts(opts.clone())
            .prefer_socket(false)
            .ssl_opts(Some(ssl))
            .into(),
    ))
}

#[cfg(not(feature = "tls"))]
fn with_tls(opts: &Opts, mode: SslMode, _: &()) -> Result<Option<Opts>, LockError> {
    let _ = opts;
    match mode {
        SslMode::Disabled | SslMode::Preferred => Ok(None),
        _ => Err(distlock_core::url::no_tls_build(&format!(
            "ssl-mode={mode:?}"
        ))),
    }
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
        let mut sessions = 8;
        let mut pool_wait = Duration::from_secs(5);
        let mut fence = None;
        let mut connect_timeout = Duration::from_secs(3);
        let mut response_timeout = Duration::from_secs(2);
        let mut ssl_mode = None;
        let mut files: Vec<(&str, String)> = Vec::new();
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if pair.is_empty() {
                continue;
            }
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "ssl-mode" | "ssl_mode" => ssl_mode = Some(SslMode::parse(&decoded(v))?),
                "ssl-ca" | "ssl_ca" => files.push(("ssl-ca", decoded(v))),
                "ssl-cert" | "ssl_cert" => files.push(("ssl-cert", decoded(v))),
                "ssl-key" | "ssl_key" => files.push(("ssl-key", decoded(v))),
                "sessions" => {
                    sessions = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        config_err(format!("sessions={v:?}: a number of sessions, at least 1"))
                    })?;
                }
                "fence" => {
                    fence = match v {
                        "auto" => None,
                        "counter" => Some(FenceSource::Counter),
                        "sequence" => Some(FenceSource::Sequence),
                        _ => {
                            return Err(config_err(format!(
                                "fence={v:?}: auto, counter or sequence"
                            )));
                        }
                    };
                }
                "idle_connections" => {
                    return Err(config_err(
                        "idle_connections= is gone: locks share sessions now; sessions= sets \
                         how many (default 8)",
                    ));
                }
                "connect_timeout" | "response_timeout" | "pool_wait" => {
                    let d = distlock_core::url::duration_param(k, v, k == "pool_wait")?;
                    match k {
                        "connect_timeout" => connect_timeout = d,
                        "response_timeout" => response_timeout = d,
                        _ => pool_wait = d,
                    }
                }
                other => {
                    return Err(config_err(format!(
                        "unknown mysql URL parameter {other:?} (known: sessions, pool_wait, \
                         fence, connect_timeout, response_timeout, ssl-mode, ssl-ca, ssl-cert, \
                         ssl-key)"
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
        // Room for the engine's two prepared statements (acquire, release) per connection.
        let opts: Opts = OptsBuilder::from_opts(opts).stmt_cache_size(4).into();
        #[cfg(feature = "tls")]
        let (ssl_mode, tls_opts) = {
            let mut settings = distlock_tls::TlsSettings::default();
            settings.take_files(
                distlock_tls::ParamNames {
                    ca: ("ssl-ca", "DISTLOCK_TLS_CA"),
                    cert: ("ssl-cert", "DISTLOCK_TLS_CERT"),
                    key: ("ssl-key", "DISTLOCK_TLS_KEY"),
                },
                |name| {
                    let i = files.iter().position(|(n, _)| *n == name)?;
                    Some(files.remove(i).1)
                },
            )?;
            // MySQL's clients: a CA given without a mode checks the chain.
            let mode = ssl_mode.unwrap_or(if settings.ca.is_some() {
                SslMode::VerifyCa
            } else {
                SslMode::Preferred
            });
            (mode, with_tls(&opts, mode, &settings)?)
        };
        #[cfg(not(feature = "tls"))]
        let (ssl_mode, tls_opts) = {
            if let Some((name, _)) = files.first() {
                return Err(distlock_core::url::no_tls_build(name));
            }
            let mode = ssl_mode.unwrap_or(SslMode::Preferred);
            (mode, with_tls(&opts, mode, &())?)
        };
        Ok(MysqlConfig {
            opts,
            tls_opts,
            ssl_mode,
            sessions,
            pool_wait,
            fence,
            connect_timeout,
            response_timeout,
        })
    }
}

/// Where fencing tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FenceSource {
    /// A counter per name in `distlock_locks`, bumped by the acquire (a write).
    Counter,
    /// MariaDB's cached `SEQUENCE` `distlock_fence`, read in the acquiring statement.
    Sequence,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let c = MysqlConfig::from_url(
            "mariadb://app:pw@db:3307/locks?sessions=2&response_timeout=500ms&pool_wait=0s&fence=counter",
        )
        .unwrap();
        assert_eq!(c.fence, Some(FenceSource::Counter));
        assert_eq!(c.sessions, 2);
        assert_eq!(c.pool_wait, Duration::ZERO);
        assert_eq!(c.response_timeout, Duration::from_millis(500));
        assert_eq!(c.opts.tcp_port(), 3307);
        for bad in [
            "mysql://h",
            "mysql://h/",
            "mysql://h/db?nonsense=1",
            "mysql://h/db?response_timeout=0",
            "mysql://h/db?sessions=0",
            "mysql://h/db?idle_connections=2",
            "mysql://h/db?fence=dice",
            "postgres://h/db",
        ] {
            let e = MysqlConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
        }
        let e = MysqlConfig::from_url("mysql://u:topsecret@h/db?x=1").unwrap_err();
        assert!(!e.to_string().contains("topsecret"), "{e}");
    }
}
