//! `etcd://` URLs.

use std::time::Duration;

use distlock_core::url::{MultiHostUrl, split_scheme};
use distlock_core::{ErrorKind, LockError};

/// How to reach an etcd cluster, and where lock keys live in it.
///
/// From a URL: `etcd://[user:password@]host1:port1,host2:port2,…[?params]`. Any members will
/// do: requests go to one of them, and move on to the next when it refuses the connection,
/// says it cannot serve, or does not answer within `response_timeout`. Parameters:
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | `prefix` | `distlock/` | the lock `orders` queues its holders under `<prefix>orders/` |
/// | `connect_timeout` | `3s` | per connection attempt |
/// | `response_timeout` | `2s` | per request: a member silent this long is left for the next |
///
/// `etcds://` connects with TLS (with the `tls` feature, on by default), and takes:
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | `tls_ca` | the system's roots | the CA file (PEM) the members' certificates chain to |
/// | `tls_cert`, `tls_key` | none | our certificate and key (PEM), for members run with `--client-cert-auth` |
/// | `tls_verify` | `full` | `full` (the chain and the host name), `ca` (the chain), `none` |
/// | `tls_server_name` | the host | the name to expect in the certificates |
///
/// The files default to `DISTLOCK_TLS_CA`, `DISTLOCK_TLS_CERT` and `DISTLOCK_TLS_KEY`.
#[derive(Clone)]
pub struct EtcdConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) user: Option<(String, String)>,
    pub(crate) prefix: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    /// TLS, for `etcds://`.
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<distlock_tls::TlsSettings>,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .finish_non_exhaustive()
    }
}

impl EtcdConfig {
    /// Parses an `etcd://` URL (see the type's documentation).
    ///
    /// # Errors
    /// `Config` for a malformed URL, `etcds://`, or a bad parameter.
    pub fn from_url(text: &str) -> Result<Self, LockError> {
        let cfg_err = |m: String| LockError::new(ErrorKind::Config, m);
        let (tls, rest) = split_scheme(text, "etcd", "etcds")?;
        if tls && cfg!(not(feature = "tls")) {
            return Err(distlock_core::url::no_tls_build("etcds://"));
        }
        let mut parts = MultiHostUrl::parse(rest)?;
        if !matches!(parts.path, "" | "/") {
            return Err(cfg_err(format!(
                "an etcd URL has no path ({:?}): set the key prefix with ?prefix=",
                parts.path
            )));
        }
        let mut cfg = EtcdConfig {
            endpoints: Vec::new(),
            user: None,
            prefix: "distlock/".into(),
            connect_timeout: Duration::from_secs(3),
            response_timeout: Duration::from_secs(2),
            #[cfg(feature = "tls")]
            tls: None,
        };
        #[cfg(feature = "tls")]
        if tls {
            let mut settings = distlock_tls::TlsSettings::from_params(|n| parts.take(n))?;
            // gRPC: HTTP/2, agreed in the handshake.
            settings.alpn = vec![b"h2".to_vec()];
            cfg.tls = Some(settings);
        }
        if let Some(p) = parts.take("prefix") {
            cfg.prefix = p;
        }
        parts.take_timeouts(&mut cfg.connect_timeout, &mut cfg.response_timeout)?;
        parts.no_more_params(
            "etcd",
            "prefix, connect_timeout, response_timeout; with etcds://: tls_ca, tls_cert, \
             tls_key, tls_verify, tls_server_name",
        )?;
        parts.require_ports(2379)?;
        if !parts.userinfo.is_empty() {
            let (user, password) = parts.credentials();
            cfg.user = Some((user, password));
        }
        for host in &parts.hosts {
            cfg.endpoints.push(format!("http://{host}"));
        }
        cfg.check_prefix()?;
        Ok(cfg)
    }

    /// Sets the key prefix (default `distlock/`).
    ///
    /// # Errors
    /// `Config` for an empty prefix.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Result<Self, LockError> {
        self.prefix = prefix.into();
        self.check_prefix()?;
        Ok(self)
    }

    fn check_prefix(&self) -> Result<(), LockError> {
        if self.prefix.is_empty() {
            return Err(LockError::new(
                ErrorKind::Config,
                "the etcd key prefix must not be empty (locks would mix with other keys)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_members_credentials_and_settings() {
        let c = EtcdConfig::from_url("etcd://root:p%40ss@10.0.0.1:2379,10.0.0.2:2379?prefix=app/locks/&response_timeout=500ms")
            .expect("valid");
        assert_eq!(
            c.endpoints,
            ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        assert_eq!(c.user, Some(("root".into(), "p@ss".into())));
        assert_eq!(c.prefix, "app/locks/");
        assert_eq!(c.response_timeout, Duration::from_millis(500));
        assert!(EtcdConfig::from_url("etcd://127.0.0.1:2379/").is_ok());
        let t = EtcdConfig::from_url(
            "etcds://a:2379,b:2379?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem&tls_verify=ca",
        )
        .expect("valid");
        let tls = t.tls.expect("TLS");
        assert_eq!(tls.ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert_eq!(tls.verify, distlock_tls::Verify::Chain);
        assert_eq!(tls.alpn, [b"h2".to_vec()]);
    }

    #[test]
    fn bad_urls_are_config_errors() {
        for bad in [
            "",
            "redis://h:1",
            "etcds://h:2379?tls_verify=maybe",
            "etcds://h:2379?tls_cert=/c.pem",
            "etcd://",
            "etcd://h",
            "etcd://h:0",
            "etcd://h:99999",
            "etcd://h:2379,,g:2379",
            "etcd://h:2379/path",
            "etcd://h:2379?prefix=",
            "etcd://h:2379?response_timeout=0",
            "etcd://h:2379?bogus=1",
        ] {
            let e = EtcdConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
        }
    }
}
