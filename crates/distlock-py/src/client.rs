//! The client, for Python: the core's `LockClient`, opened again in a forked child.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use distlock::{LeaseKind, LockClient, LockError, LockStatus, Wait};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::Fallible;
use crate::guard::{Lease, NativeGuard};
use crate::runtime::{block_on, pid};
use crate::{aio, errors};

/// What a client was opened with, to open it again after `fork()`.
#[derive(Clone)]
struct Settings {
    url: String,
    ttl: Option<Duration>,
    owner: Option<String>,
    local_queue: Option<bool>,
}

impl Settings {
    async fn connect(self) -> Result<LockClient, LockError> {
        let mut b = distlock::client(self.url);
        if let Some(ttl) = self.ttl {
            b = b.ttl(ttl);
        }
        if let Some(owner) = self.owner {
            b = b.owner(owner);
        }
        if let Some(on) = self.local_queue {
            b = b.local_queue(on);
        }
        b.connect().await
    }
}

/// The client of one process.
struct Opened {
    pid: u32,
    client: LockClient,
}

/// A lock client: one engine's connections, its watchdog and its local queues.
#[pyclass(module = "distlock._native", frozen)]
pub(crate) struct NativeClient {
    settings: Settings,
    opened: Mutex<Option<Opened>>,
}

impl Drop for NativeClient {
    fn drop(&mut self) {
        let opened = self.opened.get_mut().unwrap_or_else(|e| e.into_inner());
        if opened.as_ref().is_some_and(|o| o.pid != pid())
            && let Some(parents) = opened.take()
        {
            // The parent's client, whose tasks live on threads this process does not have.
            std::mem::forget(parents);
        }
    }
}

/// What kind of lease a call asks for, by its Python name.
fn lease_kind(kind: &str, permits: u32) -> PyResult<LeaseKind> {
    match kind {
        "exclusive" => Ok(LeaseKind::Exclusive),
        "shared" => Ok(LeaseKind::Shared),
        "permit" => Ok(LeaseKind::Permit { permits }),
        other => Err(errors::new(
            "ConfigurationError",
            format!("unknown lease kind {other:?}: exclusive, shared or permit"),
        )),
    }
}

/// What an acquisition asks for.
enum Target {
    /// A lease of one name.
    One { name: String, kind: LeaseKind },
    /// Every name at once, all or none (exclusive).
    Many(Vec<String>),
}

/// One acquisition's request, owned (the core's borrows its client and names).
struct Ask {
    client: LockClient,
    target: Target,
    ttl: Option<Duration>,
    /// `None`: wait as long as it takes.
    wait: Option<Duration>,
}

/// Sends a core request (a single-name or a multi-name one, which have the same options) as
/// `wait` says: `Ok(None)` when a try found a name busy.
macro_rules! send {
    ($req:expr, $ttl:expr, $wait:expr) => {{
        let mut req = $req;
        if let Some(ttl) = $ttl {
            req = req.ttl(ttl);
        }
        match $wait {
            Some(d) if d.is_zero() => req.try_acquire().await,
            Some(d) => req.wait(Wait::Timeout(d)).acquire().await.map(Some),
            None => req.wait(Wait::Forever).acquire().await.map(Some),
        }
    }};
}

