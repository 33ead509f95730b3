//! The engine's word that a lease is lost (its session ended), heard for every lease of a
//! client by one task.
//!
//! A task per lease cost 257 bytes of task alone (a client holding 100,000 locks on etcd,
//! ZooKeeper or a database: 25 MB). Here each lease's future sits in one `FuturesUnordered`,
//! polled only when its engine wakes it: about 100 bytes a lease.
//!
//! A lease that ends by itself (released) leaves its future behind: nothing wakes it. The task
//! counts such ends ([`LossCounter`], told by the lease, which wakes the task every
//! [`SWEEP_AFTER`] of them) and, once they outnumber the futures it holds by half, keeps only
//! the futures of live leases: each end costs O(1) amortized, and the futures left behind are
//! never many more than the live ones.
//!
//! A future that panics ends its lease as lost (`Unreachable`: nothing says it is still ours)
//! and nothing else; a task that is gone (its runtime shut down) is started again by the next
//! watch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{Notify, mpsc};

use super::LeaseShared;
use crate::engine::{BoxFuture, LostReason};
use crate::sync::MutexExt;

/// Fewer ends than this never cause a sweep (a client with few leases sweeps rarely).
const SWEEP_AFTER: usize = 64;

/// One lease's watch: the engine's future, and the lease it ends.
struct Watched {
    lease: Weak<LeaseShared>,
    lost: BoxFuture<'static, LostReason>,
}

impl std::future::Future for Watched {
    type Output = (Weak<LeaseShared>, LostReason);

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let lost = &mut self.lost;
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lost.as_mut().poll(cx)));
        let polled = polled.unwrap_or_else(|_| {
            tracing::error!(target: "distlock",
                "the engine's watch for a lease's session end panicked: the lease is lost");
            std::task::Poll::Ready(LostReason::Unreachable)
        });
        polled.map(|why| (self.lease.clone(), why))
    }
}

impl Watched {
    fn live(&self) -> bool {
        self.lease
            .upgrade()
            .is_some_and(|l| l.snapshot().end.is_none())
    }
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

    fn take(&self, n: usize) {
        let _ = self
            .ended
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |e| {
                Some(e.saturating_sub(n))
            });
    }
}

/// The client's watcher: a channel to its task, started with the first watch.
pub(crate) struct Losses {
    tx: Mutex<Option<mpsc::UnboundedSender<Watched>>>,
    counter: Arc<LossCounter>,
}

impl Losses {
    pub(crate) fn new() -> Self {
        Losses {
            tx: Mutex::new(None),
            counter: Arc::new(LossCounter::default()),
        }
    }

    /// Ends `lease` as lost when `lost` resolves (unless it ended before).
    pub(crate) fn watch(&self, lease: &Arc<LeaseShared>, lost: BoxFuture<'static, LostReason>) {
        lease.set_loss_counter(&self.counter);
        let mut w = Watched {
            lease: Arc::downgrade(lease),
            lost,
        };
        let mut tx = self.tx.locked();
        if let Some(t) = tx.as_ref() {
            match t.send(w) {
                Ok(()) => return,
                // The task is gone (its runtime shut down): another one takes it.
                Err(mpsc::error::SendError(back)) => w = back,
            }
        }
        let (t, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, self.counter.clone()));
        let _ = t.send(w);
        *tx = Some(t);
    }

    #[cfg(test)]
    pub(crate) fn ended(&self) -> usize {
        self.counter.ended.load(Ordering::Relaxed)
    }
}

/// The task: until the client is dropped, takes new watches and ends the leases whose futures
/// resolve; sweeps out the futures of leases that ended by themselves.
async fn run(mut rx: mpsc::UnboundedReceiver<Watched>, counter: Arc<LossCounter>) {
    let mut watched: FuturesUnordered<Watched> = FuturesUnordered::new();
    loop {
        tokio::select! {
            biased;
            Some((lease, why)) = watched.next(), if !watched.is_empty() => {
                if let Some(lease) = lease.upgrade() {
                    lease.lose(why);
                }
                // Its end was counted (now, or when it ended before): its future is gone
                // already, so it does not count towards a sweep.
                counter.take(1);
            }
            () = counter.wake.notified() => {}
            w = rx.recv() => match w {
                Some(w) => watched.push(w),
                None => return,
            },
        }
        // All that came meanwhile, before the sweep below counts the futures (an end counted
        // may be of a lease whose watch is still on its way).
        while let Ok(w) = rx.try_recv() {
            watched.push(w);
        }
        let gone = counter.ended.load(Ordering::Relaxed);
        if gone >= SWEEP_AFTER && gone * 2 >= watched.len() {
            counter.take(gone);
            watched = sweep(std::mem::take(&mut watched));
        }
    }
}

/// The futures of the leases still live.
fn sweep(all: FuturesUnordered<Watched>) -> FuturesUnordered<Watched> {
    all.into_iter().filter(Watched::live).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;

    fn lease_named(name: &str) -> LeaseShared {
        LeaseShared::for_test(name)
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
        let losses = Losses::new();
        let lease = Arc::new(lease_named("lost"));
        let (tx, rx) = tokio::sync::oneshot::channel();
        losses.watch(
            &lease,
            Box::pin(async move {
                let _ = rx.await;
                LostReason::Stolen
            }),
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
        let losses = Losses::new();
        let dropped = Arc::new(AtomicUsize::new(0));
        let live: Vec<Arc<LeaseShared>> = (0..100)
            .map(|i| Arc::new(lease_named(&format!("live/{i}"))))
            .collect();
        for l in &live {
            losses.watch(l, never(&dropped));
        }
        let ended: Vec<Arc<LeaseShared>> = (0..300)
            .map(|i| Arc::new(lease_named(&format!("ended/{i}"))))
            .collect();
        for l in &ended {
            losses.watch(l, never(&dropped));
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
        let losses = Losses::new();
        let bad = Arc::new(lease_named("bad"));
        losses.watch(&bad, Box::pin(async { panic!("an engine's bug") }));
        let good = Arc::new(lease_named("good"));
        let (tx, rx) = tokio::sync::oneshot::channel();
        losses.watch(
            &good,
            Box::pin(async move {
                let _ = rx.await;
                LostReason::Stolen
            }),
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
}
