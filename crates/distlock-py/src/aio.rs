//! Rust futures as asyncio futures. Each call's future runs on the package's runtime; its
//! outcome, still a Rust value, goes into its event loop's [`LoopBridge`], whose socket wakes
//! the loop; the loop's own thread then turns it into Python objects and settles the asyncio
//! future. No runtime thread ever waits for the GIL (a renewal never stalls behind Python),
//! and no third thread is woken. Cancelling the asyncio future aborts the Rust one at its next
//! await, which the core's calls allow (a cancelled acquire leaves no lock, queue place or
//! subscription behind).

use std::future::Future;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyWeakrefReference;

use crate::errors::{Failure, Fallible};
use crate::runtime::runtime;

/// An outcome waiting for its loop: made into Python objects there, with the GIL.
type Outcome = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// The outcomes of one event loop's calls, and the socket pair that wakes it (its reading end
/// is registered with `loop.add_reader`, see `distlock/_aio.py`). It holds each asyncio future
/// by a weak reference: nothing here keeps a loop alive, and an outcome nobody waits for any
/// more is dropped (a guard in it releases its lock in the background).
#[pyclass(module = "distlock._native", frozen)]
pub(crate) struct LoopBridge {
    done: Mutex<Vec<(Py<PyAny>, Outcome)>>,
    wake: UnixStream,
    woken: UnixStream,
}

impl LoopBridge {
    /// Hands `fut` its outcome (from a runtime thread): one byte on the socket when the list
    /// was empty (the loop drains the whole list at once).
    fn push(&self, fut: Py<PyAny>, out: Outcome) {
        let first = {
            let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
            done.push((fut, out));
            done.len() == 1
        };
        if first {
            // Full (WouldBlock) means a wake-up is pending already.
            let _ = (&self.wake).write(&[1]);
        }
    }
}

#[pymethods]
impl LoopBridge {
    #[new]
    fn new() -> PyResult<Self> {
        let (wake, woken) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        woken.set_nonblocking(true)?;
        Ok(LoopBridge {
            done: Mutex::new(Vec::new()),
            wake,
            woken,
        })
    }

    /// The descriptor the loop watches.
    fn fileno(&self) -> i32 {
        self.woken.as_raw_fd()
    }

    /// Settles every future whose outcome came (the loop's reader callback). A future
    /// cancelled meanwhile is left as it is, and its outcome dropped (a guard in it releases
    /// its lock in the background).
    fn drain(&self, py: Python<'_>) -> PyResult<()> {
        let mut sink = [0u8; 256];
        loop {
            match (&self.woken).read(&mut sink) {
                Ok(n) if n == sink.len() => continue,
                Ok(_) => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let done = std::mem::take(&mut *self.done.lock().unwrap_or_else(|e| e.into_inner()));
        for (weak, out) in done {
            // Each on its own: one future's failure must not strand the others.
            if let Err(e) = settle(py, weak.bind(py), out) {
                e.write_unraisable(py, None);
            }
        }
        Ok(())
    }

    /// Drops every outcome not handed over yet (its loop is closed: nobody will).
    fn discard(&self) {
        let done = std::mem::take(&mut *self.done.lock().unwrap_or_else(|e| e.into_inner()));
        drop(done);
    }
}

/// Gives the future behind `weak` its outcome, unless it is gone or done (cancelled).
fn settle(py: Python<'_>, weak: &Bound<'_, PyAny>, out: Outcome) -> PyResult<()> {
    let fut = weak.call0()?;
    if fut.is_none() || fut.call_method0("done")?.is_truthy()? {
        return Ok(());
    }
    match out(py) {
        Ok(value) => fut.call_method1("set_result", (value,))?,
        Err(e) => fut.call_method1("set_exception", (e.into_value(py),))?,
    };
    Ok(())
}

static BRIDGE_OF: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `event_loop`'s bridge (`distlock._aio.bridge_of`: one per loop and process).
fn bridge_of<'py>(event_loop: &Bound<'py, PyAny>) -> PyResult<Bound<'py, LoopBridge>> {
    let py = event_loop.py();
    let f = BRIDGE_OF.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("distlock._aio")?.getattr("bridge_of")?.unbind())
    })?;
    Ok(f.bind(py).call1((event_loop,))?.cast_into::<LoopBridge>()?)
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
    event_loop: &Bound<'py, PyAny>,
    fut: F,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Fallible<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let bridge = bridge_of(event_loop)?.unbind();
    let py_fut = event_loop.call_method0("create_future")?;
    let target = PyWeakrefReference::new(&py_fut)?.into_any().unbind();
    let task = runtime()?.spawn(async move {
        let out = fut.await;
        // The exception too is made on the loop's thread.
        let out: Outcome = Box::new(move |py| out.map_err(Failure::raise)?.into_py_any(py));
        bridge.get().push(target, out);
    });
    py_fut.call_method1("add_done_callback", (Abort(task.abort_handle()),))?;
    Ok(py_fut)
}