impl Ask {
    /// The guard, or `None` when the lock stayed busy (at once, or for the whole wait).
    async fn run(self) -> Fallible<Option<NativeGuard>> {
        let started = Instant::now();
        let got = match self.target {
            Target::One { name, kind } => {
                send!(self.client.lock(&name).kind(kind), self.ttl, self.wait)
                    .map(|g| g.map(Lease::Lock))
            }
            Target::Many(names) => {
                send!(self.client.lock_many(names), self.ttl, self.wait).map(|g| g.map(Lease::Many))
            }
        };
        match got {
            Ok(lease) => Ok(lease.map(NativeGuard::new)),
            Err(e) if errors::only_busy(&e, self.wait, started.elapsed()) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

impl NativeClient {
    /// This process's client: the one opened here, or a new one after `fork()`.
    pub(crate) fn client(&self, py: Python<'_>) -> PyResult<LockClient> {
        let me = pid();
        {
            let mut opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
            match opened.as_ref() {
                Some(o) if o.pid == me => return Ok(o.client.clone()),
                Some(_) => {
                    // The parent's: its connections and watchdog live on threads that are not
                    // in this process. Forgotten, never dropped.
                    if let Some(parents) = opened.take() {
                        std::mem::forget(parents);
                    }
                }
                None => {}
            }
        }
        let client = block_on(py, self.settings.clone().connect())?.map_err(errors::to_py)?;
        let mut opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        match opened.as_ref() {
            // Another thread of this process opened it first: keep one.
            Some(o) if o.pid == me => Ok(o.client.clone()),
            _ => {
                *opened = Some(Opened {
                    pid: me,
                    client: client.clone(),
                });
                Ok(client)
            }
        }
    }

    fn ask(
        &self,
        py: Python<'_>,
        target: Target,
        ttl: Option<f64>,
        wait: Option<f64>,
    ) -> PyResult<Ask> {
        Ok(Ask {
            client: self.client(py)?,
            target,
            ttl: ttl.map(|t| errors::seconds("ttl", t)).transpose()?,
            wait: wait.map(|w| errors::seconds("timeout", w)).transpose()?,
        })
    }
}

#[pymethods]
impl NativeClient {
    /// Opens the engine of `url` (blocking). `ttl`: the default lease in seconds.
    #[staticmethod]
    #[pyo3(signature = (url, *, ttl=None, owner=None, local_queue=None))]
    fn connect(
        py: Python<'_>,
        url: String,
        ttl: Option<f64>,
        owner: Option<String>,
        local_queue: Option<bool>,
    ) -> PyResult<NativeClient> {
        let settings = Settings {
            url,
            ttl: ttl.map(|t| errors::seconds("ttl", t)).transpose()?,
            owner,
            local_queue,
        };
        let client = NativeClient {
            settings,
            opened: Mutex::new(None),
        };
        client.client(py)?;
        Ok(client)
    }

    /// The URL, its password hidden.
    #[getter]
    fn url(&self) -> String {
        distlock::url::redact(&self.settings.url)
    }

    /// The label this client writes as its locks' holder.
    #[getter]
    fn owner(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.client(py)?.owner().to_owned())
    }

    /// Takes the lease `kind` of `name`: the guard, or `None` if it stayed busy. `wait`: `None`
    /// waits as long as it takes, 0 tries once, otherwise at most that many seconds.
    #[pyo3(signature = (name, kind="exclusive", permits=0, ttl=None, wait=None))]
    fn acquire(
        &self,
        py: Python<'_>,
        name: String,
        kind: &str,
        permits: u32,
        ttl: Option<f64>,
        wait: Option<f64>,
    ) -> PyResult<Option<NativeGuard>> {
        let name = Target::One {
            name,
            kind: lease_kind(kind, permits)?,
        };
        let ask = self.ask(py, name, ttl, wait)?;
        Ok(block_on(py, ask.run())??)
    }

    /// `acquire` for asyncio: a future of the event loop `event_loop`.
    #[pyo3(signature = (event_loop, name, kind="exclusive", permits=0, ttl=None, wait=None))]
    #[allow(clippy::too_many_arguments)]
    fn acquire_async<'py>(
        &self,
        py: Python<'py>,
        event_loop: &Bound<'py, PyAny>,
        name: String,
        kind: &str,
        permits: u32,
        ttl: Option<f64>,
        wait: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let name = Target::One {
            name,
            kind: lease_kind(kind, permits)?,
        };
        let ask = self.ask(py, name, ttl, wait)?;
        aio::spawn(event_loop, ask.run())
    }

    /// Takes every name of `names` at once, all or none (exclusive): the guard, or `None` if
    /// a name stayed busy. `wait` as `acquire`'s. `UnsupportedError` on an engine without
    /// multi-name locks.
    #[pyo3(signature = (names, ttl=None, wait=None))]
    fn acquire_many(
        &self,
        py: Python<'_>,
        names: Vec<String>,
        ttl: Option<f64>,
        wait: Option<f64>,
    ) -> PyResult<Option<NativeGuard>> {
        let ask = self.ask(py, Target::Many(names), ttl, wait)?;
        Ok(block_on(py, ask.run())??)
    }

    /// `acquire_many` for asyncio: a future of the event loop `event_loop`.
    #[pyo3(signature = (event_loop, names, ttl=None, wait=None))]
    fn acquire_many_async<'py>(
        &self,
        py: Python<'py>,
        event_loop: &Bound<'py, PyAny>,
        names: Vec<String>,
        ttl: Option<f64>,
        wait: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ask = self.ask(py, Target::Many(names), ttl, wait)?;
        aio::spawn(event_loop, ask.run())
    }

    /// Every lock held or waited for whose name starts with `prefix`, at most `limit`.
    #[pyo3(signature = (prefix="", limit=1000))]
    fn list(&self, py: Python<'_>, prefix: &str, limit: usize) -> PyResult<ListOut> {
        let client = self.client(py)?;
        let prefix = prefix.to_owned();
        let listing = block_on(py, async move { client.list(&prefix, limit).await })?
            .map_err(errors::to_py)?;
        let locks = listing
            .locks
            .iter()
            .map(|l| {
                let status = match &l.status {
                    Ok(s) => status_dict(py, s)?.into_any().unbind(),
                    Err(e) => distlock::tools::error_chain(e)
                        .into_pyobject(py)?
                        .into_any()
                        .unbind(),
                };
                Ok((l.name.clone(), status))
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok((locks, listing.more))
    }

    /// Who holds `name`: a dict of `held`, `owner`, `fence`, `last_fence`, `ttl`,
    /// `holders` and `waiters`.
    fn status<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyDict>> {
        let client = self.client(py)?;
        let status = block_on(py, async move { client.status(&name).await })?;
        status_dict(py, &status.map_err(errors::to_py)?)
    }
}

/// The locks whose names start with a prefix: `(name, status dict or error message)`s, and
/// whether there may be more.
type ListOut = (Vec<(String, Py<PyAny>)>, bool);

/// A lock's status as a dict.
fn status_dict<'py>(py: Python<'py>, s: &LockStatus) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("held", s.held)?;
    d.set_item("owner", s.owner.as_deref())?;
    d.set_item("fence", s.fence)?;
    d.set_item("last_fence", s.last_fence)?;
    d.set_item("ttl", s.ttl.map(|t| t.as_secs_f64()))?;
    let holders = s
        .holders
        .iter()
        .map(|h| {
            let e = PyDict::new(py);
            e.set_item("owner", h.owner.as_deref())?;
            e.set_item("fence", h.fence)?;
            e.set_item("ttl", h.ttl.map(|t| t.as_secs_f64()))?;
            Ok(e)
        })
        .collect::<PyResult<Vec<_>>>()?;
    d.set_item("holders", holders)?;
    d.set_item("waiters", s.waiters)?;
    Ok(d)
}
