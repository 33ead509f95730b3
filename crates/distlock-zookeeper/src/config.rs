//! `zk://` URLs.

use std::time::Duration;

use distlock_core::url::{MultiHostUrl, split_scheme};
use distlock_core::{ErrorKind, LockError};

use crate::layout::Layout;

/// How to reach a ZooKeeper ensemble, and where lock nodes live in it.
///
/// From a URL: `zk://[user:password@]host1:port1,host2:port2,…[/chroot][?params]`. With a
/// user and password, each session authenticates with ZooKeeper's `digest` scheme and creates
/// its nodes with the `CREATOR_ALL` ACL: only sessions with the same credentials can read,
/// take over or delete them. Without, nodes are open to all (`OPEN_ACL_UNSAFE`), as ZooKeeper
/// clients make them by default. Parameters:
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | `prefix` | `/distlock` | the lock `orders` queues its holders under `<prefix>/orders` |
/// | `session_timeout` | `10s` | the session's timeout (the server may clamp it) |
/// | `connect_timeout` | `3s` | per connection attempt |
/// | `response_timeout` | `2s` | per request |
/// | `layout` | `curator` | how lock nodes are named: `curator` (Curator's `InterProcessMutex` sees them) or `kazoo` (kazoo's `Lock`, `ReadLock` and `WriteLock` see them); see [`Layout`] |
///
/// `zks://…` (the `tls` feature) connects to the servers' secure client port
/// (`secureClientPort`) with TLS, and takes these too:
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | `tls_ca` | the system's roots | PEM file of the CA that signed the servers' certificates |
/// | `tls_cert`, `tls_key` | none | our certificate and key, for `ssl.clientAuth=need` |
/// | `tls_verify` | `full` | `full`: the chain and each server's name as the URL gives it; `ca`: the chain only |
///
/// The files may also come from `DISTLOCK_TLS_CA`, `DISTLOCK_TLS_CERT` and
/// `DISTLOCK_TLS_KEY`. The ZooKeeper client always checks the chain, so `tls_verify=none` is
/// refused, and it checks each server against its own host name, so `tls_server_name` is too.
#[derive(Clone)]
pub struct ZkConfig {
    /// `host:port,…[/chroot]`, as the client takes it.
    pub(crate) cluster: String,
    pub(crate) prefix: String,
    pub(crate) session_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    /// How lock nodes are named.
    pub(crate) layout: Layout,
    /// `digest` credentials, `user:password`.
    pub(crate) digest: Option<String>,
    /// The servers, `host:port`, to find out why a TLS connection failed.
    pub(crate) hosts: Vec<String>,
    /// TLS to the secure client port (`zks://`).
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<distlock_tls::TlsSettings>,
}

impl std::fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkConfig")
            .field("cluster", &self.cluster)
            .field("prefix", &self.prefix)
            .field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("layout", &self.layout)
            .field(
                "digest_user",
                &self.digest.as_deref().and_then(|d| d.split(':').next()),
            )
            .field("tls", &self.tls_debug())
            .finish()
    }
}

impl ZkConfig {
    /// Parses a `zk://` URL (see the type's documentation).
    ///
    /// # Errors
    /// `Config` for a malformed URL or a bad parameter.
    pub fn from_url(text: &str) -> Result<Self, LockError> {
        let cfg_err = |m: String| LockError::new(ErrorKind::Config, m);
        let (tls, rest) = split_scheme(text, "zk", "zks")?;
        if tls && cfg!(not(feature = "tls")) {
            return Err(distlock_core::url::no_tls_build("zks://"));
        }
        let mut parts = MultiHostUrl::parse(rest)?;
        let digest = if parts.userinfo.is_empty() {
            None
        } else {
            let (user, password) = parts.credentials();
            if user.is_empty() || user.contains(':') {
                return Err(cfg_err(
                    "a ZooKeeper digest user is a non-empty name without ':'".into(),
                ));
            }
            Some(format!("{user}:{password}"))
        };
        let mut cfg = ZkConfig {
            cluster: String::new(),
            prefix: "/distlock".into(),
            session_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            response_timeout: Duration::from_secs(2),
            layout: Layout::default(),
            digest,
            hosts: Vec::new(),
            #[cfg(feature = "tls")]
            tls: None,
        };
        #[cfg(feature = "tls")]
        if tls {
            let settings = distlock_tls::TlsSettings::from_params(|n| parts.take(n))?;
            if settings.verify == distlock_tls::Verify::EncryptOnly {
                return Err(LockError::new(
                    ErrorKind::Unsupported,
                    "zks:// with tls_verify=none: the ZooKeeper client always checks the \
                     server's chain against a CA; give tls_ca, with tls_verify=ca to skip the \
                     name",
                ));
            }
            if settings.server_name.is_some() {
                return Err(cfg_err(
                    "zks:// takes no tls_server_name: the ZooKeeper client checks each server \
                     against its host in the URL (tls_verify=ca skips the name)"
                        .into(),
                ));
            }
            cfg.tls = Some(settings);
        }
        if let Some(p) = parts.take("prefix") {
            cfg.prefix = p;
        }
        if let Some(l) = parts.take("layout") {
            cfg.layout = Layout::parse(&l)?;
        }
        if let Some(d) = parts.take_duration("session_timeout")? {
            cfg.session_timeout = d;
        }
        parts.take_timeouts(&mut cfg.connect_timeout, &mut cfg.response_timeout)?;
        parts.no_more_params(
            "ZooKeeper",
            if tls {
                "prefix, layout, session_timeout, connect_timeout, response_timeout, tls_ca, \
                 tls_cert, tls_key, tls_verify"
            } else {
                "prefix, layout, session_timeout, connect_timeout, response_timeout"
            },
        )?;
        parts.require_ports(if tls { 2281 } else { 2181 })?;
        let chroot = parts.path.trim_end_matches('/');
        if chroot.contains("//") || chroot.split('/').any(|s| s == "." || s == "..") {
            return Err(cfg_err(format!("{:?} is not a ZooKeeper path", parts.path)));
        }
        cfg.cluster = format!("{}{chroot}", parts.hosts.join(","));
        cfg.hosts = parts.hosts.iter().map(|h| (*h).to_owned()).collect();
        cfg.check_prefix()?;
        Ok(cfg)
    }

