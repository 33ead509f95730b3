//! The core's errors as the package's exceptions (defined in Python, `distlock/_errors.py`,
//! so that each can also be the built-in it resembles: `LockTimeoutError` is a `TimeoutError`,
//! `ConfigurationError` a `ValueError`).

use std::time::Duration;

use distlock::{ErrorKind, LockError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The name of the exception class for an error kind.
fn class_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Busy => "LockBusyError",
        ErrorKind::Timeout => "LockTimeoutError",
        ErrorKind::Lost => "LockLostError",
        ErrorKind::QuorumNotReached { .. } => "QuorumError",
        ErrorKind::Connection => "EngineConnectionError",
        ErrorKind::Auth => "AuthenticationError",
        ErrorKind::Config => "ConfigurationError",
        ErrorKind::InvalidKey => "InvalidKeyError",
        ErrorKind::Protocol => "ProtocolError",
        ErrorKind::Unsupported => "UnsupportedError",
        ErrorKind::Io => "EngineIOError",
        ErrorKind::Exhausted => "ExhaustedError",
        ErrorKind::KindConflict => "KindConflictError",
        _ => "LockError",
    }
}

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The exception class `name` of `distlock._errors`.
pub(crate) fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let module = ERRORS.get_or_try_init(py, || py.import("distlock._errors").map(Bound::unbind))?;
    Ok(module.bind(py).getattr(name)?.cast_into::<PyType>()?)
}

/// `e` as the exception of its kind, its message the core's whole chain of causes.
pub(crate) fn to_py(e: LockError) -> PyErr {
    Python::attach(|py| {
        let message = distlock::tools::error_chain(&e);
        match class(py, class_name(e.kind())) {
            Ok(class) => PyErr::from_type(class, message),
            Err(import) => import,
        }
    })
}

/// An error of the package itself (not the core's): the exception class `name`, `message`.
pub(crate) fn new(name: &str, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| match class(py, name) {
        Ok(class) => PyErr::from_type(class, message),
        Err(import) => import,
    })
}

/// `secs` seconds as a duration; a negative, NaN or infinite number is a `ConfigurationError`.
pub(crate) fn seconds(what: &str, secs: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(secs).map_err(|_| {
        new(
            "ConfigurationError",
            format!("{what} must be a finite number of seconds, at least 0 (got {secs})"),
        )
    })
}

/// An error made on a runtime thread, turned into its exception only on a Python thread
/// ([`Failure::raise`], or `?` into a `PyErr`): a runtime thread never waits for the GIL.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The core's.
    Core(LockError),
    /// The package's own: the exception class's name and the message.
    Pkg(&'static str, String),
    /// A release found the lease of the lock `0` lost, for the reason named `1`.
    Lost(String, &'static str),
}

impl Failure {
    /// The package's own error `class`, `message`.
    pub(crate) fn pkg(class: &'static str, message: impl Into<String>) -> Self {
        Failure::Pkg(class, message.into())
    }

    /// The exception (on a Python thread).
    pub(crate) fn raise(self) -> PyErr {
        match self {
            Failure::Core(e) => to_py(e),
            Failure::Pkg(class, message) => new(class, message),
            // Made by the same function as a blocking release's (`_common.lost_error`).
            Failure::Lost(name, reason) => Python::attach(|py| {
                match py
                    .import("distlock._common")
                    .and_then(|m| m.getattr("lost_error"))
                    .and_then(|f| f.call1((name, reason)))
                {
                    Ok(e) => PyErr::from_value(e),
                    Err(e) => e,
                }
            }),
        }
    }
}

impl From<LockError> for Failure {
    fn from(e: LockError) -> Self {
        Failure::Core(e)
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> Self {
        f.raise()
    }
}

/// The outcome of a future run on the runtime.
pub(crate) type Fallible<T> = Result<T, Failure>;

/// Whether an acquire or campaign that failed with `e` only found the lock busy: at once for a
/// try, or for the whole of its wait (`waited` of `wait`). Anything else (an engine that did
/// not answer in time, a wait forever ended by an engine's failure) is an error to raise:
/// `threading.Lock.acquire()` never returns `False` for it.
pub(crate) fn only_busy(e: &LockError, wait: Option<Duration>, waited: Duration) -> bool {
    match (e.kind(), wait) {
        (ErrorKind::Busy, Some(_)) => true,
        (ErrorKind::Timeout, Some(d)) if !d.is_zero() => waited + Duration::from_millis(1) >= d,
        _ => false,
    }
}
