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
                Code::Unavailable | Code::Aborted | Code::Cancelled | Code::ResourceExhausted => {
                    ErrorKind::Connection
                }
                Code::InvalidArgument | Code::OutOfRange => ErrorKind::InvalidKey,
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

/// Whether the request never reached a member: its connection could not be opened (a dead
/// member that the client's balancer picked). Any request can be sent again then.
pub(crate) fn never_sent(e: &Error) -> bool {
    match e {
        Error::GRpcStatus(s) => {
            s.code() == tonic::Code::Unavailable && s.message().contains("connect error")
        }
        Error::TransportError(_) => true,
        _ => false,
    }
}
