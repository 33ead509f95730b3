//! Turning redis-rs errors into distlock's `LockError`, without leaking redis-rs types.

use distlock_core::{ErrorKind, LockError};
use redis::RedisError;

pub(crate) fn map_err(e: RedisError, doing: &str) -> LockError {
    // A certificate refused, ours or the server's.
    #[cfg(feature = "tls")]
    if let Some((kind, words)) = distlock_tls::classify(&e)
        .or_else(|| distlock_tls::classify_text(&distlock_core::error_chain(&e)))
    {
        return LockError::new(kind, format!("{doing}: {words}")).with_source(e);
    }
    let code = e.code().unwrap_or("");
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(code, "WRONGPASS" | "NOAUTH" | "NOPERM")
    {
        ErrorKind::Auth
    } else if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || matches!(
            code,
            "LOADING" | "READONLY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN"
        )
    {
        ErrorKind::Connection
    } else if e.kind() == redis::ErrorKind::InvalidClientConfig {
        ErrorKind::Config
    } else {
        ErrorKind::Protocol
    };
    let message = match (kind, code) {
        (ErrorKind::Protocol, "WRONGTYPE") => {
            format!("{doing}: the key holds a value of another type than a distlock lock")
        }
        _ => format!("{doing}: {}", distlock_core::error_chain(&e)),
    };
    LockError::new(kind, message).with_source(e)
}

pub(crate) fn protocol(doing: &str, got: &redis::Value) -> LockError {
    unexpected(doing, got)
}

/// A reply that is well formed but not one the request allows (shown up to 300 bytes: a
/// server's reply may be long).
pub(crate) fn unexpected(doing: &str, got: impl std::fmt::Debug) -> LockError {
    /// Keeps the first [`SHOWN`] bytes written to it and stops the formatting after them: a
    /// reply of megabytes is not formatted whole to show its start.
    struct Bounded(String);
    const SHOWN: usize = 300;
    impl std::fmt::Write for Bounded {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let room = SHOWN.saturating_sub(self.0.len());
            if s.len() <= room {
                self.0.push_str(s);
                return Ok(());
            }
            let mut end = room;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            self.0.push_str(&s[..end]);
            // An error ends the formatting here (the text so far is kept).
            Err(std::fmt::Error)
        }
    }
    let mut out = Bounded(String::new());
    let shown = match std::fmt::write(&mut out, format_args!("{got:?}")) {
        Ok(()) => out.0,
        Err(_) => out.0 + "…",
    };
    LockError::new(
        ErrorKind::Protocol,
        format!("{doing}: unexpected reply {shown}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unexpected_reply_is_shown_up_to_300_bytes_without_formatting_it_whole() {
        /// A value whose formatting never ends unless the writer stops it.
        struct Endless;
        impl std::fmt::Debug for Endless {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                loop {
                    f.write_str("é0123456789")?;
                }
            }
        }
        let e = unexpected("taking x", Endless);
        let text = e.to_string();
        // The reply is the last part of the message: what comes after its last mention.
        let shown = text
            .rsplit("unexpected reply ")
            .next()
            .and_then(|t| t.split('…').next())
            .expect("the reply");
        assert!(text.contains('…'), "{text}");
        assert!(shown.len() <= 300, "{}", shown.len());
        assert_eq!(e.kind(), ErrorKind::Protocol);
        let short = unexpected("taking x", redis::Value::Int(7)).to_string();
        assert!(
            short.to_lowercase().ends_with("unexpected reply int(7)"),
            "{short}"
        );
    }
}
