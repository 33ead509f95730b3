//! The engine's word that a lease is lost (its session ended), heard for every lease of a
//! client by one task.
//!
//! A session carries many leases, so its end is waited for once ([`SessionWatch::Shared`]): the
//! task keeps, per session, the leases on it (a weak reference each, 8 bytes), and when the
//! session ends asks the engine which of them were still on it. A lease whose engine watches it
//! alone ([`SessionWatch::Own`]) has its future in one `FuturesUnordered`, polled only when its
//! engine wakes it: a task or a future per lease would cost far more than the lease itself
//! (docs/scaling.md).
//!
//! A lease that ends by itself (released) leaves its entry behind: nothing wakes it. The task
//! counts such ends ([`LossCounter`], told by the lease, which wakes the task every
//! [`SWEEP_AFTER`] of them) and, once they outnumber the entries it holds by half, keeps only
//! the entries of live leases, and the sessions that still have one (a session that is dropped
//! without ending, an etcd lease of one lock, leaves nothing behind): each end costs O(1)
//! amortized, and the entries left behind are never many more than the live ones. Dropping the
//! client's watcher ends its task.
//!
//! A future that panics ends its lease (or its session's leases) as lost (`Unreachable`: nothing
//! says they are still ours) and nothing else; a task that is gone (its runtime shut down) is
//! started again by the next watch, which gives it every shared session's end again.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{Notify, mpsc};

use super::LeaseShared;
use crate::engine::{BoxFuture, LeaseRef, LostReason, SessionEnd, SessionWatch};
use crate::sync::MutexExt;
use crate::sync::shim::AtomicUsize;

/// Fewer ends than this never cause a sweep (a client with few leases sweeps rarely).
const SWEEP_AFTER: usize = 64;

/// What a watch waits for: one lease's own future, or a shared session's end (for the group
/// of its leases made when the session was first watched).
enum Watched {
    Lease {
        lease: Weak<LeaseShared>,
        lost: BoxFuture<'static, LostReason>,
    },
    Session {
        session: u64,
        group: u64,
        end: BoxFuture<'static, LostReason>,
    },
}

/// What a watch heard.
enum Heard {
    Lease(Weak<LeaseShared>, LostReason),
    Session {
        session: u64,
        group: u64,
        why: LostReason,
    },
}

impl std::future::Future for Watched {
    type Output = Heard;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let fut = match &mut *self {
            Watched::Lease { lost, .. } => lost,
            Watched::Session { end, .. } => end,
        };
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(cx)));
        let polled = polled.unwrap_or_else(|_| {
            tracing::error!(target: "distlock",
                "the engine's watch for a session's end panicked: its leases are lost");
            std::task::Poll::Ready(LostReason::Unreachable)
        });
        polled.map(|why| match &*self {
            Watched::Lease { lease, .. } => Heard::Lease(lease.clone(), why),
            Watched::Session { session, group, .. } => Heard::Session {
                session: *session,
                group: *group,
                why,
            },
        })
    }
}

impl Watched {
    /// Whether to keep it in a sweep: a lease's while it lives, a session's while its group
    /// has live leases (the sweep removes the others).
    fn keep(&self, inner: &Watches) -> bool {
        match self {
            Watched::Lease { lease, .. } => live(lease),
            Watched::Session { session, group, .. } => {
                inner.sessions.get(session).is_some_and(|g| g.id == *group)
            }
        }
    }
}

fn live(lease: &Weak<LeaseShared>) -> bool {
    lease.upgrade().is_some_and(|l| l.snapshot().end.is_none())
}

/// The ends of watched leases since the last sweep, and the task's wake-up for a sweep.
#[derive(Default)]
pub(crate) struct LossCounter {
    ended: AtomicUsize,
    wake: Notify,
}

impl LossCounter {
    /// A watched lease ended.
    pub(crate) fn note_end(&self) {
        if (self.ended.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(SWEEP_AFTER) {
            self.wake.notify_one();
        }
    }

    /// The ends told since the last sweep (for the model checks).
    #[cfg(all(test, distlock_loom))]
    pub(crate) fn ends_told(&self) -> usize {
        self.ended.load(Ordering::Relaxed)
    }

    fn take(&self, n: usize) {
        let _ = self
            .ended
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |e| {
                Some(e.saturating_sub(n))
            });
    }
}

/// The leases on one shared session, and its end (to watch it again if the task starts over).
/// `id` tells this group from a later one of the same session (made after a sweep removed this
/// one), whose end is another future.
struct Group {
    id: u64,
    end: SessionEnd,
    leases: Vec<Weak<LeaseShared>>,
}

