//! A held lease, for Python: the core's `LockGuard` and the process that took it.
//!
//! Only the process that took a lease may release it: in a forked child the guard reads as not
//! held, `release` raises, and dropping it forgets the parent's guard (the parent still holds
//! the lock, and the child has none of its runtime).

use distlock::{LeaseHandle, LockGuard, Released};
use pyo3::prelude::*;

use crate::runtime::{block_on, pid, runtime};
use crate::{aio, errors};

/// A lease taken by this process; `None` once released.
#[pyclass(module = "distlock._native", frozen)]
pub(crate) struct NativeGuard {
    pid: u32,
    handle: LeaseHandle,
    /// An async mutex: an `extend` holds it across its round trip, and a release waits for it.
    guard: tokio::sync::Mutex<Option<LockGuard>>,
}

impl NativeGuard {
    pub(crate) fn new(guard: LockGuard) -> Self {
        NativeGuard {
            pid: pid(),
            handle: guard.handle(),
            guard: tokio::sync::Mutex::new(Some(guard)),
        }
    }

    fn mine(&self) -> bool {
        self.pid == pid()
    }

    /// An error unless this process took the lease.
    fn check_mine(&self) -> PyResult<()> {
        if self.mine() {
            Ok(())
        } else {
            Err(errors::new(
                "LockNotOwnedError",
                "this lock was taken by the parent process before fork(): only it can release it",
            ))
        }
    }

    /// The guard, taken out for its release (after any `extend` in flight).
    async fn take(&self) -> PyResult<LockGuard> {
        self.guard
            .lock()
            .await
            .take()
            .ok_or_else(|| errors::new("LockNotOwnedError", "release of a lock already released"))
    }
}

/// The lost reason's short name, as Python sees it.
pub(crate) fn reason_name(reason: distlock::LostReason) -> &'static str {
    match reason {
        distlock::LostReason::Expired => "expired",
        distlock::LostReason::Stolen => "stolen",
        distlock::LostReason::Unreachable => "unreachable",
        _ => "lost",
    }
}

/// `None` when the release found the lease still ours, else the lost reason's name.
fn released(r: Released) -> Option<&'static str> {
    match r {
        Released::Held => None,
        Released::Lost(reason) => Some(reason_name(reason)),
    }
}

#[pymethods]
impl NativeGuard {
    /// The lock's name.
    #[getter]
    fn name(&self) -> &str {
        self.handle.key()
    }

    /// The fencing token, when the engine gives one.
    #[getter]
    fn fence(&self) -> Option<u64> {
        self.handle.fence()
    }

    /// Whether the lease is still this process's (no I/O).
    fn is_held(&self) -> bool {
        self.mine() && self.handle.is_held()
    }

    /// Seconds left of the lease on the local clock (0 once it ended).
    fn remaining(&self) -> f64 {
        if !self.is_held() {
            return 0.0;
        }
        self.handle
            .valid_until()
            .saturating_duration_since(std::time::Instant::now())
            .as_secs_f64()
    }

    /// Releases the lease: `None` if it was still ours, else why it was lost.
    fn release(slf: Py<Self>, py: Python<'_>) -> PyResult<Option<&'static str>> {
        slf.get().check_mine()?;
        block_on(py, async move {
            let guard = slf.get().take().await?;
            let r = guard.release().await.map_err(errors::to_py)?;
            Ok(released(r))
        })?
    }

    /// `release` for asyncio: a future of the event loop `event_loop`.
    fn release_async<'py>(
        slf: Py<Self>,
        py: Python<'py>,
        event_loop: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        slf.get().check_mine()?;
        aio::spawn(py, event_loop, async move {
            let guard = slf.get().take().await?;
            let r = guard.release().await.map_err(errors::to_py)?;
            Ok(released(r))
        })
    }

    /// Renews the lease to `ttl` seconds, counted from when the renewal is sent.
    fn extend(slf: Py<Self>, py: Python<'_>, ttl: f64) -> PyResult<()> {
        let ttl = errors::seconds("ttl", ttl)?;
        slf.get().check_mine()?;
        block_on(py, async move {
            let guard = slf.get().guard.lock().await;
            let Some(guard) = guard.as_ref() else {
                return Err(errors::new(
                    "LockNotOwnedError",
                    "extend of a lock already released",
                ));
            };
            guard.extend(ttl).await.map_err(errors::to_py)
        })?
    }

    /// Calls `callback(reason)` once when the lease ends: with the lost reason's name, or
    /// `None` when it was released. From a thread of the runtime's blocking pool, with the
    /// GIL taken.
    fn on_end(&self, callback: Py<PyAny>) -> PyResult<()> {
        let handle = self.handle.clone();
        runtime()?.spawn(async move {
            let reason = handle.ended().await.lost().map(reason_name);
            // On a thread of the blocking pool: waiting there for the GIL (or for a slow
            // callback) stalls no renewal.
            tokio::task::spawn_blocking(move || {
                Python::try_attach(|py| {
                    if let Err(e) = callback.call1(py, (reason,)) {
                        e.write_unraisable(py, None);
                    }
                })
            });
        });
        Ok(())
    }
}

impl Drop for NativeGuard {
    fn drop(&mut self) {
        let guard = self.guard.get_mut().take();
        if let Some(guard) = guard {
            if self.mine() {
                // Dropped without a release: the core releases it in the background.
                if let Ok(rt) = runtime() {
                    let _in = rt.enter();
                    drop(guard);
                }
            } else {
                // The parent's: it still holds the lock, and its runtime is not here.
                std::mem::forget(guard);
            }
        }
    }
}
