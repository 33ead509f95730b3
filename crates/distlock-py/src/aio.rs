//! Rust futures as asyncio futures: each call's future runs on the package's runtime, and its
//! outcome is handed to the caller's event loop (`call_soon_threadsafe`). Cancelling the asyncio
//! future aborts the Rust one at its next await, which the core's calls allow (a cancelled
//! acquire leaves no lock, queue place or subscription behind).

use std::future::Future;

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::runtime::runtime;

static SETTLE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `distlock._aio._settle`: sets an asyncio future's result or exception unless it is done
/// (cancelled) already.
fn settle(py: Python<'_>) -> PyResult<&Py<PyAny>> {
    SETTLE.get_or_try_init(py, || {
        Ok(py.import("distlock._aio")?.getattr("_settle")?.unbind())
    })
}

/// Aborts the Rust future of an asyncio future that was cancelled (its done callback).
#[pyclass(module = "distlock._native", frozen)]
struct Abort(tokio::task::AbortHandle);

#[pymethods]
impl Abort {
    fn __call__(&self, fut: &Bound<'_, PyAny>) -> PyResult<()> {
        if fut.call_method0("cancelled")?.is_truthy()? {
            self.0.abort();
        }
        Ok(())
    }
}

/// An asyncio future of `event_loop` that gets `fut`'s outcome.
pub(crate) fn spawn<'py, F, T>(
    py: Python<'py>,
    event_loop: &Bound<'py, PyAny>,
    fut: F,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let py_fut = event_loop.call_method0("create_future")?;
    let settle = settle(py)?.clone_ref(py);
    let (target, on) = (py_fut.clone().unbind(), event_loop.clone().unbind());
    let task = runtime()?.spawn(async move {
        let out = fut.await;
        // The GIL is waited for on the blocking pool, not on a worker that renews leases.
        let _ = tokio::task::spawn_blocking(move || {
            Python::try_attach(|py| {
                let (exc, value) = match out {
                    Ok(v) => match v.into_bound_py_any(py) {
                        Ok(v) => (py.None(), v.unbind()),
                        Err(e) => (e.into_value(py).into_any(), py.None()),
                    },
                    Err(e) => (e.into_value(py).into_any(), py.None()),
                };
                // A closed loop cannot be told: its caller is gone, and so is the result
                // (a guard dropped here releases its lock).
                let _ = on.call_method1(py, "call_soon_threadsafe", (settle, target, exc, value));
            })
        })
        .await;
    });
    py_fut.call_method1("add_done_callback", (Abort(task.abort_handle()),))?;
    Ok(py_fut)
}
