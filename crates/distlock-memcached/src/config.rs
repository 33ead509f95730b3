//! `memcached://` URLs.

use std::time::Duration;

use distlock_core::url::{MultiHostUrl, split_scheme};
use distlock_core::{ErrorKind, LockError};

/// How to reach memcached, and how lock keys are named there.
///
/// From a URL: `memcached://host:port[?params]`. One server: spreading locks over several
/// servers by hashing would move a lock to another server whenever the server list changes,
/// and two holders would each find it free. Parameters:
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | `prefix` | `distlock:` | the lock `orders` is the item `<prefix>orders` |
/// | `connect_timeout` | `3s` | per connection attempt |
/// | `response_timeout` | `2s` | per request |
///
/// `memcacheds://` connects with TLS (memcached 1.6 built with TLS, run with `-Z`), with the
/// `tls` feature (on by default):
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | `tls_ca` | the system's roots | the CA file (PEM) the server's certificate chains to |
/// | `tls_cert`, `tls_key` | none | our certificate and key (PEM), for `ssl_verify_mode=2` or `3` |
/// | `tls_verify` | `full` | `full` (the chain and the host name), `ca` (the chain), `none` |
/// | `tls_server_name` | the host | the name to expect in the certificate |
///
/// The files default to `DISTLOCK_TLS_CA`, `DISTLOCK_TLS_CERT` and `DISTLOCK_TLS_KEY`.
#[derive(Clone, Debug)]
pub struct MemcachedConfig {
    pub(crate) host: String,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<distlock_tls::TlsSettings>,
    pub(crate) prefix: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

impl MemcachedConfig {
    /// Parses a `memcached://` URL.
    ///
    /// # Errors
    /// `Config` for a malformed URL or a bad parameter; `Unsupported` for several servers.
    pub fn from_url(text: &str) -> Result<Self, LockError> {
        let cfg_err = |m: String| LockError::new(ErrorKind::Config, m);
        let (tls, rest) = split_scheme(text, "memcached", "memcacheds")?;
        if tls && cfg!(not(feature = "tls")) {
            return Err(distlock_core::url::no_tls_build("memcacheds://"));
        }
        let mut parts = MultiHostUrl::parse(rest)?;
        if !parts.userinfo.is_empty() {
            return Err(cfg_err(
                "memcached URLs take no user:password (SASL is not built in this release)".into(),
            ));
        }
        if !parts.path.is_empty() && parts.path != "/" {
            return Err(cfg_err(format!(
                "memcached URLs have no path: {:?}",
                parts.path
            )));
        }
        parts.require_ports(11211)?;
        if parts.hosts.len() != 1 {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                "one memcached server per lock URL: hashing locks over several servers moves \
                 them when the list changes (two holders then both find a lock free)",
            ));
        }
        let mut cfg = MemcachedConfig {
            host: parts.hosts[0].to_owned(),
            #[cfg(feature = "tls")]
            tls: None,
            prefix: "distlock:".into(),
            connect_timeout: Duration::from_secs(3),
            response_timeout: Duration::from_secs(2),
        };
        #[cfg(feature = "tls")]
        if tls {
            cfg.tls = Some(distlock_tls::TlsSettings::from_params(|n| parts.take(n))?);
        }
        if let Some(p) = parts.take("prefix") {
            if p.bytes().any(|b| b <= b' ' || b == 0x7f) || p.len() > 64 {
                return Err(cfg_err(format!(
                    "prefix={p:?}: printable characters without spaces, at most 64"
                )));
            }
            cfg.prefix = p;
        }
        parts.take_timeouts(&mut cfg.connect_timeout, &mut cfg.response_timeout)?;
        parts.no_more_params(
            "memcached",
            "prefix, connect_timeout, response_timeout; with memcacheds://: tls_ca, tls_cert, \
             tls_key, tls_verify, tls_server_name",
        )?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        let c = MemcachedConfig::from_url(
            "memcached://10.0.0.5:11211?prefix=app:&response_timeout=500ms",
        )
        .unwrap();
        assert_eq!(c.host, "10.0.0.5:11211");
        assert_eq!(c.prefix, "app:");
        assert_eq!(c.response_timeout, Duration::from_millis(500));
        for bad in [
            "memcached://h",
            "memcached://h:11211/x",
            "memcached://u:p@h:11211",
            "memcached://h:11211?prefix=a%20b&x=1",
            "memcached://h:11211?nonsense=1",
            "memcacheds://h:11211?tls_verify=maybe",
            "redis://h:1",
        ] {
            let e = MemcachedConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
        }
        let e = MemcachedConfig::from_url("memcached://a:1,b:2").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
    }
}