    #[cfg(feature = "tls")]
    fn tls_debug(&self) -> Option<&distlock_tls::TlsSettings> {
        self.tls.as_ref()
    }

    #[cfg(not(feature = "tls"))]
    fn tls_debug(&self) -> Option<()> {
        None
    }

    fn check_prefix(&self) -> Result<(), LockError> {
        let p = &self.prefix;
        if !p.starts_with('/') || p.len() < 2 || p.ends_with('/') || p.contains("//") {
            return Err(LockError::new(
                ErrorKind::Config,
                format!("the ZooKeeper prefix {p:?} must be an absolute path like /distlock"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "tls")]
    #[test]
    fn zks_urls_take_the_tls_files_and_refuse_what_the_client_cannot_do() {
        let c = ZkConfig::from_url(
            "zks://alice:pw@h1:2281,h2:2999/app?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem\
             &tls_verify=ca&prefix=/l",
        )
        .expect("valid");
        assert_eq!(c.cluster, "h1:2281,h2:2999/app");
        assert_eq!(c.hosts, ["h1:2281", "h2:2999"]);
        let tls = c.tls.as_ref().expect("TLS");
        assert_eq!(tls.ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert_eq!(tls.verify, distlock_tls::Verify::Chain);
        assert_eq!(c.prefix, "/l");
        assert!(!format!("{c:?}").contains("pw"), "{c:?}");
        assert!(ZkConfig::from_url("zk://h:2181").unwrap().tls.is_none());
        let e = ZkConfig::from_url("zks://h:2281?tls_verify=none").expect_err("no encrypt-only");
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        for bad in [
            "zks://h:2281?tls_server_name=zk.example.com",
            "zks://h:2281?tls_verify=maybe",
            "zks://h:2281?tls_cert=/c.pem",
            "zk://h:2181?tls_ca=/ca.pem",
        ] {
            let e = ZkConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
        }
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn zks_urls_need_the_tls_feature() {
        let e = ZkConfig::from_url("zks://h:2281").expect_err("no TLS");
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    }

    #[test]
    fn urls_name_servers_chroot_and_settings() {
        let c = ZkConfig::from_url(
            "zk://10.0.0.1:2181,10.0.0.2:2181/apps/x?prefix=/locks&session_timeout=4s",
        )
        .expect("valid");
        assert_eq!(c.cluster, "10.0.0.1:2181,10.0.0.2:2181/apps/x");
        assert_eq!(c.prefix, "/locks");
        assert_eq!(c.session_timeout, Duration::from_secs(4));
        assert_eq!(
            ZkConfig::from_url("zk://h:2181/").unwrap().cluster,
            "h:2181"
        );
    }

    #[test]
    fn bad_urls_are_config_errors() {
        for bad in [
            "",
            "zk://",
            "zk://h",
            "zk://h:0",
            "zk://:p@h:2181",
            "zk://h:2181,,g:2181",
            "zk://h:2181/a//b",
            "zk://h:2181/a/../b",
            "zk://h:2181?prefix=locks",
            "zk://h:2181?prefix=/",
            "zk://h:2181?session_timeout=0",
            "zk://h:2181?what=1",
        ] {
            let e = ZkConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
        }
        let c = ZkConfig::from_url("zk://alice:p%40ss@h:2181").expect("digest");
        assert_eq!(c.digest.as_deref(), Some("alice:p@ss"));
        assert!(!format!("{c:?}").contains("p@ss"), "{c:?}");
    }
}
