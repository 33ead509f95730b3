//! `redis://` URLs and the settings distlock adds to them.

use std::time::Duration;

use distlock_core::{ErrorKind, LockError, parse_duration};

use crate::keys::KeyLayout;

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
#[derive(Clone)]
pub struct RedisConfig {
    pub(crate) url: String,
    pub(crate) layout: KeyLayout,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

const OURS: [&str; 4] = ["prefix", "hash_tag", "connect_timeout", "response_timeout"];

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
        };
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
                _ => rest.push((k.into_owned(), v.into_owned())),
            }
        }
        debug_assert!(OURS.len() == 4);
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
            .finish()
    }
}

fn positive(key: &str, value: &str) -> Result<Duration, LockError> {
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
        assert!(RedisConfig::from_url("redis+unix:///tmp/redis.sock?db=1").is_ok());
        assert!(RedisConfig::from_url("rediss://example.invalid:6380").is_ok());
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
            "redis://127.0.0.1:99999",
        ] {
            let e = RedisConfig::from_url(bad).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}: {e}");
        }
    }
}
