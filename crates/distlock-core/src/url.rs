//! URLs that name several servers (`scheme://[user:password@]h1:p1,h2:p2[/path][?query]`), as
//! the engines of several nodes take them. The `url` crate takes one host only.

use crate::{ErrorKind, LockError};

/// Whether a URL is `plain://…` (`false`) or `tls://…` (`true`), and the rest after `://`.
///
/// # Errors
/// `Config` for any other scheme.
pub fn split_scheme<'a>(
    text: &'a str,
    plain: &str,
    tls: &str,
) -> Result<(bool, &'a str), LockError> {
    let after = |scheme: &str| text.strip_prefix(scheme)?.strip_prefix("://");
    if let Some(rest) = after(plain) {
        Ok((false, rest))
    } else if let Some(rest) = after(tls) {
        Ok((true, rest))
    } else {
        Err(LockError::new(
            ErrorKind::Config,
            format!("{:?} is not a {plain}:// (or {tls}://) URL", redact(text)),
        ))
    }
}

/// The error for `what` (a TLS scheme, a TLS parameter) in a build of an engine without its
/// `tls` feature: `Unsupported`, in the same words for every engine.
pub fn no_tls_build(what: &str) -> LockError {
    LockError::new(
        ErrorKind::Unsupported,
        format!("{what}: this build has no TLS (the `tls` feature is off)"),
    )
}

/// A URL that names several servers, cut into its parts.
#[derive(Debug, Clone)]
pub struct MultiHostUrl<'a> {
    /// `user:password@`, or empty.
    pub userinfo: &'a str,
    /// `host:port` of each server, as written.
    pub hosts: Vec<&'a str>,
    /// From the first `/`, or empty.
    pub path: &'a str,
    /// The query's `name=value` pairs, as written.
    query: Vec<&'a str>,
}

impl<'a> MultiHostUrl<'a> {
    /// Cuts `rest`, the URL after `scheme://`.
    ///
    /// # Errors
    /// `Config` when a host is empty.
    pub fn parse(rest: &'a str) -> Result<Self, LockError> {
        let (authority, tail) = match rest.find(['/', '?']) {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(i) => (&authority[..=i], &authority[i + 1..]),
            None => ("", authority),
        };
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        let hosts: Vec<&str> = hosts.split(',').collect();
        if hosts.iter().any(|h| h.trim().is_empty()) {
            return Err(LockError::new(
                ErrorKind::Config,
                format!("the URL names an empty host in {authority:?}"),
            ));
        }
        Ok(MultiHostUrl {
            userinfo,
            hosts,
            path,
            query: query.split('&').filter(|p| !p.is_empty()).collect(),
        })
    }

