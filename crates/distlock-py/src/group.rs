//! Groups, for Python: the core's `Group` (members, a key's owner, the partition map), a
//! `Membership` (its partitions, their fences and the events of its ownership) and a watch of
//! the members. Every decision (who owns what, when a partition moves) is the core's; this
//! adds the lost signal as the package's guards have it, and what `fork()` asks.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use distlock::{
    Group, GroupWatch, KeyOwner, LostReason, MAX_PARTITIONS, Member, Membership, OwnershipEvent,
    PartitionState,
};
use pyo3::prelude::*;
use tokio::sync::{broadcast, oneshot, watch};
use tokio::task::JoinHandle;

use crate::client::NativeClient;
use crate::errors::{Failure, Fallible};
use crate::guard::reason_name;
use crate::runtime::{block_on, pid, runtime};
use crate::{aio, errors};

/// A member as Python gets it: `(id, value, epoch, partitions)`.
type MemberOut = (String, String, u64, u32);

/// A key's owner: `(partition, member, value, fence)`.
type OwnerOut = (u32, String, String, Option<u64>);

/// A view of the members: `(version, members)`.
type ViewOut = (u64, Vec<MemberOut>);

/// A partition of the map: `(partition, holder, fence, assigned)`.
type PartitionOut = (u32, Option<String>, Option<u64>, Option<String>);

/// An ownership event: `(kind, partition, fence, seconds of grace left, lost reason)`, the
/// kind `"gained"`, `"draining"` (with the seconds left) or `"lost"` (with the reason, `None`
/// when this member let the partition go).
type EventOut = (&'static str, u32, u64, Option<f64>, Option<&'static str>);

fn member_out(m: &Member) -> MemberOut {
    (m.id.clone(), m.value.clone(), m.epoch.get(), m.partitions)
}

fn members_out(members: &[Member]) -> Vec<MemberOut> {
    members.iter().map(member_out).collect()
}

fn owner_out(o: KeyOwner) -> OwnerOut {
    (o.partition, o.member, o.value, o.fence.map(|f| f.get()))
}

fn partition_out(p: PartitionState) -> PartitionOut {
    (p.partition, p.holder, p.fence.map(|f| f.get()), p.assigned)
}

fn event_out(e: &OwnershipEvent) -> Option<EventOut> {
    Some(match e {
        OwnershipEvent::Gained(o) => ("gained", o.partition, o.fence.get(), None, None),
        OwnershipEvent::Kept(o) => ("kept", o.partition, o.fence.get(), None, None),
        OwnershipEvent::Draining { owned, until } => {
            let left = until.saturating_duration_since(Instant::now());
            let (p, f) = (owned.partition, owned.fence.get());
            ("draining", p, f, Some(left.as_secs_f64()), None)
        }
        OwnershipEvent::Lost { owned, reason } => {
            let reason = reason.map(reason_name);
            ("lost", owned.partition, owned.fence.get(), None, reason)
        }
        // A kind this build does not know: skipped.
        _ => return None,
    })
}

/// `fut`'s output if it is ready at its first poll (inside the runtime: lease deadlines are
/// read on its clock).
fn ready_now<F: Future>(fut: F) -> PyResult<Option<F::Output>> {
    let rt = runtime()?;
    let _in = rt.enter();
    let fut = std::pin::pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    Ok(match fut.poll(&mut cx) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    })
}

/// A group of a client, with its settings: the core's `Group` is made again for each call, on
/// this process's client (a new one after `fork()`).
#[pyclass(module = "distlock._native", frozen)]
pub(crate) struct NativeGroup {
    client: Py<NativeClient>,
    name: String,
    partitions: u32,
    ttl: Option<Duration>,
    grace: Duration,
    interval: Duration,
}

impl NativeGroup {
    fn group(&self, py: Python<'_>) -> PyResult<Group> {
        let client = self.client.get().client(py)?;
        let mut g = client
            .group(self.name.clone())
            .partitions(self.partitions)
            .grace(self.grace)
            .interval(self.interval);
        if let Some(ttl) = self.ttl {
            g = g.ttl(ttl);
        }
        Ok(g)
    }
}

