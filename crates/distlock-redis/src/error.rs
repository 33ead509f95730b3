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
    let mut shown = format!("{got:?}");
    if shown.len() > 300 {
        let mut end = 300;
        while !shown.is_char_boundary(end) {
            end -= 1;
        }
        shown.truncate(end);
        shown.push('…');
    }
    LockError::new(
        ErrorKind::Protocol,
        format!("{doing}: unexpected reply {shown}"),
    )
}
