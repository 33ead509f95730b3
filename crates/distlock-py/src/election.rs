//! Leader election, for Python: the core's `Election` (a campaign is a lease with an epoch and
//! a published value), its leader, and an observer of its changes.

use std::future::Future;
use std::time::{Duration, Instant};

use distlock::{Election, Leader, LockClient, Observer, Wait};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::client::NativeClient;
use crate::errors::{Failure, Fallible};
use crate::guard::{Lease, NativeGuard};
use crate::runtime::{block_on, pid};
use crate::{aio, errors};

/// An election: its name, the value a leader publishes, and its lease.
#[pyclass(module = "distlock._native", frozen)]
pub(crate) struct NativeElection {
    client: Py<NativeClient>,
    name: String,
    value: String,
    ttl: Option<Duration>,
}

impl NativeElection {
    /// The core's election, on this process's client.
    fn election(&self, py: Python<'_>) -> PyResult<Election> {
        let client: LockClient = self.client.get().client(py)?;
        let mut e = client.election(self.name.clone()).value(self.value.clone());
        if let Some(ttl) = self.ttl {
            e = e.ttl(ttl);
        }
        Ok(e)
    }

    /// A campaign's future: the leadership, or `None` when somebody else led for the whole
    /// wait (`None`: as long as it takes; 0: one attempt).
    fn campaign_future(
        &self,
        py: Python<'_>,
        wait: Option<f64>,
    ) -> PyResult<impl Future<Output = Fallible<Option<NativeGuard>>> + Send + 'static> {
        let wait = wait.map(|w| errors::seconds("timeout", w)).transpose()?;
        let election = self.election(py)?;
        Ok(async move {
            let started = Instant::now();
            let got = match wait {
                Some(d) if d.is_zero() => election.try_campaign().await,
                Some(d) => election.wait(Wait::Timeout(d)).campaign().await.map(Some),
                None => election.wait(Wait::Forever).campaign().await.map(Some),
            };
            match got {
                Ok(l) => Ok(l.map(|l| NativeGuard::new(Lease::Lead(l)))),
                Err(e) if errors::only_busy(&e, wait, started.elapsed()) => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
    }
}

#[pymethods]
impl NativeElection {
    /// An election on `name` of `client`: `value` is what a leader publishes (its address,
    /// say); `ttl` its lease in seconds.
    #[new]
    #[pyo3(signature = (client, name, value="", ttl=None))]
    fn new(
        client: Py<NativeClient>,
        name: String,
        value: &str,
        ttl: Option<f64>,
    ) -> PyResult<Self> {
        Ok(NativeElection {
            client,
            name,
            value: value.to_owned(),
            ttl: ttl.map(|t| errors::seconds("ttl", t)).transpose()?,
        })
    }

    /// Campaigns: the leadership (a guard whose fence is the epoch), or `None`.
    #[pyo3(signature = (wait=None))]
    fn campaign(&self, py: Python<'_>, wait: Option<f64>) -> PyResult<Option<NativeGuard>> {
        let fut = self.campaign_future(py, wait)?;
        Ok(block_on(py, fut)??)
    }

    /// `campaign` for asyncio.
    #[pyo3(signature = (event_loop, wait=None))]
    fn campaign_async<'py>(
        &self,
        py: Python<'py>,
        event_loop: &Bound<'py, PyAny>,
        wait: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.campaign_future(py, wait)?;
        aio::spawn(event_loop, fut)
    }

    /// Who leads now: a dict (`who`, `since_ms`, `epoch`, `value`, `ttl`), or `None`.
    fn leader<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let election = self.election(py)?;
        let leader = block_on(py, async move { election.leader().await })?;
        leader_dict(py, leader.map_err(errors::to_py)?.as_ref())
    }

    /// `leader` for asyncio.
    fn leader_async<'py>(
        &self,
        py: Python<'py>,
        event_loop: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let election = self.election(py)?;
        aio::spawn(event_loop, async move {
            Ok(election.leader().await.map(LeaderOut)?)
        })
    }

    /// A follower's view of the election's changes.
    fn observe(&self, py: Python<'_>) -> PyResult<NativeObserver> {
        Ok(NativeObserver {
            pid: pid(),
            observer: tokio::sync::Mutex::new(Some(self.election(py)?.observe())),
        })
    }
}

/// A leader as a dict, `None` for nobody.
fn leader_dict<'py>(
    py: Python<'py>,
    leader: Option<&Leader>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(l) = leader else {
        return Ok(None);
    };
    let d = PyDict::new(py);
    d.set_item("who", &l.who)?;
    d.set_item("since_ms", l.since_ms)?;
    d.set_item("epoch", l.epoch.map(|e| e.get()))?;
    d.set_item("value", l.value.as_deref())?;
    d.set_item("ttl", l.ttl.map(|t| t.as_secs_f64()))?;
    Ok(Some(d))
}

/// A leader (or nobody) handed to Python as [`leader_dict`] makes it.
struct LeaderOut(Option<Leader>);

impl<'py> IntoPyObject<'py> for LeaderOut {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match leader_dict(py, self.0.as_ref())? {
            Some(d) => d.into_any(),
            None => py.None().into_bound(py),
        })
    }
}

/// Each change of an election's leader. Made in one process, used in it only.
#[pyclass(module = "distlock._native", frozen)]
pub(crate) struct NativeObserver {
    pid: u32,
    /// Taken out only when dropped in a forked child (and forgotten there).
    observer: tokio::sync::Mutex<Option<Observer>>,
}

/// The leader after `observer`'s next change, or its error.
async fn next(slf: Py<NativeObserver>) -> Fallible<Option<Leader>> {
    let mut observer = slf.get().observer.lock().await;
    let Some(observer) = observer.as_mut() else {
        return Err(Failure::pkg("LockNotOwnedError", "the observer is gone"));
    };
    observer.changed().await?;
    Ok(observer.borrow().cloned())
}

impl Drop for NativeObserver {
    fn drop(&mut self) {
        if self.pid != pid()
            && let Some(parents) = self.observer.get_mut().take()
        {
            // Made before fork(): its client's tasks are the parent's.
            std::mem::forget(parents);
        }
    }
}

impl NativeObserver {
    fn check_mine(&self) -> PyResult<()> {
        if self.pid == pid() {
            Ok(())
        } else {
            Err(errors::new(
                "LockNotOwnedError",
                "this observer was made before fork(): make a new one in this process",
            ))
        }
    }
}

#[pymethods]
impl NativeObserver {
    /// Waits for the next change (the first call returns the leader at once): `(True,
    /// leader)`, or `(False, None)` when `timeout` seconds passed first.
    #[pyo3(signature = (timeout=None))]
    fn changed<'py>(
        slf: Py<Self>,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<(bool, Option<Bound<'py, PyDict>>)> {
        slf.get().check_mine()?;
        let timeout = timeout.map(|t| errors::seconds("timeout", t)).transpose()?;
        let out = block_on(py, async move {
            match timeout {
                Some(t) => tokio::time::timeout(t, next(slf)).await.ok(),
                None => Some(next(slf).await),
            }
        })?;
        match out {
            None => Ok((false, None)),
            Some(leader) => Ok((true, leader_dict(py, leader?.as_ref())?)),
        }
    }

    /// `changed` for asyncio, without a timeout (wrap it in `asyncio.wait_for`): the leader
    /// after the next change.
    fn changed_async<'py>(
        slf: Py<Self>,
        event_loop: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        slf.get().check_mine()?;
        aio::spawn(event_loop, async move { next(slf).await.map(LeaderOut) })
    }
}