#[pymethods]
impl NativeGroup {
    /// The group `name` of `client`: `partitions` (fixed while the group lives), `ttl` of its
    /// leases, `grace` before a moved partition is let go and `interval` between reads of the
    /// members, in seconds.
    #[new]
    #[pyo3(signature = (client, name, partitions=i64::from(distlock::DEFAULT_PARTITIONS), ttl=None, grace=0.0, interval=1.0))]
    fn new(
        client: Py<NativeClient>,
        name: String,
        partitions: i64,
        ttl: Option<f64>,
        grace: f64,
        interval: f64,
    ) -> PyResult<Self> {
        // Checked here too, so that a negative number is a ConfigurationError like the rest.
        let partitions = u32::try_from(partitions)
            .ok()
            .filter(|p| (1..=MAX_PARTITIONS).contains(p))
            .ok_or_else(|| {
                errors::new(
                    "ConfigurationError",
                    format!("a group has 1 to {MAX_PARTITIONS} partitions, not {partitions}"),
                )
            })?;
        Ok(NativeGroup {
            client,
            name,
            partitions,
            ttl: ttl.map(|t| errors::seconds("ttl", t)).transpose()?,
            grace: errors::seconds("grace", grace)?,
            interval: errors::seconds("interval", interval)?,
        })
    }

    /// The partition of `key` (no I/O).
    fn partition_of(&self, py: Python<'_>, key: &str) -> PyResult<u32> {
        Ok(self.group(py)?.partition_of(key))
    }

    /// The live members, sorted by id.
    fn members(&self, py: Python<'_>) -> PyResult<Vec<MemberOut>> {
        let g = self.group(py)?;
        let members = block_on(py, async move { g.members().await })?;
        Ok(members_out(&members.map_err(errors::to_py)?))
    }

    /// `members` for asyncio.
    fn members_async<'py>(
        &self,
        py: Python<'py>,
        event_loop: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let g = self.group(py)?;
        aio::spawn(
            event_loop,
            async move { Ok(members_out(&g.members().await?)) },
        )
    }

    /// Who owns `key`, or `None` when the group has no member.
    fn owner_of(&self, py: Python<'_>, key: String) -> PyResult<Option<OwnerOut>> {
        let g = self.group(py)?;
        let owner = block_on(py, async move { g.owner_of(&key).await })?;
        Ok(owner.map_err(errors::to_py)?.map(owner_out))
    }

    /// `owner_of` for asyncio.
    fn owner_of_async<'py>(
        &self,
        py: Python<'py>,
        event_loop: &Bound<'py, PyAny>,
        key: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let g = self.group(py)?;
        aio::spawn(event_loop, async move {
            Ok(g.owner_of(&key).await?.map(owner_out))
        })
    }

    /// Every partition: its holder and fence, and the member it is assigned to.
    fn partition_map(&self, py: Python<'_>) -> PyResult<Vec<PartitionOut>> {
        let g = self.group(py)?;
        let map = block_on(py, async move { g.partition_map().await })?;
        Ok(map
            .map_err(errors::to_py)?
            .into_iter()
            .map(partition_out)
            .collect())
    }

    /// `partition_map` for asyncio.
    fn partition_map_async<'py>(
        &self,
        py: Python<'py>,
        event_loop: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let g = self.group(py)?;
        aio::spawn(event_loop, async move {
            let map = g.partition_map().await?;
            Ok(map.into_iter().map(partition_out).collect::<Vec<_>>())
        })
    }

    /// Joins as `id`, publishing `value`: the membership.
    #[pyo3(signature = (id, value=String::new()))]
    fn join(&self, py: Python<'_>, id: String, value: String) -> PyResult<NativeMembership> {
        let g = self.group(py)?;
        let joined = block_on(py, async move {
            Fallible::Ok(NativeMembership::new(g.join(id, value).await?))
        })?;
        Ok(joined?)
    }

    /// `join` for asyncio.
    #[pyo3(signature = (event_loop, id, value=String::new()))]
    fn join_async<'py>(
        &self,
        py: Python<'py>,
        event_loop: &Bound<'py, PyAny>,
        id: String,
        value: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let g = self.group(py)?;
        aio::spawn(event_loop, async move {
            Ok(NativeMembership::new(g.join(id, value).await?))
        })
    }

    /// A watch of the members' changes.
    fn watch(&self, py: Python<'_>) -> PyResult<NativeGroupWatch> {
        Ok(NativeGroupWatch {
            pid: pid(),
            watch: tokio::sync::Mutex::new(Some(self.group(py)?.watch())),
        })
    }
}

