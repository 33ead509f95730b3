//! The one error type of distlock.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;

/// A boxed error from a lower layer (a driver, the OS), kept as the `source()` of a [`LockError`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What went wrong, coarsely, so callers can decide what to do.
///
/// This enum is `#[non_exhaustive]`: engines added later may add kinds.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The lock is held by someone else and the caller asked not to wait.
    Busy,
    /// A deadline passed: the wait timeout, or a request to the engine that did not answer in time.
    Timeout,
    /// The lease is no longer ours (it expired, was taken over, or we could not renew it in time).
    Lost,
    /// A quorum-based engine did not get enough votes.
    QuorumNotReached {
        /// Nodes that said yes.
        got: usize,
        /// Nodes needed for a quorum.
        needed: usize,
    },
    /// The engine could not be reached or the connection broke.
    Connection,
    /// The engine refused our credentials.
    Auth,
    /// A configuration mistake: a malformed URL, an invalid option.
    Config,
    /// The lock key is not acceptable (empty, too long).
    InvalidKey,
    /// The engine answered something we did not expect (for example a key holding a hash where a
    /// lock string belongs).
    Protocol,
    /// The engine cannot do what was asked.
    Unsupported,
    /// A local I/O error (the file engine).
    Io,
    /// A limit was reached: every session of the engine's pool is in use for this request
    /// (raise `sessions=` in the URL), the server's lock table is full, or every connection
    /// the server allows is taken (PostgreSQL's and MySQL's `max_connections`).
    Exhausted,
    /// The name is in use as another kind of lock: a semaphore asked for as a lock, or a
    /// semaphore opened with another number of permits than its current holders'. Nothing was
    /// taken.
    KindConflict,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Busy => f.write_str("lock is busy"),
            ErrorKind::Timeout => f.write_str("timed out"),
            ErrorKind::Lost => f.write_str("lock lost"),
            ErrorKind::QuorumNotReached { got, needed } => {
                write!(f, "quorum not reached ({got} of {needed} needed)")
            }
            ErrorKind::Connection => f.write_str("connection error"),
            ErrorKind::Auth => f.write_str("authentication failed"),
            ErrorKind::Config => f.write_str("invalid configuration"),
            ErrorKind::InvalidKey => f.write_str("invalid lock key"),
            ErrorKind::Protocol => f.write_str("unexpected reply from the lock engine"),
            ErrorKind::Unsupported => f.write_str("not supported by this engine"),
            ErrorKind::Io => f.write_str("I/O error"),
            ErrorKind::Exhausted => f.write_str("a limit was reached"),
            ErrorKind::KindConflict => f.write_str("the name is in use as another kind of lock"),
        }
    }
}

/// The error of every distlock operation.
///
/// It is opaque: match on [`LockError::kind`], ask [`LockError::is_retryable`], and follow
/// [`std::error::Error::source`] for the driver's own error. No dependency's type appears in it.
///
/// One pointer wide (its parts are boxed): a `Result<T, LockError>` is hardly larger than `T`,
/// which matters where results are kept by the thousand (a renewal batch has one a lease).
pub struct LockError {
    inner: Box<ErrorParts>,
}

struct ErrorParts {
    kind: ErrorKind,
    message: Cow<'static, str>,
    source: Option<BoxError>,
}

impl LockError {
    /// A new error of `kind` with a human-readable message.
    pub fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        LockError {
            inner: Box::new(ErrorParts {
                kind,
                message: message.into(),
                source: None,
            }),
        }
    }

    /// An error of `kind` whose message is `doing`, then what `cause` and each error under it
    /// say (see [`error_chain`]), with `cause` kept as the `source()`. An engine builds its
    /// errors this way, so that the message carries the server's own words (a driver's
    /// `Display` often stops at "db error" and leaves them to its source).
    pub fn caused_by<E>(kind: ErrorKind, doing: impl fmt::Display, cause: E) -> Self
    where
        E: StdError + Send + Sync + 'static,
    {
        LockError::new(kind, format!("{doing}: {}", error_chain(&cause))).with_source(cause)
    }

    /// Attaches the lower-level cause, returned by `source()`.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.inner.source = Some(source.into());
        self
    }

    /// The coarse kind of this error.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// The message, without the kind or the source.
    pub fn message(&self) -> &str {
        &self.inner.message
    }

    /// Whether the same call may succeed if tried again later (busy, timeouts, broken
    /// connections, a missed quorum). Configuration, authentication, protocol errors and a lost
    /// lease are not retryable.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.inner.kind,
            ErrorKind::Busy
                | ErrorKind::Exhausted
                | ErrorKind::Timeout
                | ErrorKind::Connection
                | ErrorKind::QuorumNotReached { .. }
        )
    }

    /// Whether a request may have reached the engine and taken effect although we got no answer.
    /// An acquire that ends in such an error is retried with the same token, and cleaned up if
    /// it is given up.
    pub fn is_ambiguous(&self) -> bool {
        matches!(self.inner.kind, ErrorKind::Timeout | ErrorKind::Connection)
    }

    /// `cause` with `doing` before its words: the same kind, the message `doing: <what cause
    /// and the errors under it say>` with the kind named once, and `cause` kept as the
    /// `source()`. For an operation that gives up after a cause (a wait's last attempt).
    ///
    /// ```
    /// use distlock_core::{ErrorKind, LockError, error_chain};
    ///
    /// let refused = LockError::new(ErrorKind::Connection, "connecting to 127.0.0.1:1")
    ///     .with_source(std::io::Error::other("connection refused"));
    /// let e = LockError::after("tried for 2s (3 attempts); the last one failed", refused);
    /// assert_eq!(e.kind(), ErrorKind::Connection);
    /// assert_eq!(
    ///     error_chain(&e),
    ///     "connection error: tried for 2s (3 attempts); the last one failed: \
    ///      connecting to 127.0.0.1:1: connection refused"
    /// );
    /// ```
    pub fn after(doing: impl fmt::Display, cause: LockError) -> Self {
        let chain = error_chain(&cause);
        let kind = cause.inner.kind.to_string();
        let words = chain
            .strip_prefix(kind.as_str())
            .and_then(|rest| rest.strip_prefix(": "))
            .unwrap_or(&chain);
        let message = format!("{doing}: {words}");
        LockError::new(cause.inner.kind, message).with_source(cause)
    }

    pub(crate) fn busy(key: &str) -> Self {
        LockError::new(
            ErrorKind::Busy,
            format!("lock {key:?} is held by another owner"),
        )
    }
}

