//! What a driver error means: the `LockError` it becomes, whether it leaves the connection
//! unusable, and why the session ended when it did.

use distlock_core::engine::{ErrorKind, LockError, LostReason};
use tokio::time::Instant;

pub(super) fn map_err(e: mysql_async::Error, doing: &str) -> LockError {
    // A certificate refused, ours or the server's.
    #[cfg(feature = "tls")]
    if let Some((kind, words)) = distlock_tls::classify(&e) {
        return LockError::new(kind, format!("{doing}: {words}"));
    }
    let kind = match &e {
        mysql_async::Error::Server(s) => match s.code {
            // Access denied (user, database, command, table); 3159: clear text where the
            // server requires secure transport.
            1044 | 1045 | 1095 | 1142 | 1227 | 1698 | 3159 => ErrorKind::Auth,
            1049 => ErrorKind::Config,
            // Too many connections (the server's max_connections, or the account's
            // max_user_connections): nothing was opened; a wait tries again.
            1040 | 1203 => ErrorKind::Exhausted,
            _ => ErrorKind::Protocol,
        },
        mysql_async::Error::Io(_) => ErrorKind::Connection,
        mysql_async::Error::Url(_) => ErrorKind::Config,
        mysql_async::Error::Driver(_) | mysql_async::Error::Other(_) => ErrorKind::Connection,
    };
    // An I/O error reads "Input/output error: Input/output error: <cause>" in the driver's
    // words: say the cause once, and keep it (a copy) as the source.
    if let mysql_async::Error::Io(_) = &e
        && let Some(io) = innermost_io(&e)
    {
        let cause = std::io::Error::new(io.kind(), io.to_string());
        return LockError::new(kind, format!("{doing}: {io}")).with_source(cause);
    }
    LockError::caused_by(kind, doing, e)
}

/// The last `std::io::Error` in an error's chain of causes.
fn innermost_io<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a std::io::Error> {
    let mut found = None;
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            found = Some(io);
        }
        cause = c.source();
    }
    found
}

/// Why a session ended, from the error its statement failed with; `until` is when its
/// `wait_timeout` would have run out.
pub(super) fn why_ended(e: &mysql_async::Error, until: Option<Instant>) -> LostReason {
    match e {
        // ER_CONNECTION_KILLED, ER_SERVER_SHUTDOWN: somebody took the locks away.
        mysql_async::Error::Server(s) if s.code == 1927 || s.code == 1053 => LostReason::Stolen,
        // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8.0.24+): the wait_timeout ran out.
        mysql_async::Error::Server(s) if s.code == 4031 => LostReason::Expired,
        _ if until.is_some_and(|u| Instant::now() >= u) => LostReason::Expired,
        _ => LostReason::Unreachable,
    }
}

/// Whether the error leaves the connection unusable (as opposed to a statement the server
/// refused on a live session).
pub(super) fn breaks_connection(e: &mysql_async::Error) -> bool {
    match e {
        mysql_async::Error::Server(s) => matches!(s.code, 1927 | 1053 | 4031),
        _ => true,
    }
}