/// Each change of a group's members. Made in one process, used in it only.
#[pyclass(module = "distlock._native", frozen)]
pub(crate) struct NativeGroupWatch {
    pid: u32,
    /// Taken out only when dropped in a forked child (and forgotten there).
    watch: tokio::sync::Mutex<Option<GroupWatch>>,
}

/// The next view of `slf`'s watch: `(version, members)`.
async fn next_view(slf: Py<NativeGroupWatch>) -> Fallible<ViewOut> {
    let mut watch = slf.get().watch.lock().await;
    let Some(watch) = watch.as_mut() else {
        return Err(Failure::pkg("LockNotOwnedError", "the watch is gone"));
    };
    let view = watch.changed().await?;
    Ok((view.version, members_out(&view.members)))
}

impl Drop for NativeGroupWatch {
    fn drop(&mut self) {
        if self.pid != pid()
            && let Some(parents) = self.watch.get_mut().take()
        {
            // Made before fork(): its client's tasks are the parent's.
            std::mem::forget(parents);
        }
    }
}

impl NativeGroupWatch {
    fn check_mine(&self) -> PyResult<()> {
        if self.pid == pid() {
            Ok(())
        } else {
            Err(errors::new(
                "LockNotOwnedError",
                "this watch was made before fork(): make a new one in this process",
            ))
        }
    }
}

#[pymethods]
impl NativeGroupWatch {
    /// Waits for the next view that differs from the last (the first call gives the members
    /// at once): `(True, (version, members))`, or `(False, None)` when `timeout` seconds
    /// passed first.
    #[pyo3(signature = (timeout=None))]
    fn changed(
        slf: Py<Self>,
        py: Python<'_>,
        timeout: Option<f64>,
    ) -> PyResult<(bool, Option<ViewOut>)> {
        slf.get().check_mine()?;
        let timeout = timeout.map(|t| errors::seconds("timeout", t)).transpose()?;
        let out = block_on(py, async move {
            match timeout {
                Some(t) => tokio::time::timeout(t, next_view(slf)).await.ok(),
                None => Some(next_view(slf).await),
            }
        })?;
        match out {
            None => Ok((false, None)),
            Some(view) => Ok((true, Some(view?))),
        }
    }

    /// `changed` for asyncio, without a timeout: the next view.
    fn changed_async<'py>(
        slf: Py<Self>,
        event_loop: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        slf.get().check_mine()?;
        aio::spawn(event_loop, next_view(slf))
    }
}

/// How a membership ended, as this module saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Live,
    Lost(LostReason),
    Left,
}

/// What a membership and its watcher share.
struct Inner {
    /// The core's membership while it lasts: taken out when it is left, and dropped when it
    /// is lost (its task lets every partition go, then the events end).
    membership: Mutex<Option<Arc<Membership>>>,
    end: watch::Sender<End>,
}