impl fmt::Debug for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("LockError");
        d.field("kind", &self.inner.kind)
            .field("message", &self.inner.message);
        if let Some(s) = &self.inner.source {
            d.field("source", s);
        }
        d.finish()
    }
}

/// `err`'s text, then that of each error under it (its `source()` chain) that the text so far
/// does not already contain, on one line: everything a person needs to read, once.
///
/// ```
/// use distlock_core::{ErrorKind, LockError, error_chain};
///
/// let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "permission denied");
/// let e = LockError::new(ErrorKind::Io, "opening /locks/a").with_source(io);
/// assert_eq!(error_chain(&e), "I/O error: opening /locks/a: permission denied");
/// ```
pub fn error_chain(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    // The kind last named: a `LockError` under one of the same kind adds only its message
    // (the kind is said once).
    let mut kind = err.downcast_ref::<LockError>().map(LockError::kind);
    let mut cause = err.source();
    while let Some(c) = cause {
        let more = match c.downcast_ref::<LockError>() {
            Some(e) if Some(e.inner.kind) == kind && !e.inner.message.is_empty() => {
                e.inner.message.to_string()
            }
            Some(e) => {
                kind = Some(e.inner.kind);
                e.to_string()
            }
            None => c.to_string(),
        };
        if !more.is_empty() && !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    // A server's message can have lines (PostgreSQL's DETAIL and HINT).
    text.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.inner.message.is_empty() {
            write!(f, "{}", self.inner.kind)
        } else {
            write!(f, "{}: {}", self.inner.kind, self.inner.message)
        }
    }
}

impl StdError for LockError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner
            .source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_chains_and_display_is_readable() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = LockError::new(ErrorKind::Connection, "cannot reach 127.0.0.1:1").with_source(io);
        assert_eq!(e.to_string(), "connection error: cannot reach 127.0.0.1:1");
        assert_eq!(
            e.source().map(|s| s.to_string()).as_deref(),
            Some("refused")
        );
        assert!(e.is_retryable());
        assert!(e.is_ambiguous());
        let q = LockError::new(ErrorKind::QuorumNotReached { got: 2, needed: 3 }, "");
        assert_eq!(q.to_string(), "quorum not reached (2 of 3 needed)");
        assert!(!LockError::new(ErrorKind::Auth, "x").is_retryable());
        assert!(!LockError::new(ErrorKind::Lost, "x").is_retryable());
    }

    #[test]
    fn an_error_is_one_pointer_and_a_result_of_a_check_two_words() {
        use crate::engine::LeaseCheck;
        assert_eq!(std::mem::size_of::<LockError>(), 8);
        assert_eq!(std::mem::size_of::<Result<LeaseCheck, LockError>>(), 16);
    }

    /// A driver error whose `Display` leaves the server's words to its source.
    #[derive(Debug)]
    struct Driver(std::io::Error);

    impl fmt::Display for Driver {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("db error")
        }
    }

    impl StdError for Driver {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn the_message_carries_the_words_under_a_terse_driver_error() {
        let server = std::io::Error::other("FATAL: sorry, too many clients already\nHINT: wait");
        let e = LockError::caused_by(ErrorKind::Connection, "connecting", Driver(server));
        assert_eq!(
            e.to_string(),
            "connection error: connecting: db error: FATAL: sorry, too many clients already HINT: wait"
        );
        assert!(e.source().is_some(), "the driver error is kept");
        // Nothing is said twice when a message already quotes its cause.
        let io = std::io::Error::other("refused");
        let quoted = LockError::new(ErrorKind::Connection, "dialing: refused").with_source(io);
        assert_eq!(error_chain(&quoted), "connection error: dialing: refused");
    }
}
