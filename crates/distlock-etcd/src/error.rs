//! Turning etcd-client errors into distlock's `LockError`, without leaking its types.

use distlock_core::{ErrorKind, LockError};
use etcd_client::Error;

pub(crate) fn map_err(e: Error, doing: &str) -> LockError {
    let kind = match &e {
        Error::GRpcStatus(s) => {
            use tonic::Code;
            match s.code() {
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
                Code::InvalidArgument | Code::OutOfRange => ErrorKind::InvalidKey,
                // A connection that broke under the request (tonic's "transport error").
                Code::Unknown if s.message().contains("transport error") => ErrorKind::Connection,
                _ => ErrorKind::Protocol,
            }
        }
        Error::TransportError(_) | Error::IoError(_) | Error::EndpointError(_) => {
            ErrorKind::Connection
        }
        Error::InvalidArgs(_) | Error::InvalidUri(_) => ErrorKind::Config,
        Error::LeaseKeepAliveError(_) | Error::WatchError(_) => ErrorKind::Connection,
        _ => ErrorKind::Protocol,
    };
    LockError::new(kind, format!("{doing}: {e}")).with_source(e)
}

/// Whether the server said the lease does not exist (it expired, or was revoked).
pub(crate) fn lease_missing(e: &Error) -> bool {
    matches!(e, Error::GRpcStatus(s)
        if s.code() == tonic::Code::NotFound && s.message().contains("lease"))
}

/// Whether the request was not carried out: its connection could not be opened (a dead
/// member), or the member refused it for having no leader (the `hasleader` check, made before
/// the request runs). Any request can be sent again then.
pub(crate) fn never_sent(e: &Error) -> bool {
    match e {
        Error::GRpcStatus(s) => {
            s.code() == tonic::Code::Unavailable
                && (s.message().contains("connect error")
                    || s.message().contains("etcdserver: no leader"))
        }
        Error::TransportError(_) => true,
        _ => false,
    }
}

/// Whether the member stopped answering or cannot serve (a timeout, a broken connection, no
/// leader on its side of a partition): the next request should go to another member. The
/// request may have taken effect.
pub(crate) fn member_failed(e: &Error) -> bool {
    match e {
        Error::GRpcStatus(s) => {
            matches!(
                s.code(),
                tonic::Code::DeadlineExceeded | tonic::Code::Unavailable | tonic::Code::Cancelled
            ) || (s.code() == tonic::Code::Unknown && s.message().contains("transport error"))
        }
        Error::TransportError(_) | Error::IoError(_) => true,
        _ => false,
    }
}