    /// Removes the parameter `name` from the query and returns its (percent-decoded) value.
    pub fn take(&mut self, name: &str) -> Option<String> {
        let i = self
            .query
            .iter()
            .position(|p| p.split_once('=').map_or(*p, |(k, _)| k) == name)?;
        let pair = self.query.remove(i);
        url::form_urlencoded::parse(pair.as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
    }

    /// The parameters not taken, as `?a=b&c=d` (or empty).
    pub fn rest_query(&self) -> String {
        if self.query.is_empty() {
            String::new()
        } else {
            format!("?{}", self.query.join("&"))
        }
    }

    /// Removes the duration parameter `name` (`500ms`, `3s`…) and returns it.
    ///
    /// # Errors
    /// `Config` for a value that is not a duration, or zero.
    pub fn take_duration(&mut self, name: &str) -> Result<Option<std::time::Duration>, LockError> {
        let Some(v) = self.take(name) else {
            return Ok(None);
        };
        let d = crate::parse_duration(&v)?;
        if d.is_zero() {
            return Err(LockError::new(
                ErrorKind::Config,
                format!("{name} must be above zero"),
            ));
        }
        Ok(Some(d))
    }

    /// Sets `*connect` and `*response` from the parameters `connect_timeout` and
    /// `response_timeout`, where the URL gives them (as [`take_duration`](Self::take_duration)
    /// reads them).
    ///
    /// # Errors
    /// `Config` for a malformed or zero duration.
    pub fn take_timeouts(
        &mut self,
        connect: &mut std::time::Duration,
        response: &mut std::time::Duration,
    ) -> Result<(), LockError> {
        if let Some(d) = self.take_duration("connect_timeout")? {
            *connect = d;
        }
        if let Some(d) = self.take_duration("response_timeout")? {
            *response = d;
        }
        Ok(())
    }

    /// Fails on parameters not taken (`engine` and `known` name them in the message).
    ///
    /// # Errors
    /// `Config` when any parameter is left.
    pub fn no_more_params(&self, engine: &str, known: &str) -> Result<(), LockError> {
        if self.query.is_empty() {
            return Ok(());
        }
        // Named, with their values unless they are secrets.
        let shown: Vec<String> = self
            .query
            .iter()
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) if is_secret_param(k) => format!("{k}=***"),
                _ => (*pair).to_owned(),
            })
            .collect();
        Err(LockError::new(
            ErrorKind::Config,
            format!(
                "unknown {engine} URL parameter(s) \"?{}\" (known: {known})",
                shown.join("&")
            ),
        ))
    }

    /// Fails unless every host is `host:port` with a port above zero (`usual` is the engine's
    /// usual port, for the message).
    ///
    /// # Errors
    /// `Config` naming the first bad host.
    pub fn require_ports(&self, usual: u16) -> Result<(), LockError> {
        for host in &self.hosts {
            let ok = host
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                return Err(LockError::new(
                    ErrorKind::Config,
                    format!("{host:?} is not host:port (the usual port is {usual})"),
                ));
            }
        }
        Ok(())
    }

    /// The user name and password of `userinfo`, percent-decoded (empty when absent).
    pub fn credentials(&self) -> (String, String) {
        let info = self.userinfo.trim_end_matches('@');
        let (user, password) = info.split_once(':').unwrap_or((info, ""));
        (decode(user), decode(password))
    }
}

/// A URL with its secrets replaced by `***`, for messages and logs: the password of its
/// `user:password@`, and the value of any query parameter whose name says it is one
/// (`password`, `sentinel_password`, `pass`, `secret`, `token`…).
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let mut out = match before_query.rsplit_once('@') {
        Some((cred, host)) if cred.contains(':') => {
            let user = cred.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}")
        }
        _ => format!("{scheme}://{before_query}"),
    };
    if let Some(query) = query {
        out.push('?');
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) if is_secret_param(k) => format!("{k}=***"),
                _ => pair.to_owned(),
            })
            .collect();
        out.push_str(&pairs.join("&"));
    }
    out
}

/// The duration of the URL parameter `name=value` (`500ms`, `2s`); zero only if `zero_ok`.
///
/// # Errors
/// `Config` naming the parameter.
pub fn duration_param(
    name: &str,
    value: &str,
    zero_ok: bool,
) -> Result<std::time::Duration, LockError> {
    crate::parse_duration(value)
        .ok()
        .filter(|d| zero_ok || !d.is_zero())
        .ok_or_else(|| {
            LockError::new(
                ErrorKind::Config,
                format!("{name}={value:?}: a duration such as 2s or 500ms"),
            )
        })
}

