//! `redis://` URLs and the settings distlock adds to them.

use std::time::Duration;

use distlock_core::{ErrorKind, LockError, parse_duration};

use crate::keys::KeyLayout;
pub(crate) use distlock_core::url::MultiHostUrl;

/// How to reach one Redis server, and how lock keys are named on it.
///
/// Built from a URL: `redis://[user:password@]host:port[/db]`, `rediss://…` (TLS),
/// `redis+unix:///path/to/socket[?db=N]` or `unix:///path`, plus distlock's query parameters:
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | `prefix` | `distlock:` | prepended to every lock key |
/// | `hash_tag` | `true` | wrap the name in `{…}` so lock, fence and channel share a Cluster slot |
/// | `connect_timeout` | `3s` | per connection attempt |
/// | `response_timeout` | `2s` | per command; an unanswered acquire is resent with the same token |
/// | `wait_replicas` | none | after each acquire and renewal, `WAIT` for this many replicas to acknowledge it; fewer in time: the acquire fails (and is undone), the renewal counts as failed |
/// | `wait_timeout` | `100ms` | how long that `WAIT` blocks; below `response_timeout` |
/// | `tls_ca` | the system's roots | `rediss://`: the CA file (PEM) the server's certificate chains to |
/// | `tls_cert`, `tls_key` | none | `rediss://`: our certificate and key (PEM), for `tls-auth-clients yes` |
///
/// The TLS files default to `DISTLOCK_TLS_CA`, `DISTLOCK_TLS_CERT` and `DISTLOCK_TLS_KEY`.
/// `rediss://` checks the chain and the host name; `#insecure` at the end of the URL checks
/// nothing (redis-rs has no chain-only mode).
#[derive(Clone)]
pub struct RedisConfig {
    pub(crate) url: String,
    /// The CA and client certificate of `rediss://`, read when the URL was parsed.
    #[cfg(feature = "tls")]
    pub(crate) certs: Option<redis::TlsCertificates>,
    /// The same files for the direct connection (see `direct`), which speaks TLS itself:
    /// `Some` for `rediss://` and `valkeys://`.
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<distlock_tls::TlsSettings>,
    pub(crate) layout: KeyLayout,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) wait: Option<WaitReplicas>,
}

/// `WAIT numreplicas timeout` after every write that takes or keeps a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WaitReplicas {
    pub(crate) replicas: u32,
    /// Whole milliseconds, at least 1 (`WAIT … 0` would block forever).
    pub(crate) timeout_ms: u64,
}

const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(100);

const OURS: [&str; 6] = [
    "prefix",
    "hash_tag",
    "connect_timeout",
    "response_timeout",
    "wait_replicas",
    "wait_timeout",
];

/// redis-rs builds its rustls configuration with the process's default provider: make sure
/// there is one before a TLS URL is opened.
#[cfg(feature = "tls")]
fn provider_for(urls: &[&str]) {
    if urls
        .iter()
        .any(|u| u.starts_with("rediss:") || u.starts_with("valkeys:"))
    {
        distlock_tls::install_default_provider();
    }
}

