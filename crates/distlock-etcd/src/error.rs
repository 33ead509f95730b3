//! Turning gRPC statuses into distlock's `LockError`, in one readable line and without leaking
//! tonic's types.

use std::error::Error as _;

use distlock_core::{ErrorKind, LockError};
use tonic::{Code, Status};

/// The innermost cause of a status that is an I/O error ("Connection refused (os error 111)"),
/// if any: what a user needs to read, without tonic's and hyper's wrappers around it.
fn io_cause(s: &Status) -> Option<&std::io::Error> {
    let mut cause = s.source();
    let mut found = None;
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            found = Some(io);
        }
        cause = c.source();
    }
    found
}

/// Whether the connection under the request broke or could not be opened.
fn transport_failed(s: &Status) -> bool {
    io_cause(s).is_some()
        || s.message().contains("transport error")
        || s.message().contains("connect error")
        || s.message().contains("connection")
}

/// The status in words: its message, or, for a broken connection, the I/O error under it.
fn describe(s: &Status) -> String {
    if let Some(io) = io_cause(s) {
        return io.to_string();
    }
    let msg = s.message().trim();
    let msg = msg.strip_prefix("etcdserver: ").unwrap_or(msg);
    if msg.is_empty() {
        format!("{:?}", s.code())
    } else {
        msg.to_owned()
    }
}

pub(crate) fn map_err(s: Status, doing: &str) -> LockError {
    // A certificate refused, ours or the member's.
    #[cfg(feature = "tls")]
    if let Some((kind, words)) = distlock_tls::classify(&s) {
        return LockError::new(kind, format!("{doing}: {words}"));
    }
    let kind = match s.code() {
        Code::DeadlineExceeded => ErrorKind::Timeout,
        Code::Unauthenticated | Code::PermissionDenied => ErrorKind::Auth,
        // etcd answers a wrong password, or none where auth is on, with InvalidArgument.
        Code::InvalidArgument
            if s.message().contains("authentication failed")
                || s.message().contains("user name is empty") =>
        {
            ErrorKind::Auth
        }
        Code::Unavailable | Code::Aborted | Code::Cancelled | Code::ResourceExhausted => {
            ErrorKind::Connection
        }
        // tonic's own refusal of a reply over its size limit (a length prefix of up to 4 GiB
        // from a wrong server) is the server's fault, not the key's.
        Code::OutOfRange if s.message().contains("decoded message length too large") => {
            ErrorKind::Protocol
        }
        Code::InvalidArgument | Code::OutOfRange => ErrorKind::InvalidKey,
        // A connection that broke under the request.
        Code::Unknown if transport_failed(&s) => ErrorKind::Connection,
        _ => ErrorKind::Protocol,
    };
    let e = LockError::new(kind, format!("{doing}: {}", describe(&s)));
    // The I/O error under a broken connection is the cause worth keeping (a copy: the status
    // owns it). tonic's own wrappers would only repeat it.
    match io_cause(&s) {
        Some(io) => e.with_source(std::io::Error::new(io.kind(), io.to_string())),
        None => e,
    }
}

/// Whether the server said the lease does not exist (it expired, or was revoked).
pub(crate) fn lease_missing(s: &Status) -> bool {
    s.code() == Code::NotFound && s.message().contains("lease")
}

/// Whether the request was not carried out: its connection could not be opened (a dead
/// member), or the member refused it for having no leader (the `hasleader` check, made before
/// the request runs). Any request can be sent again then.
pub(crate) fn never_sent(s: &Status) -> bool {
    s.code() == Code::Unavailable
        && (s.message().contains("connect error")
            || s.message().contains("no leader")
            || io_cause(s).is_some_and(|io| {
                matches!(
                    io.kind(),
                    std::io::ErrorKind::ConnectionRefused
                        | std::io::ErrorKind::AddrNotAvailable
                        | std::io::ErrorKind::HostUnreachable
                        | std::io::ErrorKind::NetworkUnreachable
                )
            }))
}

/// Whether the member stopped answering or cannot serve (a timeout, a broken connection, no
/// leader on its side of a partition): the next request should go to another member. The
/// request may have taken effect.
pub(crate) fn member_failed(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::DeadlineExceeded | Code::Unavailable | Code::Cancelled
    ) || (s.code() == Code::Unknown && transport_failed(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_kinds_in_one_line() {
        let refused = Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused (os error 111)",
        )));
        let e = map_err(refused, "connecting to etcd at http://127.0.0.1:1");
        assert_eq!(e.kind(), ErrorKind::Connection);
        assert_eq!(
            e.message(),
            "connecting to etcd at http://127.0.0.1:1: Connection refused (os error 111)"
        );
        let auth = Status::invalid_argument(
            "etcdserver: authentication failed, invalid user ID or password",
        );
        assert_eq!(map_err(auth, "x").kind(), ErrorKind::Auth);
        assert!(lease_missing(&Status::not_found(
            "etcdserver: requested lease not found"
        )));
        assert!(never_sent(&Status::unavailable("etcdserver: no leader")));
        assert!(member_failed(&Status::deadline_exceeded("slow")));
        assert!(!member_failed(&Status::not_found("x")));
    }
}