/// A URL component percent-decoded (`%40` → `@`, `+` → space, as form values are).
pub fn decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("v={text}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// Every byte but the unreserved ones (`A-Z a-z 0-9 - . _ ~`) as `%XX`: a password that any
/// URL parser reads back as it was.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `url` with `password` in it, where the URL itself need not show it: in its
/// `user:password@` (replacing any password there; no user gives `:password@`), or for a Unix
/// socket URL (`redis+unix://`, `unix://`) in its `pass` parameter. `None` leaves it as it is.
pub fn with_password(url: &str, password: Option<&str>) -> String {
    let Some(password) = password else {
        return url.to_owned();
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let encoded = percent_encode(password);
    if matches!(scheme, "redis+unix" | "unix") {
        let sep = if rest.contains('?') { '&' } else { '?' };
        return format!("{url}{sep}pass={encoded}");
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rfind('@') {
        Some(i) => {
            let info = &authority[..i];
            (info.split(':').next().unwrap_or(""), &authority[i + 1..])
        }
        None => ("", authority),
    };
    format!("{scheme}://{user}:{encoded}@{hosts}{tail}")
}

/// Whether a URL parameter carries a secret (its value is never shown).
pub fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["password", "pass", "pwd", "secret", "token"]
        .iter()
        .any(|s| name == *s || name.ends_with(&format!("_{s}")) || name.ends_with(&format!("-{s}")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(super::redact("mysql://u:pw@h/db"), "mysql://u:***@h/db");
        assert_eq!(super::redact("mysql://u@h/db"), "mysql://u@h/db");
        assert_eq!(super::redact("no url"), "no url");
        assert_eq!(
            super::redact("redis+sentinel://u:p@h:1,g:2/m?sentinel_password=s3&prefix=a"),
            "redis+sentinel://u:***@h:1,g:2/m?sentinel_password=***&prefix=a"
        );
        assert_eq!(
            super::redact("redis+unix:///tmp/s?db=1&pass=pw"),
            "redis+unix:///tmp/s?db=1&pass=***"
        );
        assert_eq!(super::redact("etcd://h:1?p@x=1"), "etcd://h:1?p@x=1");
    }

    #[test]
    fn a_password_goes_where_each_url_takes_it() {
        use super::with_password;
        assert_eq!(
            with_password(
                "postgres://app@db:5432/x?sslmode=require",
                Some("p@ss w/rd")
            ),
            "postgres://app:p%40ss%20w%2Frd@db:5432/x?sslmode=require"
        );
        assert_eq!(
            with_password("redis://:old@h:6379/0", Some("new")),
            "redis://:new@h:6379/0"
        );
        assert_eq!(with_password("redis://h", Some("pw")), "redis://:pw@h");
        assert_eq!(
            with_password("etcds://root@a:1,b:2?tls_ca=/ca.pem", Some("s")),
            "etcds://root:s@a:1,b:2?tls_ca=/ca.pem"
        );
        assert_eq!(
            with_password("redis+unix:///run/r.sock?db=1", Some("pw")),
            "redis+unix:///run/r.sock?db=1&pass=pw"
        );
        assert_eq!(with_password("redis://h", None), "redis://h");
        // What our own parser reads back.
        let url = with_password("etcd://root@h:1", Some("a+b%c:d@e"));
        let (tls, rest) = split_scheme(&url, "etcd", "etcds").unwrap();
        assert!(!tls);
        let parsed = MultiHostUrl::parse(rest).unwrap();
        assert_eq!(parsed.credentials(), ("root".into(), "a+b%c:d@e".into()));
    }

    use super::*;

    #[test]
    fn urls_cut_into_their_parts() {
        let (tls, rest) =
            split_scheme("etcds://u:p%40ss@a:1,b:2/x?k=v&n=1", "etcd", "etcds").unwrap();
        assert!(tls);
        let mut u = MultiHostUrl::parse(rest).unwrap();
        assert_eq!(u.hosts, ["a:1", "b:2"]);
        assert_eq!(u.path, "/x");
        assert_eq!(u.credentials(), ("u".to_owned(), "p@ss".to_owned()));
        assert_eq!(u.take("k").as_deref(), Some("v"));
        assert_eq!(u.take("k"), None);
        assert_eq!(u.rest_query(), "?n=1");
        assert!(split_scheme("http://a", "etcd", "etcds").is_err());
        assert!(MultiHostUrl::parse("a:1,,b:2").is_err());
    }
}