/// Whether a lease was still on a shared session when it ended: the engine's
/// [`Sessions::still_on`](crate::engine::Sessions::still_on).
pub(crate) type StillOn = Box<dyn Fn(&LeaseRef<'_>, u64) -> bool + Send + Sync>;

/// What the client's side and the task share.
struct Shared {
    inner: Mutex<Watches>,
    counter: Arc<LossCounter>,
    still_on: StillOn,
}

struct Watches {
    /// The task's channel, from the first watch until the client is dropped.
    tx: Option<mpsc::UnboundedSender<Watched>>,
    /// The leases of each shared session whose end is watched.
    sessions: HashMap<u64, Group>,
    /// How many leases the groups hold, ended or not.
    grouped: usize,
    /// The next group's id.
    next_group: u64,
}

/// The client's watcher. Dropping it ends its task.
pub(crate) struct Losses {
    shared: Arc<Shared>,
}

impl Drop for Losses {
    fn drop(&mut self) {
        // The task's only sender: it ends, and with it every future and group.
        self.shared.inner.locked().tx = None;
    }
}

impl Losses {
    /// A watcher that asks `still_on` which leases of a shared session were on it at its end.
    pub(crate) fn new(still_on: StillOn) -> Self {
        Losses {
            shared: Arc::new(Shared {
                inner: Mutex::new(Watches {
                    tx: None,
                    sessions: HashMap::new(),
                    grouped: 0,
                    next_group: 0,
                }),
                counter: Arc::new(LossCounter::default()),
                still_on,
            }),
        }
    }

    /// Ends `lease` as lost when what `watch` waits for comes (unless it ended before).
    pub(crate) fn watch(&self, lease: &Arc<LeaseShared>, watch: SessionWatch) {
        let (session, end) = match watch {
            SessionWatch::Never => return,
            SessionWatch::Own(lost) => {
                lease.set_loss_counter(&self.shared.counter);
                let w = Watched::Lease {
                    lease: Arc::downgrade(lease),
                    lost,
                };
                self.send(&mut self.shared.inner.locked(), w);
                return;
            }
            SessionWatch::Shared { session, end } => (session, end),
        };
        lease.set_loss_counter(&self.shared.counter);
        lease.set_watched_session(session);
        let mut inner = self.shared.inner.locked();
        inner.grouped += 1;
        if let Some(g) = inner.sessions.get_mut(&session) {
            g.leases.push(Arc::downgrade(lease));
            // The task may be gone (its runtime shut down): a new one hears this session too.
            if inner.tx.as_ref().is_none_or(|t| t.is_closed()) {
                self.restart(&mut inner, None);
            }
            return;
        }
        let id = inner.next_group;
        inner.next_group += 1;
        let w = Watched::Session {
            session,
            group: id,
            end: end.wait(),
        };
        inner.sessions.insert(
            session,
            Group {
                id,
                end,
                leases: vec![Arc::downgrade(lease)],
            },
        );
        self.send(&mut inner, w);
    }

    /// Gives the task `w`, starting the task if there is none (or it is gone).
    fn send(&self, inner: &mut Watches, w: Watched) {
        let w = match &inner.tx {
            Some(t) => match t.send(w) {
                Ok(()) => return,
                Err(mpsc::error::SendError(back)) => back,
            },
            None => w,
        };
        self.restart(inner, Some(w));
    }

    /// Starts the task (again: the last one's runtime shut down), and gives it `w` and every
    /// shared session's end. The lost futures of leases watched alone are gone with the last
    /// task: their leases hear their end at their next renewal.
    fn restart(&self, inner: &mut Watches, w: Option<Watched>) {
        let (t, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, self.shared.clone()));
        // `w` may be the end of a group just made: it is not sent twice.
        let fresh = match &w {
            Some(Watched::Session { group, .. }) => Some(*group),
            _ => None,
        };
        if let Some(w) = w {
            let _ = t.send(w);
        }
        for (session, g) in &inner.sessions {
            if fresh == Some(g.id) {
                continue;
            }
            let _ = t.send(Watched::Session {
                session: *session,
                group: g.id,
                end: g.end.wait(),
            });
        }
        inner.tx = Some(t);
    }

    #[cfg(test)]
    pub(crate) fn ended(&self) -> usize {
        self.shared.counter.ended.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    pub(crate) fn grouped(&self) -> usize {
        self.shared.inner.locked().grouped
    }

    #[cfg(test)]
    fn groups(&self) -> usize {
        self.shared.inner.locked().sessions.len()
    }
}

/// The task: until the client is dropped, takes new watches and ends the leases whose futures
/// (or sessions) end; sweeps out the entries of leases that ended by themselves, and the groups
/// left with none.
async fn run(mut rx: mpsc::UnboundedReceiver<Watched>, shared: Arc<Shared>) {
    let counter = shared.counter.clone();
    let mut watched: FuturesUnordered<Watched> = FuturesUnordered::new();
    let mut own = 0usize;
    loop {
        tokio::select! {
            biased;
            Some(heard) = watched.next(), if !watched.is_empty() => match heard {
                Heard::Lease(lease, why) => {
                    own -= 1;
                    if let Some(lease) = lease.upgrade() {
                        lease.lose(why);
                    }
                    // Its end was counted (now, or when it ended before): its future is gone
                    // already, so it does not count towards a sweep.
                    counter.take(1);
                }
                Heard::Session { session, group, why } => {
                    session_ended(&shared, session, group, why);
                }
            },
            () = counter.wake.notified() => {}
            w = rx.recv() => match w {
                Some(w) => {
                    own += usize::from(matches!(w, Watched::Lease { .. }));
                    watched.push(w);
                }
                None => return,
            },
        }
        // All that came meanwhile, before the sweep below counts the entries (an end counted
        // may be of a lease whose watch is still on its way).
        while let Ok(w) = rx.try_recv() {
            own += usize::from(matches!(w, Watched::Lease { .. }));
            watched.push(w);
        }
        let gone = counter.ended.load(Ordering::Relaxed);
        if gone >= SWEEP_AFTER {
            let mut inner = shared.inner.locked();
            if gone * 2 >= own + inner.grouped {
                counter.take(gone);
                sweep(&mut inner);
                watched = std::mem::take(&mut watched)
                    .into_iter()
                    .filter(|w| w.keep(&inner))
                    .collect();
                own = watched
                    .iter()
                    .filter(|w| matches!(w, Watched::Lease { .. }))
                    .count();
            }
        }
    }
}

/// The leases of `session`'s group `group`, which ended for `why`: those still on it are lost.
fn session_ended(shared: &Shared, session: u64, group: u64, why: LostReason) {
    let group = {
        let mut inner = shared.inner.locked();
        if inner.sessions.get(&session).is_none_or(|g| g.id != group) {
            return;
        }
        let g = inner.sessions.remove(&session);
        if let Some(g) = &g {
            inner.grouped -= g.leases.len();
        }
        g
    };
    let Some(group) = group else { return };
    for lease in group.leases.iter().filter_map(Weak::upgrade) {
        if lease.snapshot().end.is_none()
            && (shared.still_on)(&lease.engine_ref(&lease.token()), session)
        {
            lease.lose(why);
        }
    }
    // The ends among them were counted (now, or before), and their entries are gone.
    let ended = group.leases.iter().filter(|l| !live(l)).count();
    shared.counter.take(ended);
}

/// Keeps only the live leases of every session, and the groups that still have some.
fn sweep(inner: &mut Watches) {
    let mut grouped = 0;
    inner.sessions.retain(|_, g| {
        g.leases.retain(live);
        if g.leases.capacity() > 2 * g.leases.len() + 16 {
            g.leases.shrink_to_fit();
        }
        grouped += g.leases.len();
        !g.leases.is_empty()
    });
    inner.grouped = grouped;
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;

    fn lease_named(name: &str) -> LeaseShared {
        LeaseShared::for_test(name)
    }

    fn always_on() -> Losses {
        Losses::new(Box::new(|_, _| true))
    }

    /// Counts the futures dropped.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn never(dropped: &Arc<AtomicUsize>) -> BoxFuture<'static, LostReason> {
        let c = Counted(dropped.clone());
        Box::pin(async move {
            let _c = c;
            std::future::pending().await
        })
    }

    /// Whether `done` comes true within half a second (the watcher's task runs beside the
    /// test's, so what it does shows after a few turns).
    async fn soon(done: impl Fn() -> bool) -> bool {
        for _ in 0..100 {
            if done() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        done()
    }

    #[tokio::test]
    async fn a_lost_future_ends_its_lease() {
        let losses = always_on();
        let lease = Arc::new(lease_named("lost"));
        let (tx, rx) = tokio::sync::oneshot::channel();
        losses.watch(
            &lease,
            SessionWatch::Own(Box::pin(async move {
                let _ = rx.await;
                LostReason::Stolen
            })),
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(lease.snapshot().end.is_none());
        let _ = tx.send(());
        assert!(
            soon(|| lease.snapshot().end.is_some()).await,
            "the lease heard its loss"
        );
    }

    /// Leases released by their holders leave their futures behind until the ends outnumber
    /// the live leases; then only the live ones' are kept.
    #[tokio::test]
    async fn the_futures_of_ended_leases_are_swept_and_the_live_ones_kept() {
        let losses = always_on();
        let dropped = Arc::new(AtomicUsize::new(0));
        let live: Vec<Arc<LeaseShared>> = (0..100)
            .map(|i| Arc::new(lease_named(&format!("live/{i}"))))
            .collect();
        for l in &live {
            losses.watch(l, SessionWatch::Own(never(&dropped)));
        }
        let ended: Vec<Arc<LeaseShared>> = (0..300)
            .map(|i| Arc::new(lease_named(&format!("ended/{i}"))))
            .collect();
        for l in &ended {
            losses.watch(l, SessionWatch::Own(never(&dropped)));
        }
        for l in &ended {
            let _ = l.mark_released();
        }
        assert_eq!(losses.ended(), 300);
        // The ends wake the task (every 64 of them), which sweeps: no new watch is needed.
        soon(|| dropped.load(Ordering::SeqCst) >= 300).await;
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            300,
            "the ended leases' futures dropped"
        );
        assert_eq!(losses.ended(), 0);
        assert!(live.iter().all(|l| l.snapshot().end.is_none()));
    }

    /// A future that panics loses its own lease, and the others are still heard.
    #[tokio::test]
    async fn a_panicking_future_loses_only_its_lease() {
        let losses = always_on();
        let bad = Arc::new(lease_named("bad"));
        losses.watch(
            &bad,
            SessionWatch::Own(Box::pin(async { panic!("an engine's bug") })),
        );
        let good = Arc::new(lease_named("good"));
        let (tx, rx) = tokio::sync::oneshot::channel();
        losses.watch(
            &good,
            SessionWatch::Own(Box::pin(async move {
                let _ = rx.await;
                LostReason::Stolen
            })),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            bad.snapshot().end.is_some(),
            "the panicking future's lease is lost"
        );
        assert!(good.snapshot().end.is_none());
        let _ = tx.send(());
        assert!(
            soon(|| good.snapshot().end.is_some()).await,
            "the other lease still hears its loss"
        );
    }

    /// The leases on one shared session hear its end through one watch; a lease the engine
    /// says had left the session is not lost.
    #[tokio::test]
    async fn a_shared_session_s_end_loses_the_leases_still_on_it() {
        let losses = Losses::new(Box::new(|lease, _| lease.name != "moved"));
        let one = SessionEnd::new();
        let two = SessionEnd::new();
        let on = |session: u64, end: &SessionEnd| SessionWatch::Shared {
            session,
            end: end.clone(),
        };
        let a: Vec<Arc<LeaseShared>> = (0..50)
            .map(|i| Arc::new(lease_named(&format!("a/{i}"))))
            .collect();
        for l in &a {
            losses.watch(l, on(1, &one));
        }
        let moved = Arc::new(lease_named("moved"));
        losses.watch(&moved, on(1, &one));
        let b = Arc::new(lease_named("b"));
        losses.watch(&b, on(2, &two));
        assert_eq!(losses.grouped(), 52);
        tokio::time::sleep(Duration::from_millis(10)).await;
        one.end(LostReason::Unreachable);
        assert!(
            soon(|| a.iter().all(|l| l.snapshot().end.is_some())).await,
            "every lease still on the session is lost"
        );
        assert_eq!(
            a[0].snapshot().end,
            Some(crate::lease::LeaseEnd::Lost(LostReason::Unreachable))
        );
        assert!(
            moved.snapshot().end.is_none(),
            "a lease that left it is not"
        );
        assert!(b.snapshot().end.is_none(), "nor one on another session");
        assert_eq!(losses.grouped(), 1);
        // A lease that comes to a session that has ended hears it at once.
        let late = Arc::new(lease_named("late"));
        losses.watch(&late, on(1, &one));
        assert!(soon(|| late.snapshot().end.is_some()).await);
        two.end(LostReason::Expired);
        assert!(soon(|| b.snapshot().end.is_some()).await);
    }

    /// Leases released on a shared session leave their entries until they outnumber the live
    /// ones; then only the live ones stay, and the live ones still hear the session's end.
    #[tokio::test]
    async fn the_entries_of_ended_leases_on_a_shared_session_are_swept() {
        let losses = always_on();
        let end = SessionEnd::new();
        let on = || SessionWatch::Shared {
            session: 7,
            end: end.clone(),
        };
        let live: Vec<Arc<LeaseShared>> = (0..100)
            .map(|i| Arc::new(lease_named(&format!("live/{i}"))))
            .collect();
        let ended: Vec<Arc<LeaseShared>> = (0..300)
            .map(|i| Arc::new(lease_named(&format!("ended/{i}"))))
            .collect();
        for l in live.iter().chain(&ended) {
            losses.watch(l, on());
        }
        assert_eq!(losses.grouped(), 400);
        for l in &ended {
            let _ = l.mark_released();
        }
        assert!(
            soon(|| losses.grouped() == 100).await,
            "{}",
            losses.grouped()
        );
        assert_eq!(losses.ended(), 0);
        end.end(LostReason::Unreachable);
        assert!(soon(|| live.iter().all(|l| l.snapshot().end.is_some())).await);
    }

    /// A session that is dropped without ending (an etcd lease of one lock, released) leaves
    /// nothing behind once its leases ended: its group and its end's watch go at a sweep.
    #[tokio::test]
    async fn the_groups_of_sessions_whose_leases_all_ended_are_swept() {
        let losses = always_on();
        let ends: Vec<SessionEnd> = (0..200).map(|_| SessionEnd::new()).collect();
        let leases: Vec<Arc<LeaseShared>> = (0..200)
            .map(|i| Arc::new(lease_named(&format!("one/{i}"))))
            .collect();
        for (i, (l, end)) in leases.iter().zip(&ends).enumerate() {
            let session = i as u64;
            losses.watch(
                l,
                SessionWatch::Shared {
                    session,
                    end: end.clone(),
                },
            );
        }
        assert!(soon(|| ends.iter().all(|e| e.receivers() == 1)).await);
        assert_eq!(losses.groups(), 200);
        for l in &leases[..150] {
            let _ = l.mark_released();
        }
        assert!(soon(|| losses.groups() == 50).await, "{}", losses.groups());
        assert!(
            soon(|| ends[..150].iter().all(|e| e.receivers() == 0)).await,
            "the swept sessions' ends are no longer waited for"
        );
        assert!(ends[150..].iter().all(|e| e.receivers() == 1));
        // A session swept, then used again: a new group hears its end.
        let again = Arc::new(lease_named("again"));
        losses.watch(
            &again,
            SessionWatch::Shared {
                session: 0,
                end: ends[0].clone(),
            },
        );
        ends[0].end(LostReason::Expired);
        assert!(soon(|| again.snapshot().end.is_some()).await);
    }

    /// Dropping the watcher (the client) ends its task: nothing waits for a session's end.
    #[tokio::test]
    async fn dropping_the_watcher_ends_its_task() {
        let losses = always_on();
        let end = SessionEnd::new();
        let lease = Arc::new(lease_named("held"));
        losses.watch(
            &lease,
            SessionWatch::Shared {
                session: 1,
                end: end.clone(),
            },
        );
        assert!(soon(|| end.receivers() == 1).await);
        drop(losses);
        assert!(soon(|| end.receivers() == 0).await, "the task ended");
    }

    /// A task whose runtime shut down is started again by the next watch, even of a session
    /// already watched, and hears that session's end for every lease on it.
    #[test]
    fn a_task_gone_with_its_runtime_is_started_again() {
        let losses = always_on();
        let end = SessionEnd::new();
        let first = Arc::new(lease_named("first"));
        let second = Arc::new(lease_named("second"));
        let on = || SessionWatch::Shared {
            session: 1,
            end: end.clone(),
        };
        let rt = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
        };
        let old = rt();
        old.block_on(async {
            losses.watch(&first, on());
            assert!(soon(|| end.receivers() == 1).await);
        });
        drop(old);
        assert_eq!(end.receivers(), 0, "the task went with its runtime");
        rt().block_on(async {
            losses.watch(&second, on());
            assert!(soon(|| end.receivers() == 1).await, "started again");
            end.end(LostReason::Unreachable);
            assert!(soon(|| first.snapshot().end.is_some()).await);
            assert!(second.snapshot().end.is_some());
        });
    }

    /// Work per watch does not grow with the leases held: a shared session keeps one future,
    /// and a lease on it one entry, however many there are.
    #[tokio::test]
    async fn a_shared_session_is_waited_for_once() {
        let losses = always_on();
        let end = SessionEnd::new();
        let leases: Vec<Arc<LeaseShared>> = (0..1000)
            .map(|i| Arc::new(lease_named(&format!("k/{i}"))))
            .collect();
        for l in &leases {
            losses.watch(
                l,
                SessionWatch::Shared {
                    session: 3,
                    end: end.clone(),
                },
            );
        }
        assert_eq!(losses.shared.inner.locked().sessions.len(), 1);
        // The end's channel has one receiver: the task's one watch.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(end.receivers(), 1);
    }
}