impl RedisConfig {
    /// Parses a Redis URL with distlock's parameters.
    ///
    /// # Errors
    /// `Config` for a malformed URL, an unknown scheme or a bad parameter value.
    pub fn from_url(text: &str) -> Result<Self, LockError> {
        let cfg_err = |m: String| LockError::new(ErrorKind::Config, m);
        let mut url = url::Url::parse(text)
            .map_err(|e| cfg_err(format!("malformed Redis URL: {e}")).with_source(e))?;
        match url.scheme() {
            "redis" | "rediss" | "redis+unix" | "unix" | "valkey" | "valkeys" => {}
            other => return Err(cfg_err(format!("{other:?} is not a Redis URL scheme"))),
        }
        if matches!(url.scheme(), "redis" | "rediss" | "valkey" | "valkeys")
            && url.host_str().is_none_or(str::is_empty)
        {
            return Err(cfg_err("the Redis URL names no host".into()));
        }
        let mut cfg = RedisConfig {
            url: String::new(),
            layout: KeyLayout::default(),
            connect_timeout: Duration::from_secs(3),
            response_timeout: Duration::from_secs(2),
            wait: None,
            #[cfg(feature = "tls")]
            certs: None,
            #[cfg(feature = "tls")]
            tls: None,
        };
        let mut files: Vec<(String, String)> = Vec::new();
        let mut replicas = None;
        let mut wait_timeout = None;
        let mut rest: Vec<(String, String)> = Vec::new();
        for (k, v) in url.query_pairs() {
            match k.as_ref() {
                "prefix" => cfg.layout.prefix = v.into_owned(),
                "hash_tag" => {
                    cfg.layout.hash_tag = match v.as_ref() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => return Err(cfg_err(format!("hash_tag={v:?}: use true or false"))),
                    }
                }
                "connect_timeout" => cfg.connect_timeout = positive(&k, &v)?,
                "response_timeout" => cfg.response_timeout = positive(&k, &v)?,
                "wait_replicas" => {
                    replicas = Some(v.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(|| {
                        cfg_err(format!(
                            "wait_replicas={v:?}: use a number of replicas, 1 or more"
                        ))
                    })?);
                }
                "wait_timeout" => wait_timeout = Some(positive(&k, &v)?),
                "tls_ca" | "tls_cert" | "tls_key" => {
                    files.push((k.into_owned(), v.into_owned()));
                }
                // redis-rs's own: the database and protocol; a socket's credentials.
                "db" | "protocol" | "user" | "pass" => rest.push((k.into_owned(), v.into_owned())),
                other => {
                    return Err(cfg_err(format!(
                        "unknown Redis URL parameter {other:?} (known: {}, db, protocol, \
                         tls_ca, tls_cert, tls_key)",
                        OURS.join(", ")
                    )));
                }
            }
        }
        debug_assert!(OURS.len() == 6);
        match (replicas, wait_timeout) {
            (Some(n), t) => cfg = cfg.wait_replicas(n, t.unwrap_or(DEFAULT_WAIT_TIMEOUT))?,
            (None, Some(_)) => {
                return Err(cfg_err("wait_timeout needs wait_replicas".into()));
            }
            (None, None) => {}
        }
        let tls = matches!(url.scheme(), "rediss" | "valkeys");
        cfg.take_tls_files(tls, files)?;
        if rest.is_empty() {
            url.set_query(None);
        } else {
            url.query_pairs_mut().clear().extend_pairs(rest);
        }
        // Let redis-rs validate the rest (db number, unix paths) now, not at first use.
        redis::Client::open(url.as_str())
            .map_err(|e| cfg_err(format!("invalid Redis URL: {e}")).with_source(e))?;
        cfg.url = url.into();
        Ok(cfg)
    }

    /// Reads the TLS files a `rediss://` URL (or the environment) names.
    #[cfg(feature = "tls")]
    fn take_tls_files(
        &mut self,
        tls: bool,
        mut files: Vec<(String, String)>,
    ) -> Result<(), LockError> {
        let mut settings = distlock_tls::TlsSettings::default();
        let given = !files.is_empty();
        settings.take_files(distlock_tls::DISTLOCK_PARAMS, |name| {
            let i = files.iter().position(|(k, _)| k == name)?;
            Some(files.remove(i).1)
        })?;
        if !tls {
            if given {
                return Err(LockError::new(
                    ErrorKind::Config,
                    "tls_ca, tls_cert and tls_key are for rediss:// URLs",
                ));
            }
            return Ok(());
        }
        self.tls = Some(settings.clone());
        if settings.ca.is_none() && settings.cert.is_none() {
            return Ok(());
        }
        // Checked here (a clear Config error naming the file), then handed to redis-rs.
        let pem = |path: &std::path::Path| -> Result<Vec<u8>, LockError> {
            std::fs::read(path).map_err(|e| {
                LockError::caused_by(ErrorKind::Config, format!("reading {}", path.display()), e)
            })
        };
        let root_cert = match &settings.ca {
            Some(ca) => {
                distlock_tls::read_certs(ca)?;
                Some(pem(ca)?)
            }
            None => None,
        };
        let client_tls = match (&settings.cert, &settings.key) {
            (Some(cert), Some(key)) => {
                distlock_tls::read_certs(cert)?;
                distlock_tls::read_key(key)?;
                Some(redis::ClientTlsConfig {
                    client_cert: pem(cert)?,
                    client_key: pem(key)?,
                })
            }
            _ => None,
        };
        self.certs = Some(redis::TlsCertificates {
            client_tls,
            root_cert,
        });
        Ok(())
    }

    #[cfg(not(feature = "tls"))]
    fn take_tls_files(
        &mut self,
        _tls: bool,
        files: Vec<(String, String)>,
    ) -> Result<(), LockError> {
        match files.first() {
            Some((name, _)) => Err(distlock_core::url::no_tls_build(name)),
            None => Ok(()),
        }
    }

    /// A redis-rs client for `url` (this server's, or another node's of the same deployment)
    /// with this configuration's CA and client certificate.
    pub(crate) fn open_client(&self, url: &str) -> redis::RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        provider_for(&[url]);
        #[cfg(feature = "tls")]
        if let Some(certs) = &self.certs {
            return redis::Client::build_with_tls(url, certs.clone());
        }
        redis::Client::open(url)
    }

    /// A Cluster client builder for `seeds`, with this configuration's CA and client
    /// certificate.
    pub(crate) fn cluster_builder<'a>(
        &self,
        seeds: impl IntoIterator<Item = &'a str>,
    ) -> redis::cluster::ClusterClientBuilder {
        let seeds: Vec<&str> = seeds.into_iter().collect();
        #[cfg(feature = "tls")]
        provider_for(&seeds);
        let builder = redis::cluster::ClusterClientBuilder::new(seeds);
        #[cfg(feature = "tls")]
        if let Some(certs) = &self.certs {
            return builder.certs(certs.clone());
        }
        builder
    }

    /// Prepends `prefix` to every lock key (default `distlock:`).
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.layout.prefix = prefix.into();
        self
    }

    /// Wraps names in a `{…}` hash tag (default on). Turn it off to lock exactly the key another
    /// client uses, on a non-Cluster server.
    #[must_use]
    pub fn hash_tag(mut self, on: bool) -> Self {
        self.layout.hash_tag = on;
        self
    }

    /// Time allowed for one connection attempt.
    #[must_use]
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Time allowed for one command's reply.
    #[must_use]
    pub fn response_timeout(mut self, d: Duration) -> Self {
        self.response_timeout = d;
        self
    }

    /// After every acquire and renewal, `WAIT replicas timeout` on the same connection: the
    /// write must reach that many replicas within `timeout`. An acquire that fewer replicas
    /// acknowledge fails with `QuorumNotReached` and is released; such a renewal counts as
    /// failed (the watchdog retries it until the lease runs out). See the crate README for
    /// what this does and does not guarantee on failover.
    ///
    /// # Errors
    /// `Config` when `replicas` is zero, or `timeout` is under a millisecond or not below the
    /// response timeout (the reply would be given up before `WAIT` ends).
    pub fn wait_replicas(mut self, replicas: u32, timeout: Duration) -> Result<Self, LockError> {
        let err = |m: &str| Err(LockError::new(ErrorKind::Config, m.to_owned()));
        if replicas == 0 {
            return err("wait_replicas must be 1 or more");
        }
        let timeout_ms = timeout.as_millis() as u64;
        if timeout_ms == 0 {
            return err("wait_timeout must be at least 1ms");
        }
        if timeout >= self.response_timeout {
            return err("wait_timeout must be below response_timeout");
        }
        self.wait = Some(WaitReplicas {
            replicas,
            timeout_ms,
        });
        Ok(self)
    }

    /// The URL without credentials, for logs.
    pub fn redacted_url(&self) -> String {
        match url::Url::parse(&self.url) {
            Ok(mut u) => {
                if u.password().is_some() {
                    let _ = u.set_password(Some("***"));
                }
                u.into()
            }
            Err(_) => "<redis>".into(),
        }
    }
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted_url())
            .field("layout", &self.layout)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("wait", &self.wait)
            .finish()
    }
}

