//! A held lease, for Python: the core's `LockGuard` (or an election's `Leadership`, a guard
//! with an epoch and a value, or a `MultiGuard`, several names held as one lease) and the
//! process that took it.
//!
//! Only the process that took a lease may release it: in a forked child the guard reads as not
//! held, `release` raises, and dropping it forgets the parent's guard (the parent still holds
//! the lock, and the child has none of its runtime).

use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use distlock::{Leadership, LeaseEnd, LeaseHandle, LockError, LockGuard, MultiGuard, Released};
use pyo3::prelude::*;

use crate::errors::{Failure, Fallible};
use crate::runtime::{block_on, pid, runtime};
use crate::{aio, errors};

/// What a guard holds.
pub(crate) enum Lease {
    Lock(LockGuard),
    Lead(Leadership),
    Many(MultiGuard),
}

impl Lease {
    fn handle(&self) -> LeaseHandle {
        match self {
            Lease::Lock(g) => g.handle(),
            Lease::Lead(l) => l.guard().handle(),
            Lease::Many(m) => m.handle(),
        }
    }

    async fn release(self) -> Result<Released, LockError> {
        match self {
            Lease::Lock(g) => g.release().await,
            Lease::Lead(l) => l.resign().await,
            Lease::Many(m) => m.release().await,
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        match self {
            Lease::Lock(g) => g.extend(ttl).await,
            Lease::Lead(l) => l.guard().extend(ttl).await,
            Lease::Many(m) => m.extend(ttl).await,
        }
    }
}

/// The names of a multi-name lease and a fence for each, as its guard gave them.
struct Names {
    names: Vec<String>,
    fences: Vec<Option<u64>>,
}

/// A lease taken by this process; `None` once released.
#[pyclass(module = "distlock._native", frozen)]
pub(crate) struct NativeGuard {
    pid: u32,
    handle: LeaseHandle,
    /// A leadership's epoch (the fence of its lease).
    epoch: Option<u64>,
    /// A multi-name lease's names and fences (kept here: they outlive its release).
    many: Option<Names>,
    /// An async mutex: an `extend` holds it across its round trip, and a release waits for it.
    lease: tokio::sync::Mutex<Option<Lease>>,
}

impl NativeGuard {
    pub(crate) fn new(lease: Lease) -> Self {
        let epoch = match &lease {
            Lease::Lead(l) => Some(l.epoch().get()),
            Lease::Lock(_) | Lease::Many(_) => None,
        };
        let many = match &lease {
            Lease::Many(m) => Some(Names {
                names: m.names().to_vec(),
                fences: m.fences().to_vec(),
            }),
            Lease::Lock(_) | Lease::Lead(_) => None,
        };
        NativeGuard {
            pid: pid(),
            handle: lease.handle(),
            epoch,
            many,
            lease: tokio::sync::Mutex::new(Some(lease)),
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

    /// The lease, taken out for its release (after any `extend` in flight).
    async fn take(&self) -> Fallible<Lease> {
        self.lease
            .lock()
            .await
            .take()
            .ok_or_else(|| Failure::pkg("LockNotOwnedError", "release of a lock already released"))
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
    /// The lock's name; a multi-name lease's names, comma-separated.
    #[getter]
    fn name(&self) -> String {
        match &self.many {
            Some(m) => m.names.join(", "),
            None => self.handle.key().to_owned(),
        }
    }

    /// The names held: the one name, or a multi-name lease's, distinct and sorted.
    #[getter]
    fn names(&self) -> Vec<String> {
        match &self.many {
            Some(m) => m.names.clone(),
            None => vec![self.handle.key().to_owned()],
        }
    }

    /// The fencing token, when the engine gives one (a leadership's epoch). `None` for a
    /// multi-name lease, whose fences are per name (`fences`).
    #[getter]
    fn fence(&self) -> Option<u64> {
        match &self.many {
            Some(_) => None,
            None => self.epoch.or_else(|| self.handle.fence()),
        }
    }

    /// Each name's fence, in the order of `names` (`None` where the engine gives none).
    #[getter]
    fn fences(&self) -> Vec<Option<u64>> {
        match &self.many {
            Some(m) => m.fences.clone(),
            None => vec![self.fence()],
        }
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
        Ok(block_on(py, async move {
            let lease = slf.get().take().await?;
            Fallible::Ok(released(lease.release().await?))
        })??)
    }

    /// `release` for asyncio: a future of the event loop `event_loop`. With `lost_error`
    /// (the lock's name), a lease lost before the release fails the future with
    /// `LockLostError` instead of giving the reason.
    #[pyo3(signature = (event_loop, lost_error=None))]
    fn release_async<'py>(
        slf: Py<Self>,
        event_loop: &Bound<'py, PyAny>,
        lost_error: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        slf.get().check_mine()?;
        aio::spawn(event_loop, async move {
            let lease = slf.get().take().await?;
            match (released(lease.release().await?), lost_error) {
                (Some(reason), Some(name)) => Err(Failure::Lost(name, reason)),
                (reason, _) => Ok(reason),
            }
        })
    }

    /// Renews the lease to `ttl` seconds, counted from when the renewal is sent.
    fn extend(slf: Py<Self>, py: Python<'_>, ttl: f64) -> PyResult<()> {
        let ttl = errors::seconds("ttl", ttl)?;
        slf.get().check_mine()?;
        Ok(block_on(py, async move {
            let lease = slf.get().lease.lock().await;
            let Some(lease) = lease.as_ref() else {
                return Err(Failure::pkg(
                    "LockNotOwnedError",
                    "extend of a lock already released",
                ));
            };
            Ok(lease.extend(ttl).await?)
        })??)
    }

    /// A leadership's published value, now `value` (the lease kept). `Unsupported` for a lock,
    /// and on an engine that cannot write a new label.
    fn proclaim(slf: Py<Self>, py: Python<'_>, value: String) -> PyResult<()> {
        slf.get().check_mine()?;
        Ok(block_on(py, async move {
            let mut lease = slf.get().lease.lock().await;
            match lease.as_mut() {
                Some(Lease::Lead(l)) => Ok(l.proclaim(value).await?),
                Some(Lease::Lock(_) | Lease::Many(_)) => Err(Failure::pkg(
                    "UnsupportedError",
                    "proclaim is for a leadership, not a lock",
                )),
                None => Err(Failure::pkg(
                    "LockNotOwnedError",
                    "the leadership was resigned",
                )),
            }
        })??)
    }

    /// The lost reason's name if the lease was lost (a local check, no I/O), else `None`.
    fn lost_reason(&self) -> PyResult<Option<&'static str>> {
        if !self.mine() {
            // The parent's lease, which only the parent's threads move: not lost here.
            return Ok(None);
        }
        // The lost future reads the lease's deadline on the runtime's clock: polled once,
        // inside the runtime.
        let rt = runtime()?;
        let _in = rt.enter();
        let lost = std::pin::pin!(self.handle.lost());
        let mut cx = Context::from_waker(Waker::noop());
        Ok(match lost.poll(&mut cx) {
            Poll::Ready(reason) => Some(reason_name(reason)),
            Poll::Pending => None,
        })
    }

    /// Waits until the lease is lost, at most `timeout` seconds (`None`: as long as it
    /// takes): the reason's name, or `None` when the lease was released or the time ran out.
    #[pyo3(signature = (timeout=None))]
    fn wait_lost(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<&'static str>> {
        self.check_mine()?;
        let timeout = timeout.map(|t| errors::seconds("timeout", t)).transpose()?;
        let handle = self.handle.clone();
        block_on(py, async move {
            let end = handle.ended();
            let end = match timeout {
                Some(t) => tokio::time::timeout(t, end).await.ok(),
                None => Some(end.await),
            };
            end.and_then(LeaseEnd::lost).map(reason_name)
        })
    }

    /// `wait_lost` for asyncio, without a timeout: the reason's name once the lease is lost,
    /// `None` once it is released.
    fn wait_lost_async<'py>(&self, event_loop: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.check_mine()?;
        let handle = self.handle.clone();
        aio::spawn(event_loop, async move {
            Ok(handle.ended().await.lost().map(reason_name))
        })
    }

    /// Calls `callback(reason)` once if the lease is lost (never when it is released), from a
    /// thread of the runtime's blocking pool, with the GIL taken. (A task per call: the
    /// package asks only for locks whose lost signal someone listens to.)
    fn on_lost(&self, callback: Py<PyAny>) -> PyResult<()> {
        self.check_mine()?;
        let handle = self.handle.clone();
        runtime()?.spawn(async move {
            let Some(reason) = handle.ended().await.lost().map(reason_name) else {
                return;
            };
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
        let lease = self.lease.get_mut().take();
        if let Some(guard) = lease {
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
