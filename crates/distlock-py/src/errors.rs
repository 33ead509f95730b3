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