/// The seed nodes of a Redis Cluster, and the settings for all of them.
///
/// From a URL: `redis+cluster://[user:password@]host1:port1,host2:port2,…[?params]`
/// (`rediss+cluster://` for TLS). Any reachable seeds will do: the client learns the slot map
/// from them and follows `MOVED`/`ASK`. The parameters are those of [`RedisConfig`]; a Cluster
/// has only database 0, and `hash_tag` must stay on (the lock key, its fence counter and its
/// queue must share one slot).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    seeds: Vec<RedisConfig>,
}

impl ClusterConfig {
    pub(crate) fn is_cluster_url(url: &str) -> bool {
        url.starts_with("redis+cluster://") || url.starts_with("rediss+cluster://")
    }

    /// Parses a `redis+cluster://` URL (see the type's documentation).
    ///
    /// # Errors
    /// `Config` for a malformed URL, a database other than 0, or a bad parameter.
    pub fn from_url(text: &str) -> Result<Self, LockError> {
        let (scheme, rest) = strip_scheme(text, "redis+cluster", "rediss+cluster")?;
        let parts = MultiHostUrl::parse(rest)?;
        if !matches!(parts.path, "" | "/" | "/0") {
            return Err(LockError::new(
                ErrorKind::Config,
                format!("a Redis Cluster has only database 0, not {:?}", parts.path),
            ));
        }
        let query = parts.rest_query();
        let seeds = parts
            .hosts
            .iter()
            .map(|h| RedisConfig::from_url(&format!("{scheme}://{}{h}{query}", parts.userinfo)))
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(seeds)
    }

