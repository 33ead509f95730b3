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
            format!("{text:?} is not a {plain}:// (or {tls}://) URL"),
        ))
    }
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

    /// Fails on parameters not taken (`engine` and `known` name them in the message).
    ///
    /// # Errors
    /// `Config` when any parameter is left.
    pub fn no_more_params(&self, engine: &str, known: &str) -> Result<(), LockError> {
        if self.query.is_empty() {
            return Ok(());
        }
        Err(LockError::new(
            ErrorKind::Config,
            format!(
                "unknown {engine} URL parameter(s) {:?} (known: {known})",
                self.rest_query()
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
        let decode = |s: &str| {
            url::form_urlencoded::parse(format!("x={s}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        };
        (decode(user), decode(password))
    }
}

/// A URL with the password of its `user:password@` (if any) replaced by `***`, for messages.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((cred, host)) if cred.contains(':') => {
            let user = cred.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(super::redact("mysql://u:pw@h/db"), "mysql://u:***@h/db");
        assert_eq!(super::redact("mysql://u@h/db"), "mysql://u@h/db");
        assert_eq!(super::redact("no url"), "no url");
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