impl Inner {
    fn membership(&self) -> Option<Arc<Membership>> {
        self.membership
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Waits for `m`'s lease to be lost (or for `stop`), then drops it and says so.
async fn watch_lost(inner: Arc<Inner>, m: Arc<Membership>, stop: oneshot::Receiver<()>) {
    let mut stop = stop;
    let reason = {
        let mut lost = std::pin::pin!(m.lost());
        std::future::poll_fn(|cx| {
            if let Poll::Ready(reason) = lost.as_mut().poll(cx) {
                return Poll::Ready(Some(reason));
            }
            // Sent by a leave, or dropped with the membership.
            match std::pin::Pin::new(&mut stop).poll(cx) {
                Poll::Ready(_) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    };
    drop(m);
    if let Some(reason) = reason {
        inner.end.send_replace(End::Lost(reason));
        let lost = inner
            .membership
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(lost);
    }
}

/// A membership taken by this process. Only this process may leave it: in a forked child it
/// reads as not a member and owning nothing, `leave` raises, and dropping it forgets the
/// parent's.
#[pyclass(module = "distlock._native", frozen)]
pub(crate) struct NativeMembership {
    pid: u32,
    id: String,
    value: String,
    epoch: u64,
    /// `None` only once forgotten in a forked child.
    inner: Option<Arc<Inner>>,
    /// The watcher's stop and its task, taken by the leave (which holds the lock throughout).
    leaving: tokio::sync::Mutex<Option<(oneshot::Sender<()>, JoinHandle<()>)>>,
    /// The events, from the join on.
    events: tokio::sync::Mutex<Option<broadcast::Receiver<OwnershipEvent>>>,
}

impl NativeMembership {
    /// Wraps `m` (on the runtime: its watcher is spawned).
    fn new(m: Membership) -> Self {
        let (id, value, epoch) = (m.id().to_owned(), m.value().to_owned(), m.epoch().get());
        let events = m.events();
        let m = Arc::new(m);
        let (end, _) = watch::channel(End::Live);
        let inner = Arc::new(Inner {
            membership: Mutex::new(Some(m.clone())),
            end,
        });
        let (stop, stopped) = oneshot::channel();
        let watcher = tokio::spawn(watch_lost(inner.clone(), m, stopped));
        NativeMembership {
            pid: pid(),
            id,
            value,
            epoch,
            inner: Some(inner),
            leaving: tokio::sync::Mutex::new(Some((stop, watcher))),
            events: tokio::sync::Mutex::new(Some(events)),
        }
    }

    fn mine(&self) -> bool {
        self.pid == pid()
    }

    fn check_mine(&self) -> PyResult<()> {
        if self.mine() {
            Ok(())
        } else {
            Err(errors::new(
                "LockNotOwnedError",
                "this membership was taken by the parent process before fork(): only it can \
                 leave it",
            ))
        }
    }

    fn inner(&self) -> Fallible<&Arc<Inner>> {
        self.inner
            .as_ref()
            .ok_or_else(|| Failure::pkg("LockNotOwnedError", "the membership is gone"))
    }

    /// The core's membership, while this process's and neither left nor lost.
    fn membership(&self) -> Option<Arc<Membership>> {
        if !self.mine() {
            return None;
        }
        self.inner.as_ref()?.membership()
    }

    /// The leave: `None` if the membership was still ours, else why it was lost.
    async fn leave_now(&self) -> Fallible<Option<&'static str>> {
        let inner = self.inner()?;
        let mut leaving = self.leaving.lock().await;
        if let Some((stop, watcher)) = leaving.take() {
            let _ = stop.send(());
            let _ = watcher.await;
        }
        let taken = inner
            .membership
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(m) = taken else {
            return match *inner.end.borrow() {
                End::Lost(reason) => Ok(Some(reason_name(reason))),
                End::Live | End::Left => Err(Failure::pkg(
                    "LockNotOwnedError",
                    "leave of a membership already left",
                )),
            };
        };
        inner.end.send_replace(End::Left);
        let lost = {
            let mut lost = std::pin::pin!(m.lost());
            let mut cx = Context::from_waker(Waker::noop());
            match lost.as_mut().poll(&mut cx) {
                Poll::Ready(reason) => Some(reason_name(reason)),
                Poll::Pending => None,
            }
        };
        // Other threads keep a clone only for the length of a call (`owned`, `fence_for`,
        // `is_member`, with the GIL let go): wait for them, a few seconds at most (past that,
        // dropping it lets everything go at once).
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut m = m;
        let alone = loop {
            match Arc::try_unwrap(m) {
                Ok(alone) => break Some(alone),
                Err(shared) if Instant::now() < deadline => {
                    m = shared;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(_) => break None,
            }
        };
        if let Some(alone) = alone {
            let left = alone.leave().await;
            // A membership lost before the leave says so by `lost`; its leave's `Lost` adds
            // nothing.
            if lost.is_none() {
                left?;
            }
        }
        Ok(lost)
    }
}

impl Drop for NativeMembership {
    fn drop(&mut self) {
        let inner = self.inner.take();
        let leaving = self.leaving.get_mut().take();
        let events = self.events.get_mut().take();
        if self.mine() {
            // Dropped without a leave: the core lets every partition go at once, in the
            // background (the watcher ends when its stop is dropped).
            if let Ok(rt) = runtime() {
                let _in = rt.enter();
                if let Some(inner) = &inner {
                    let m = inner
                        .membership
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .take();
                    drop(m);
                }
                drop((inner, leaving, events));
            }
        } else {
            // The parent's: its tasks and runtime are not here.
            std::mem::forget((inner, leaving, events));
        }
    }
}

/// The next event of `slf`, or `None` once the membership has ended (left, or lost and every
/// partition let go). A reader that fell more than the core's 4,096 events behind skips the
/// ones it missed.
async fn next_event(slf: Py<NativeMembership>) -> Fallible<Option<EventOut>> {
    let mut events = slf.get().events.lock().await;
    let Some(events) = events.as_mut() else {
        return Ok(None);
    };
    loop {
        match events.recv().await {
            Ok(e) => {
                if let Some(out) = event_out(&e) {
                    return Ok(Some(out));
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return Ok(None),
        }
    }
}

#[pymethods]
impl NativeMembership {
    /// The member's id.
    #[getter]
    fn id(&self) -> &str {
        &self.id
    }

    /// The value it published.
    #[getter]
    fn value(&self) -> &str {
        &self.value
    }

    /// Its epoch: the fence of its membership's lease.
    #[getter]
    fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether it is still a member (a local check, no I/O).
    fn is_member(&self) -> bool {
        self.membership().is_some_and(|m| m.is_member())
    }

    /// The partitions owned now, with their fences: `(partition, fence)`s in order.
    fn owned(&self) -> Vec<(u32, u64)> {
        self.membership().map_or_else(Vec::new, |m| {
            m.owned()
                .iter()
                .map(|o| (o.partition, o.fence.get()))
                .collect()
        })
    }

    /// The fence of `key`'s partition while this member owns it, else `None`.
    fn fence_for(&self, key: &str) -> Option<u64> {
        self.membership()?.fence_for(key).map(|f| f.get())
    }

    /// The lost reason's name if the membership was lost (a local check), else `None`.
    fn lost_reason(&self) -> PyResult<Option<&'static str>> {
        let Some(inner) = self.inner.as_ref().filter(|_| self.mine()) else {
            return Ok(None);
        };
        match *inner.end.borrow() {
            End::Lost(reason) => return Ok(Some(reason_name(reason))),
            End::Left => return Ok(None),
            End::Live => {}
        }
        let Some(m) = inner.membership() else {
            return Ok(None);
        };
        Ok(ready_now(m.lost())?.map(reason_name))
    }

    /// Calls `callback(reason)` once if the membership is lost (never when it is left), from
    /// a thread of the runtime's blocking pool, with the GIL taken.
    fn on_lost(&self, callback: Py<PyAny>) -> PyResult<()> {
        self.check_mine()?;
        let mut end = self.inner()?.end.subscribe();
        runtime()?.spawn(async move {
            let Ok(reason) = end.wait_for(|e| *e != End::Live).await.map(|e| *e) else {
                return;
            };
            let End::Lost(reason) = reason else {
                return;
            };
            let reason = reason_name(reason);
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

    /// Leaves the group: the membership's lease first, then each partition after the group's
    /// grace. `None` if the membership was still ours, else why it was lost before.
    fn leave(slf: Py<Self>, py: Python<'_>) -> PyResult<Option<&'static str>> {
        slf.get().check_mine()?;
        Ok(block_on(py, async move { slf.get().leave_now().await })??)
    }

    /// `leave` for asyncio.
    fn leave_async<'py>(
        slf: Py<Self>,
        event_loop: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        slf.get().check_mine()?;
        aio::spawn(event_loop, async move { slf.get().leave_now().await })
    }

    /// Waits for the next ownership event: `(True, event)`, `(True, None)` once the
    /// membership has ended, or `(False, None)` when `timeout` seconds passed first.
    #[pyo3(signature = (timeout=None))]
    fn next_event(
        slf: Py<Self>,
        py: Python<'_>,
        timeout: Option<f64>,
    ) -> PyResult<(bool, Option<EventOut>)> {
        slf.get().check_mine()?;
        let timeout = timeout.map(|t| errors::seconds("timeout", t)).transpose()?;
        let out = block_on(py, async move {
            match timeout {
                Some(t) => tokio::time::timeout(t, next_event(slf)).await.ok(),
                None => Some(next_event(slf).await),
            }
        })?;
        match out {
            None => Ok((false, None)),
            Some(event) => Ok((true, event?)),
        }
    }

    /// `next_event` for asyncio, without a timeout: the event, or `None` once the membership
    /// has ended.
    fn next_event_async<'py>(
        slf: Py<Self>,
        event_loop: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        slf.get().check_mine()?;
        aio::spawn(event_loop, next_event(slf))
    }
}