    /// Seeds from their configurations; the first one's key layout, timeouts and `WAIT`
    /// apply to the whole Cluster.
    ///
    /// # Errors
    /// `Config` when there is no seed, or `hash_tag` is off.
    pub fn new(seeds: impl IntoIterator<Item = RedisConfig>) -> Result<Self, LockError> {
        let seeds: Vec<RedisConfig> = seeds.into_iter().collect();
        let Some(first) = seeds.first() else {
            return Err(LockError::new(
                ErrorKind::Config,
                "a Cluster URL needs at least one seed node",
            ));
        };
        if !first.layout.hash_tag {
            return Err(LockError::new(
                ErrorKind::Config,
                "a Cluster needs hash_tag=true: the lock key, its fence counter and its queue \
                 must share one slot",
            ));
        }
        Ok(ClusterConfig { seeds })
    }

    pub(crate) fn seeds(&self) -> &[RedisConfig] {
        &self.seeds
    }

    /// The settings for the whole Cluster (the first seed's).
    pub fn settings(&self) -> &RedisConfig {
        &self.seeds[0]
    }
}

/// The Redis scheme (`redis`, or `rediss` for TLS) of a URL that starts with `plain://` or
/// `tls://`, and the rest after `://`.
///
/// # Errors
/// `Config` for any other scheme.
pub(crate) fn strip_scheme<'a>(
    text: &'a str,
    plain: &str,
    tls: &str,
) -> Result<(&'static str, &'a str), LockError> {
    let (tls, rest) = distlock_core::url::split_scheme(text, plain, tls)?;
    Ok((if tls { "rediss" } else { "redis" }, rest))
}

pub(crate) fn positive(key: &str, value: &str) -> Result<Duration, LockError> {
    let d = parse_duration(value)?;
    if d.is_zero() {
        return Err(LockError::new(
            ErrorKind::Config,
            format!("{key} must be above zero"),
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_keep_their_own_parameters() {
        let c = RedisConfig::from_url(
            "redis://user:pw@127.0.0.1:6390/2?prefix=app:&response_timeout=250ms&hash_tag=false",
        )
        .expect("valid");
        assert_eq!(c.layout.prefix, "app:");
        assert!(!c.layout.hash_tag);
        assert_eq!(c.response_timeout, Duration::from_millis(250));
        assert_eq!(c.url, "redis://user:pw@127.0.0.1:6390/2");
        assert_eq!(c.redacted_url(), "redis://user:***@127.0.0.1:6390/2");
        let w =
            RedisConfig::from_url("redis://h:1?wait_replicas=2&wait_timeout=250ms").expect("ok");
        assert_eq!(
            w.wait,
            Some(WaitReplicas {
                replicas: 2,
                timeout_ms: 250
            })
        );
        assert_eq!(w.url, "redis://h:1");
        assert!(RedisConfig::from_url("redis+unix:///tmp/redis.sock?db=1").is_ok());
        assert!(RedisConfig::from_url("rediss://example.invalid:6380").is_ok());
    }

    #[test]
    fn cluster_urls_name_seeds_and_shared_settings() {
        let c = ClusterConfig::from_url(
            "redis+cluster://u:pw@10.0.0.1:7000,10.0.0.2:7001?prefix=app:&response_timeout=1s",
        )
        .expect("valid");
        let urls: Vec<&str> = c.seeds().iter().map(|s| s.url.as_str()).collect();
        assert_eq!(
            urls,
            ["redis://u:pw@10.0.0.1:7000", "redis://u:pw@10.0.0.2:7001"]
        );
        assert_eq!(c.settings().layout.prefix, "app:");
        assert_eq!(c.settings().response_timeout, Duration::from_secs(1));
        assert!(ClusterConfig::from_url("rediss+cluster://h:1/0").is_ok());
        for bad in [
            "redis://h:1",
            "redis+cluster://",
            "redis+cluster://h:1,,h:2",
            "redis+cluster://h:1/2",
            "redis+cluster://h:1?hash_tag=false",
            "redis+cluster://h:1?wait_timeout=5ms",
        ] {
            let e = ClusterConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
        }
    }

    #[test]
    fn bad_urls_are_config_errors() {
        for bad in [
            "",
            "not a url",
            "http://127.0.0.1:6379",
            "redis://",
            "redis://127.0.0.1:6379?connect_timeout=soon",
            "redis://127.0.0.1:6379?response_timeout=0",
            "redis://127.0.0.1:6379?hash_tag=maybe",
            "redis://127.0.0.1:6379?wait_replicas=0",
            "redis://127.0.0.1:6379?wait_replicas=two",
            "redis://127.0.0.1:6379?wait_timeout=50ms",
            "redis://127.0.0.1:6379?wait_replicas=1&wait_timeout=2s",
            "redis://127.0.0.1:6379?wait_replicas=1&wait_timeout=100us",
            "redis://127.0.0.1:99999",
        ] {
            let e = RedisConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
        }
    }
}
