//! The tokio runtime the package's calls run on: one per process, made again after `fork()`.
//!
//! A forked child has only the thread that called `fork()`: the parent's runtime threads, its
//! I/O driver and every connection's task are gone, and a mutex one of them held stays locked.
//! So nothing of the parent's is used or dropped in the child: its runtime (and, in the
//! client and guards, its `LockClient` and `LockGuard`s) is forgotten, and a new one is built
//! at the first call (gunicorn's preload, Celery's prefork, `multiprocessing`).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;

/// The runtime of the process that made it.
struct Owned {
    pid: u32,
    rt: Arc<tokio::runtime::Runtime>,
}

static RUNTIME: Mutex<Option<Owned>> = Mutex::new(None);

/// This process's id.
pub(crate) fn pid() -> u32 {
    std::process::id()
}

/// This process's runtime, built at the first call in it.
pub(crate) fn runtime() -> PyResult<Arc<tokio::runtime::Runtime>> {
    // A child forked while another thread held this mutex finds it poisoned or held: the
    // guard is only ever held for the few lines below, so a poisoned one is still consistent.
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    let me = pid();
    if let Some(owned) = slot.as_ref()
        && owned.pid == me
    {
        return Ok(owned.rt.clone());
    }
    if let Some(parents) = slot.take() {
        // The parent's: its threads do not exist here, and dropping it would wait for them.
        std::mem::forget(parents);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        // The watchdog, the engines' connections and the lost signals: one worker is plenty
        // for a Python process (its calls run their futures on the calling thread).
        .worker_threads(1)
        .thread_name("distlock")
        .enable_all()
        .build()
        .map_err(|e| {
            pyo3::exceptions::PyRuntimeError::new_err(format!(
                "cannot start distlock's runtime: {e}"
            ))
        })?;
    let rt = Arc::new(rt);
    *slot = Some(Owned {
        pid: me,
        rt: rt.clone(),
    });
    Ok(rt)
}

/// How often a blocking call looks for a signal (Ctrl-C raises `KeyboardInterrupt` within it).
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// Runs `fut` to its end on this process's runtime with the GIL released, looking for signals
/// every [`SIGNAL_CHECK`]: a signal's exception (`KeyboardInterrupt`) drops the future, which
/// leaves nothing taken (the core's calls are cancel-safe).
pub(crate) fn block_on<F, T>(py: Python<'_>, fut: F) -> PyResult<T>
where
    F: Future<Output = T> + Send,
    T: Send,
{
    let rt = runtime()?;
    let mut fut = std::pin::pin!(fut);
    loop {
        let step = py.detach(|| {
            // The timer is made inside the runtime, which it needs.
            rt.block_on(async { tokio::time::timeout(SIGNAL_CHECK, fut.as_mut()).await })
        });
        match step {
            Ok(out) => return Ok(out),
            Err(_elapsed) => py.check_signals()?,
        }
    }
}
